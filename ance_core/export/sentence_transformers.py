"""`ance export`: a checkpoint as a standard sentence-transformers model folder, with a model card.

The folder is what sentence-transformers 6.2 itself writes for these modules (`SentenceTransformer.save`; a test
compares), except two settings kept in sentence_bert_config.json, which 6.2 reads there (it saves the first as the
tokenizer's model_max_length, and the second not at all):

  config.json, model.safetensors, tokenizer files   module 0, Transformer: the checkpoint's encoder (copied as is)
  sentence_bert_config.json   its settings: max_seq_length = passage_max_length (plain `encode`), query_length /
                              document_length (`encode_query` / `encode_document`: one set of weights, two
                              truncation lengths), model_kwargs without the unused pooler where the encoder has one
  1_Pooling/                  mean or cls, as the checkpoint
  2_Dense/                    Linear(h, h) with bias and identity activation: the head's projection
  3_LayerNorm/                LayerNorm(h) (eps 1e-5, affine, as torch's default): the head's norm
  modules.json, config_sentence_transformers.json   the modules in order; similarity "dot", the checkpoint's prefixes
                              as the prompts query and document (the default prompt where it has a passage prefix)
  README.md                   the model card: model, usage, what is recorded of its training, its metrics
  ance_model.json, head.safetensors   the checkpoint's own (the head once more, 2_Dense + 3_LayerNorm's weights):
                              the folder is also an ANCE checkpoint, so `ance evaluate` / `ance search` take it as
                              they take the checkpoint; sentence-transformers ignores both files

So `SentenceTransformer(DIR).encode_query(q)` / `.encode_document(p)` are the checkpoint's query / passage encodings.
Refused: MaxP checkpoints (a document is its windows, scored by the best one; sentence-transformers encodes a text as
one vector) and compressed ones (their query and document projections differ; export the teacher).

What the card says of the training comes from where the checkpoint was found (`provenance`): a training stage folder
in a work folder (its stage manifests: the chain of training stages back to the starting model, their configs and
negatives, the data stage; the run's report with this model's row; `latest.json`), or a registered model version
(tracking/registry.py: its tags, the run's parameters and results table). Without either, the card states only what
the checkpoint itself holds.
"""

import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file, save_file

from ance_core.artifacts import MANIFEST, RESULTS_JSON, atomic_folder, is_complete, read_manifest
from ance_core.compression.conae import PROJECTOR_FILE
from ance_core.errors import AnceError
from ance_core.modeling.model import HEAD_FILE, MODEL_ALIASES, ModelMeta, load_checkpoint, model_files, read_meta
from ance_core.pipeline.report import COLUMNS, DEV_KEY, markdown_table

FORMATS = ("sentence-transformers",)
ST_VERSION = "6.2.0"  # the sentence-transformers release whose folder layout this writes (and the tests load)
CARD = "README.md"
ST_FILES = {CARD, "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"}  # (besides the
# checkpoint's own files: with the module folders, what makes a folder a sentence-transformers model)
LATEST = "latest.json"  # <work_dir>/latest.json, every pipeline run's result (flows/start.py)
ST_MODULES = [  # (folder, class) in order; the Transformer lives in the folder's root
    ("", "sentence_transformers.base.modules.transformer.Transformer"),
    ("1_Pooling", "sentence_transformers.sentence_transformer.modules.pooling.Pooling"),
    ("2_Dense", "sentence_transformers.base.modules.dense.Dense"),
    ("3_LayerNorm", "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm"),
]


def exportable_meta(checkpoint: str | Path) -> ModelMeta:
    """The checkpoint's settings, or an AnceError when it is not one that a sentence-transformers model reproduces."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise AnceError(f"{checkpoint}: no such folder; pass a checkpoint folder or a models:/ URI")
    meta = read_meta(checkpoint)
    if meta.document_mode == "maxp":
        raise AnceError(f"{checkpoint}: a MaxP checkpoint (a document is scored by the best of its windows of "
                        f"{meta.passage_max_length} tokens) has no sentence-transformers equivalent, which encodes a "
                        "text as one vector; not exported")
    if (checkpoint / PROJECTOR_FILE).is_file():
        raise AnceError(f"{checkpoint}: a compressed checkpoint projects queries and documents differently "
                        f"({PROJECTOR_FILE}); export its teacher instead")
    return meta


EXPORT_MARKERS = ("ance_model.json", "modules.json")  # an ONNX export is a checkpoint; sentence-transformers


def check_target(out: str | Path, force: bool, checkpoint: str | Path | None = None) -> None:
    """An AnceError unless `out` can be written: missing or empty, or `force`; never the checkpoint or a folder
    holding it (writing replaces `out` whole)."""
    out = Path(out).resolve()
    if checkpoint is not None:
        source = Path(checkpoint).resolve()
        if out == source or out in source.parents:
            raise AnceError(f"{out}: the export would replace the checkpoint {source}; choose another --out")
    if out.exists() and not out.is_dir():
        raise AnceError(f"{out}: exists and is not a folder")
    export = out.is_dir() and any((out / name).is_file() for name in EXPORT_MARKERS)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise AnceError(f"{out}: exists and is not empty; " + ("an earlier export: pass --force to replace it" if export
                        else "not an earlier export either: choose a new or empty --out"))
    if out.is_dir() and any(out.iterdir()) and not export:
        raise AnceError(f"{out}: not an earlier export (no {' or '.join(EXPORT_MARKERS)}); --force replaces only an "
                        "export folder: choose a new or empty --out")  # (--out ~/project --force deleted the project)
    if force and (kept := [n for n in ("manifest.json", "trainer_state.json") if (out / n).is_file()]):
        raise AnceError(f"{out}: a pipeline stage or a trained checkpoint ({kept[0]}), not an export; --force replaces "
                        "only an export folder: choose a new or empty --out")
    ancestor = next(p for p in out.parents if p.exists())  # where the export's folders would be made
    if not ancestor.is_dir():
        raise AnceError(f"{out}: {ancestor} is a file, not a folder; choose another --out")
    try:  # (a folder made and removed: what the export does there; /proc, /sys and read-only places refuse it)
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".ance-write-check-"))
    except OSError as e:
        raise AnceError(f"{out}: a folder cannot be made in {ancestor} ({e.strerror or type(e).__name__}); choose "
                        "another --out") from None


def export_checkpoint(checkpoint: str | Path, out: str | Path, fmt: str = "sentence-transformers",
                      force: bool = False, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the checkpoint as a `fmt` model folder `out`, atomically. `provenance` (see `checkpoint_provenance`,
    the default) is what the model card says of its training and metrics."""
    if fmt not in FORMATS:
        raise AnceError(f"unknown export format '{fmt}'; choose one of {', '.join(FORMATS)}")
    checkpoint, out = Path(checkpoint), Path(out)
    meta = exportable_meta(checkpoint)
    check_target(out, force, checkpoint)
    if provenance is None:
        provenance = checkpoint_provenance(checkpoint)
    model, _, _ = load_checkpoint(checkpoint)  # fails here, not in the user's hands, if it does not load
    dim, hidden = model.proj.out_features, model.proj.in_features
    encoder_kwargs = {}
    if getattr(model.encoder, "pooler", 0) is None and "add_pooling_layer" in inspect.signature(
            type(model.encoder).__init__).parameters:  # BERT family: as ance loads it, without the unused pooler
        encoder_kwargs = {"add_pooling_layer": False}
    head = load_file(checkpoint / HEAD_FILE)
    with atomic_folder(out) as tmp:
        for src in model_files(checkpoint):
            if src.name != CARD:
                shutil.copy2(src, tmp / src.name)
        _write_json(tmp / "sentence_bert_config.json", {
            "transformer_task": "feature-extraction",
            "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
            "module_output_name": "token_embeddings",
            "max_seq_length": meta.passage_max_length,
            "query_length": meta.query_max_length,
            "document_length": meta.passage_max_length,
        } | ({"model_kwargs": encoder_kwargs} if encoder_kwargs else {}))
        _write_json(tmp / "1_Pooling" / "config.json",
                    {"embedding_dimension": hidden, "pooling_mode": meta.pooling, "include_prompt": True})
        _write_json(tmp / "2_Dense" / "config.json", {
            "in_features": hidden, "out_features": dim, "bias": True,
            "activation_function": "torch.nn.modules.linear.Identity",
            "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"})
        save_file({"linear.weight": head["proj.weight"].contiguous(), "linear.bias": head["proj.bias"].contiguous()},
                  tmp / "2_Dense" / "model.safetensors")
        _write_json(tmp / "3_LayerNorm" / "config.json", {"dimension": dim})
        save_file({"norm.weight": head["norm.weight"].contiguous(), "norm.bias": head["norm.bias"].contiguous()},
                  tmp / "3_LayerNorm" / "model.safetensors")
        _write_json(tmp / "modules.json", [{"idx": k, "name": str(k), "path": path, "type": kind}
                                           for k, (path, kind) in enumerate(ST_MODULES)])
        _write_json(tmp / "config_sentence_transformers.json", {
            "__version__": {"sentence_transformers": ST_VERSION, "transformers": transformers.__version__,
                            "pytorch": torch.__version__},
            "model_type": "SentenceTransformer",
            "prompts": {"query": meta.query_prefix, "document": meta.passage_prefix},  # encode_query / _document
            # plain `encode` is the passage encoding, its prefix included (with None it encoded without one)
            "default_prompt_name": "document" if meta.passage_prefix else None, "similarity_fn_name": "dot"})
        (tmp / CARD).write_text(model_card(meta, dim, provenance), encoding="utf-8")
    return {"out": str(out), "format": fmt, "dim": dim, "pooling": meta.pooling,
            "query_max_length": meta.query_max_length, "passage_max_length": meta.passage_max_length,
            "source": provenance.get("source", str(checkpoint))}


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


# ---------------------------------------------------------------- provenance from a work folder


def _stage(work: Path, digest: str | None) -> dict | None:
    """The manifest of the stage folder `<work>/<stage>/<digest>/`, whatever the stage; None when there is none."""
    if not digest:
        return None
    found = sorted(work.glob(f"*/{digest}/{MANIFEST}"))
    return json.loads(found[0].read_text()) if found else None


def checkpoint_provenance(checkpoint: str | Path) -> dict[str, Any]:
    """What the work folder records of a checkpoint that is one of its stage folders (`<work>/<stage>/<key>/`):

    `stages`  the stages that made it, the starting model first (manifest: stage, key, config, summary), each
              training stage with `negatives` (the mining stage's manifest)
    `data`    the data stage's manifest (documents, queries, splits)
    the newest run report that evaluated it: `dataset`, `split`, `dev_split`, `label` (its row), `metrics`, `results`
    (every row of the report); else `<work>/latest.json` when it names this checkpoint: `label`, `metrics`.
    Only `source` for any other folder."""
    checkpoint = Path(checkpoint).resolve()
    info: dict[str, Any] = {"source": str(checkpoint)}
    if not is_complete(checkpoint) or read_manifest(checkpoint).get("key") != checkpoint.name:
        return info
    work, stages, digest, seen = checkpoint.parent.parent, [], checkpoint.name, set()
    while digest not in seen and (manifest := _stage(work, digest)) is not None:
        seen.add(digest)
        entry = {k: manifest.get(k) for k in ("stage", "key", "config", "summary")}
        if (negatives := _stage(work, manifest["inputs"].get("negatives"))) is not None:
            entry["negatives"] = {k: negatives.get(k) for k in ("key", "config", "summary")}
        if "data" not in info and (data := _stage(work, manifest["inputs"].get("data"))) is not None:
            info["data"] = {k: data.get(k) for k in ("key", "config", "summary")}
        stages.append(entry)
        digest = manifest["inputs"].get("checkpoint")
    if digest and digest not in seen:
        stages.append({"stage": "checkpoint", "key": digest, "config": None,
                       "summary": {"note": "a checkpoint that is not a stage of this work folder"}})
    info["stages"] = stages[::-1]
    info |= _report_of(work, checkpoint.name) or _latest_of(work, checkpoint)
    return info


def _report_of(work: Path, digest: str) -> dict[str, Any]:
    """The newest report (`<work>/reports/<key>/`) with a row evaluated on this checkpoint (report -> evaluate ->
    retrieve -> checkpoint digest)."""
    reports = sorted(work.glob(f"reports/*/{MANIFEST}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in reports:
        manifest = json.loads(path.read_text())
        for label, evaluation in manifest.get("inputs", {}).items():
            evaluated = None if label.startswith("dev:") else _stage(work, evaluation)
            retrieved = _stage(work, evaluated["inputs"].get("run")) if evaluated else None
            if retrieved is None or retrieved["inputs"].get("checkpoint") != digest:
                continue
            report = json.loads((path.parent / RESULTS_JSON).read_text())
            row = next((r for r in report["results"] if r["model"] == label), {})
            return {"dataset": report.get("dataset"), "split": report.get("split"),
                    "dev_split": report.get("dev_split"), "label": label, "results": report["results"],
                    "metrics": {k: v for k, v in row.items() if k != "model"}}
    return {}


def _latest_of(work: Path, checkpoint: Path) -> dict[str, Any]:
    latest = work / LATEST
    if not latest.is_file():
        return {}
    record = json.loads(latest.read_text())
    if Path(record.get("checkpoint", "")).resolve() != checkpoint:
        return {}
    return {"label": record.get("model"),
            "metrics": {k: v for k, v in record.get("metrics", {}).items() if k != "model"}}


# ---------------------------------------------------------------- the model card


def model_card(meta: ModelMeta, dim: int, info: dict[str, Any]) -> str:
    """The README.md of an export: correct with `info` = {} (then it states only what the checkpoint holds)."""
    label, dataset = info.get("label"), info.get("dataset")
    title = "ANCE dense retriever" + (f": {label}" if label else "") + (f" ({Path(dataset).name})" if dataset else "")
    base = MODEL_ALIASES.get(meta.base, meta.base)
    hub_id = base.count("/") == 1 and not Path(base).exists() and not base.startswith((".", "/"))
    front = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
             "- sentence-transformers", "- feature-extraction", "- dense-retrieval", "- ance",
             *([f"base_model: {base}"] if hub_id else []), "---"]
    parts = ["\n".join(front), f"# {title}", (
        f"A dense retriever from the ANCE training pipeline (ance-pipeline; ANCE: Xiong et al. 2021, "
        f"https://arxiv.org/abs/2007.00808), exported as a sentence-transformers model. Queries and passages go "
        f"through the same network into {dim}-dimensional vectors, and a passage's score for a query is the **dot "
        f"product** of the two (not the cosine: the vectors are not normalised)."), _usage(meta), _model(meta, dim),
        _training(info), _config(meta, info), _evaluation(info)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _usage(meta: ModelMeta) -> str:
    return "\n".join([
        "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        'model = SentenceTransformer("path/to/this/folder")',
        'queries = model.encode_query(["does vitamin D lower cancer risk"])',
        'passages = model.encode_document(["Vitamin D supplementation and cancer incidence ..."])',
        "scores = model.similarity(queries, passages)  # dot product", "```", "",
        f"`encode_query` truncates a text at {meta.query_max_length} tokens, `encode_document` at "
        f"{meta.passage_max_length} (a passage, or a document's beginning): the lengths the checkpoint encodes "
        "with in the pipeline's search and evaluation. "
        f"Plain `encode` truncates at {meta.passage_max_length} (`max_seq_length`): it gives the passage encoding, "
        "and the query encoding of queries shorter than the query length. Needs sentence-transformers 6.2 or "
        "newer (the per-task lengths `query_length` / `document_length` of the Transformer module)."])


def _model(meta: ModelMeta, dim: int) -> str:
    rows = [["base model", f"`{meta.base}`"],
            ["architecture", f"encoder -> {meta.pooling} pooling -> Linear({dim}, {dim}) -> LayerNorm (ANCE's "
                             "BERT-Siamese: one encoder for queries and passages)"],
            ["embedding dimension", str(dim)], ["similarity", "dot product"],
            ["query length", f"{meta.query_max_length} tokens (`encode_query`)"],
            ["passage length", f"{meta.passage_max_length} tokens (`encode_document`, `encode`)"],
            ["documents", f"their first {meta.passage_max_length} tokens (FirstP)"]]
    rows += [[f"{kind} prefix", f"`{prefix!r}` (the `{prompt}` prompt: `encode_{method}` puts it first; plain `encode` "
              "does not)"] for kind, prefix, prompt, method in (("query", meta.query_prefix, "query", "query"),
                                                                  ("passage", meta.passage_prefix, "document",
                                                                   "document")) if prefix]
    return "\n".join([
        "## Model", "", markdown_table(["", ""], rows), "",
        "Modules: `Transformer` (this folder's root: the checkpoint's encoder), `1_Pooling` "
        f"({meta.pooling}), `2_Dense` (the projection: Linear with bias, identity activation), `3_LayerNorm`.", "",
        "The folder is also a checkpoint of the `ance` command: `ance_model.json` (its settings, below) and "
        "`head.safetensors` (the projection and LayerNorm again) let `ance evaluate --checkpoint <this folder>` "
        "and `ance search --model <this folder>` use it as they use the checkpoint it was exported from; "
        "sentence-transformers ignores these two files."])


def _training(info: dict[str, Any]) -> str:
    lines = ["## Training", "", f"Exported from `{info.get('source', 'a checkpoint folder')}`."]
    if info.get("dataset"):
        lines += ["", f"Dataset: `{info['dataset']}`" + (f"; evaluated on its `{info['split']}` split" if
                                                          info.get("split") else "") + "."]
    if data := info.get("data"):
        summary = data.get("summary") or {}
        counts = ", ".join(f"{k.removeprefix('qrels_')}: {v} relevance judgements" for k, v in summary.items()
                           if k.startswith("qrels_"))
        lines += ["", f"Training data (the data stage `{data.get('key')}`): {summary.get('documents', '?')} "
                      f"documents, {summary.get('queries', '?')} queries, splits "
                      f"{', '.join(summary.get('splits', [])) or '?'}" + (f" ({counts})" if counts else "") + "."]
    if stages := info.get("stages"):
        lines += ["", "The stages that made this model, in order (each stage's exact configuration is below):", ""]
        lines += [f"{k}. {_describe(stage)}" for k, stage in enumerate(stages, 1)]
    elif params := info.get("params"):  # (a registered version: the run's recipe, and which of its models this is)
        recipe = (f"a warm-up on BM25 negatives, then {params['rounds']} ANCE round(s) with negatives mined by "
                  f"`{params.get('mining.sampler', '?')}`" if "rounds" in params else "see the parameters below")
        label = info.get("label")
        which = (f"; this model is its `{label}`" + (" (the model it started from, not one it trained)"
                                                      if label in ("zero-shot", "start") else "")) if label else ""
        lines += ["", f"The pipeline run it comes from: {recipe}{which}; the run's exact parameters are below."]
    else:
        lines += ["", "How it was trained is not recorded with this checkpoint (it is not a stage folder of a work "
                      "folder, nor a registered model version): its settings are those of `ance_model.json` below."]
    return "\n".join(lines)


def _describe(stage: dict[str, Any]) -> str:
    config, summary = stage.get("config") or {}, stage.get("summary") or {}
    name, key = stage.get("stage"), stage.get("key")
    if name == "model":
        return (f"`model` `{key}`: start from `{config.get('name')}` with a fresh head ({config.get('pooling')} "
                f"pooling; identity projection, LayerNorm gain at temperature {config.get('init_temperature')}).")
    if name in ("train", "train-async"):
        negatives = stage.get("negatives") or {}
        mined = negatives.get("config") or {}
        sampler = (negatives.get("summary") or {}).get("sampler", "?")
        round_ = mined.get("round")
        which = "the warm-up" if round_ == 0 else f"round {round_}" if round_ is not None else "a round"
        return (f"`{name}` `{key}`: {summary.get('steps', '?')} optimizer steps on {summary.get('pairs', '?')} "
                f"(query, positive) pairs of the split `{config.get('split', '?')}`, negatives mined by `{sampler}` "
                f"({which}).")
    return f"`{name}` `{key}`" + (f": {summary['note']}." if "note" in summary else ".")


def _config(meta: ModelMeta, info: dict[str, Any]) -> str:
    lines = ["### Exact configuration", "", "`ance_model.json` (the checkpoint's settings):", "", "```json",
             json.dumps(meta.to_json(), indent=2), "```"]
    if stages := info.get("stages"):
        recorded = [{k: v for k, v in s.items() if k != "summary"} for s in stages]
        recorded += [{"data": info["data"]}] if info.get("data") else []
        lines += ["", "The stage manifests' configurations (pydantic values as recorded):", "", "```json",
                  json.dumps(recorded, indent=2), "```"]
    if params := info.get("params"):
        lines += ["", "The training run's parameters (MLflow, the pipeline config flattened):", "", "```json",
                  json.dumps(dict(sorted(params.items())), indent=2), "```"]
    return "\n".join(lines)


def _evaluation(info: dict[str, Any]) -> str:
    lines = ["## Evaluation", ""]
    label, metrics = info.get("label"), info.get("metrics") or {}
    if metrics:
        split, dev = info.get("split") or "evaluation", (info.get("dev_split") or "dev").split(" ")[0]
        rows = [[COLUMNS[k], f"`{split}`", f"{metrics[k]:.4f}"] for k in COLUMNS if k in metrics]
        rows += [[COLUMNS[k], f"`{dev}`", f"{metrics['dev_' + k]:.4f}"] for k in COLUMNS if f"dev_{k}" in metrics]
        lines += ["Metrics of this model" + (f" (`{label}` in its run)" if label else "") + ":", "",
                  markdown_table(["metric", "split", "value"], rows), ""]
    if results := info.get("results"):
        dev_split = info.get("dev_split")
        show_dev = any(DEV_KEY in r for r in results)
        header = ["model", *([f"{dev_split or 'dev'} nDCG@10"] if show_dev else []), *COLUMNS.values()]
        rows = [[f"**{r['model']}** (this model)" if r["model"] == label else r["model"],
                 *([f"{r[DEV_KEY]:.4f}" if DEV_KEY in r else "—"] if show_dev else []),
                 *(f"{r[k]:.4f}" if k in r else "—" for k in COLUMNS)] for r in results]
        lines += [f"The run's results table (`{info.get('split')}` split):", "", markdown_table(header, rows), ""]
    elif table := info.get("results_markdown"):
        lines += ["The run's results table:", "", table, ""]
    if len(lines) == 2:
        lines += ["No evaluation is recorded with this checkpoint. `ance evaluate --checkpoint <this folder> "
                  "--dataset <name> --split test` measures it (nDCG@10, MRR@10, R@100, R@1000).", ""]
    return "\n".join(lines).rstrip()
