"""A teacher's scores of the mined groups, for distillation (`mining.teacher`): a cross-encoder or a bi-encoder scores
each (query, positive) and (query, negative) of the mined table, every draw's negatives included, and training adds
KL(teacher || student) over each query's group to its contrastive loss (training/loss.py `distill_loss`, which says
how it differs from sentence-transformers' DistillKLDivLoss: the temperature is the teacher's alone, no T²). A
checkpoint this pipeline trained is a bi-encoder teacher scored as it retrieves (its head, pooling and prefixes): a
stronger run's model (e.g. the `full` recipe's) can teach another run offline.

The scores, divided by the teacher's temperature, go into the table beside the ids they score: `teacher_positive`
(one per pair) and `teacher_negatives` (one per negative; the later draws' in `redrawn_teacher`, negatives/mining.py
REDRAWN).
"""

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ance_core.data.corpus import CorpusRows
from ance_core.errors import AnceError
from ance_core.modeling.devices import pick_device
from ance_core.modeling.model import META_FILE, load_checkpoint, resolve_model_name
from ance_core.negatives.config import TeacherConfig
from ance_core.retrieval.encode import encode_texts

TEACHER_COLUMNS = ("teacher_positive", "teacher_negatives")


class Teacher:
    """A loaded teacher: `score(queries, passages)` -> one float32 score per (query, passage) pair."""

    def __init__(self, cfg: TeacherConfig, device: torch.device | None = None):
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        self.cfg, self.device = cfg, device or pick_device()
        source = resolve_model_name(cfg.model)
        self.checkpoint = None
        if (Path(source) / META_FILE).is_file():  # a checkpoint this pipeline trained: it scores as it retrieves
            if cfg.kind == "cross-encoder":
                raise AnceError(f"mining.teacher.model '{cfg.model}': a bi-encoder checkpoint of this pipeline, "
                                "not a cross-encoder; set teacher.kind to auto or bi-encoder")
            model, self.tokenizer, meta = load_checkpoint(source, self.device)
            if model.projector is not None:
                raise AnceError(f"mining.teacher.model '{cfg.model}': a compressed checkpoint; use its teacher")
            self.kind, self.model, self.checkpoint = "bi-encoder", model.eval(), meta
            return
        try:
            config = AutoConfig.from_pretrained(source)
            self.tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as e:
            raise AnceError(f"mining.teacher.model: cannot load '{cfg.model}': {' '.join(str(e).split())}") from None
        architectures = getattr(config, "architectures", None) or []
        cross = any(a.endswith("ForSequenceClassification") for a in architectures)
        self.kind = cfg.kind if cfg.kind != "auto" else "cross-encoder" if cross else "bi-encoder"
        if self.kind == "cross-encoder":
            if config.num_labels not in (1, 2):
                raise AnceError(f"mining.teacher.model '{cfg.model}': a cross-encoder with {config.num_labels} "
                                "outputs; a teacher gives one relevance score (1 output, or 2: relevant minus not)")
            self.model = AutoModelForSequenceClassification.from_pretrained(source)
        else:
            self.model = AutoModel.from_pretrained(source)
        self.model.to(self.device).eval()

    @torch.inference_mode()
    def score(self, queries: Sequence[str], passages: Sequence[str], progress: tqdm | None = None) -> np.ndarray:
        out = np.empty(len(queries), dtype=np.float32)
        size = self.cfg.batch_size
        # bf16 on a GPU (a cross-encoder over millions of pairs); fp32 on a CPU
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        for start in range(0, len(queries), size):
            q, p = list(queries[start : start + size]), list(passages[start : start + size])
            with autocast:
                out[start : start + len(q)] = self._cross(q, p) if self.kind == "cross-encoder" else self._bi(q, p)
            if progress is not None:
                progress.update(len(q))
        return out

    def _inputs(self, *texts) -> dict:
        batch = self.tokenizer(*texts, padding=True, truncation=True, max_length=self.cfg.max_length,
                               return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def _cross(self, queries: list[str], passages: list[str]) -> np.ndarray:
        logits = self.model(**self._inputs(queries, passages)).logits.float()
        score = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]
        return score.cpu().numpy()

    def _bi(self, queries: list[str], passages: list[str]) -> np.ndarray:
        """Cosine of the pooled token states (mean: sentence-transformers' MiniLM, E5; cls: BGE), each text after its
        prefix."""

        def embed(texts: list[str]) -> torch.Tensor:
            inputs = self._inputs(texts)
            states = self.model(**inputs).last_hidden_state.float()
            if self.cfg.pooling == "cls":
                return torch.nn.functional.normalize(states[:, 0], dim=-1)
            mask = inputs["attention_mask"].unsqueeze(-1).float()
            return torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)

        if self.checkpoint is not None:
            return self._checkpoint(queries, passages)
        cfg = self.cfg
        queries, passages = [cfg.query_prefix + q for q in queries], [cfg.passage_prefix + p for p in passages]
        return (embed(queries) * embed(passages)).sum(-1).cpu().numpy()

    def _checkpoint(self, queries: list[str], passages: list[str]) -> np.ndarray:
        """The inner product of a pipeline checkpoint's own embeddings (its pooling, head and prefixes; its query
        length, and the passage length capped by `max_length`): the score it retrieves by."""
        meta, size = self.checkpoint, len(queries)  # (one batch: `score` cut them; its autocast applies)
        q = encode_texts(self.model, self.tokenizer, meta.queries(queries), meta.query_max_length, size, None)
        p = encode_texts(self.model, self.tokenizer, meta.passages(passages),
                         min(meta.passage_max_length, self.cfg.max_length), size, None)
        return (q * p).sum(-1)


def with_teacher_scores(table: pd.DataFrame, cfg: TeacherConfig, corpus: CorpusRows, queries: pd.DataFrame,
                        teacher: Teacher | None = None) -> pd.DataFrame:
    """The mined table with the teacher's score of each pair's positive and of every negative of every draw
    (TEACHER_COLUMNS, `redrawn_teacher`); each distinct (query, document) is scored once. The mine stage calls it on
    each part of the queries it mines (MINE_CHUNK), so what it holds follows the part, not the split."""
    if table.empty:
        return table
    if len(table["negative_ids"].iloc[0]) == 0:
        raise AnceError("mining.teacher needs mined negatives: the in-batch samplers have no group to distil over")
    lists = {"teacher_negatives": "negative_ids"} | ({"redrawn_teacher": "redrawn_ids"} if "redrawn_ids" in table
                                                     else {})
    pairs = {(q, d) for q, d in zip(table["query_id"], table["positive_id"], strict=True)}
    for source in lists.values():
        pairs |= {(q, d) for q, ids in zip(table["query_id"], table[source], strict=True) for d in ids}
    pairs = sorted(pairs)
    text = pd.Series(queries["text"].to_numpy(), index=queries["query_id"].astype(str))
    docs = sorted({d for _, d in pairs})
    rows = corpus.rows_of(docs)
    if (rows < 0).any():
        raise AnceError(f"mining.teacher: the negatives name {int((rows < 0).sum())} documents the corpus lacks")
    doc_of_row = dict(zip(rows.tolist(), docs, strict=True))
    doc_text: dict[str, str] = {}
    for part_rows, texts in corpus.passages(np.sort(rows)):  # only the row groups that hold them
        doc_text.update({doc_of_row[r]: t for r, t in zip(part_rows.tolist(), texts, strict=True)})
    teacher = teacher or Teacher(cfg)
    with tqdm(total=len(pairs), desc="teacher", unit="pair", dynamic_ncols=True, leave=False) as bar:
        scores = teacher.score(text.loc[[q for q, _ in pairs]].tolist(), [doc_text[d] for _, d in pairs], bar)
    score_of = dict(zip(pairs, (scores / cfg.temperature).tolist(), strict=True))  # the softmax's logits
    columns = {"teacher_positive": np.array([score_of[(q, d)] for q, d in zip(table["query_id"], table["positive_id"],
                                                                              strict=True)], dtype=np.float32)}
    for column, source in lists.items():
        columns[column] = [np.array([score_of[(q, d)] for d in ids], dtype=np.float32)
                           for q, ids in zip(table["query_id"], table[source], strict=True)]
    return table.assign(**columns)


def group_teacher_scores(pairs: pd.DataFrame) -> np.ndarray | None:
    """(n, G) float32: each pair's teacher scores of its positive then its negatives (None: the table has none)."""
    if "teacher_positive" not in pairs:
        return None
    negatives = np.stack([np.asarray(v, dtype=np.float32) for v in pairs["teacher_negatives"]])
    return np.concatenate([pairs["teacher_positive"].to_numpy(np.float32)[:, None], negatives], axis=1)
