"""What `ance search --hybrid` and `ance evaluate --hybrid` look up: the fusion a run chose for a model (latest.json,
or the run's fusion stage), and a query's hybrid hits."""

from pathlib import Path

from ance_cli.lookups import check_same_corpus, model_work_dir


def fusion_weight(text: str) -> float | None:
    """`ance search --fusion`'s text checked: None for auto and rrf, else the dense ranking's weight (0 < w < 1)."""
    from ance_core.errors import AnceError

    if text in ("auto", "rrf"):
        return None
    try:
        weight = float(text)
    except ValueError:
        weight = -1.0
    if not 0 < weight < 1:
        raise AnceError(f"--fusion {text}: expected auto, rrf, or the dense ranking's weight strictly between 0 and 1 "
                        "(e.g. 0.7; 0 would be BM25 alone, 1 the model alone)")
    return weight


def recorded_fusion(model: Path, work_dir: str, dataset: str | None = None) -> dict | None:
    """What a run in the work folder chose on its dev split for this model's hybrid row: its fusion, BM25 config and
    depth, recorded in latest.json when the newest run's result is this model or its hybrid, else read from the
    newest fusion stage of this model's ranking (of `dataset`'s corpus where it was fused on several); None without
    one."""
    import json

    from ance_core.data.sources import dataset_digest, resolve_dataset
    from ance_core.retrieval.provenance import fusion_of

    latest = Path(work_dir) / "latest.json"
    record = json.loads(latest.read_text()) if latest.is_file() else {}
    same = record.get("checkpoint") and (Path(record["checkpoint"]).resolve() == model.resolve()
                                         or _same_digest(record, model))
    if same and record.get("fusion"):
        return record["fusion"]
    content = dataset_digest(resolve_dataset(dataset, download=False)) if dataset else None
    return fusion_of(model, Path(work_dir), content)  # (another model is the newest run's: its own run's choice)


def chosen_fusion(text: str, model: Path, work_dir: str, dataset: str | None = None):
    """`ance search --fusion`, the BM25 settings to fuse with and how deep each ranking is fused: auto (what a run in
    the work folder chose on its dev split for this model, `recorded_fusion`; without one RRF with the default BM25,
    1000 deep), rrf, or the dense ranking's weight in a convex combination (with the BM25 settings and depth of that
    run where there is one: the fusion alone is the option's)."""
    from ance_core.errors import warn
    from ance_core.retrieval.config import BM25Config
    from ance_core.retrieval.fusion import Fusion

    recorded = recorded_fusion(model, work_dir, dataset)
    bm25 = BM25Config.model_validate(recorded["bm25"]) if recorded and "bm25" in recorded else BM25Config()
    depth = recorded.get("depth", 1000) if recorded else 1000
    if text == "auto":
        if not recorded:
            warn(f"--fusion auto: no run in {work_dir} fused {model} with BM25 on a dev split (no hybrid row of it, "
                 "or it was trained elsewhere), so no fusion chosen on a dev split is known for it: RRF "
                 "with the default BM25 settings (give --work-dir the work folder of the run that trained it, or "
                 "--fusion)")
        return (Fusion.of(recorded) if recorded else Fusion("rrf")), bm25, depth
    weight = fusion_weight(text)
    return (Fusion("rrf") if weight is None else Fusion("convex", weight)), bm25, depth


def run_fusion(model: Path, work_dir: str, dataset: str) -> tuple[dict, int, str]:
    """`ance evaluate --hybrid`: the fusion a run chose on its dev split for this model (`recorded_fusion`, in the work
    folder `model` is a stage of, else `work_dir`) with its BM25 settings (`evaluate_checkpoint`'s `hybrid`), the
    depth it fused, and how it is told (" + BM25 (<fusion>)"); RRF with the default BM25 where none, with a warning."""
    from ance_core.errors import warn
    from ance_core.retrieval.fusion import Fusion

    work = own if (own := model_work_dir(model)) != "work" else work_dir  # ("work": it is no stage of one)
    if (record := recorded_fusion(model, work, dataset)) is None:
        warn(f"--hybrid: no run in {work} fused {model} with BM25 on a dev split (no hybrid row of it, or it was "
             "trained elsewhere: --work-dir its work folder): fused by RRF with the default BM25 settings")
        return {"fusion": None, "bm25": {}}, 1000, " + BM25 (RRF, k=60)"
    fusion = Fusion.of(record)
    return ({"fusion": fusion.as_dict(), "bm25": record.get("bm25", {})}, record.get("depth", 1000),
            f" + BM25 ({fusion.label()})")


def _same_digest(record: dict, model: Path) -> bool:
    """Whether latest.json's model is `model` by its digest: the same training stage in a work folder moved or copied
    since the run (its path recorded there names the old place)."""
    from ance_core.errors import AnceError
    from ance_core.modeling.model import checkpoint_ref

    try:
        return bool(record.get("digest")) and checkpoint_ref(model).digest == record["digest"]
    except AnceError:  # (a damaged checkpoint: the search says so itself)
        return False


def hybrid_search(model: Path, index: Path, query: str, top_k: int, dataset: str, work_dir: str, fusion, bm25_cfg,
                  depth: int = 1000):
    """The top `top_k` hits of `query` by `model`'s ranking fused with BM25's over `dataset`'s corpus, each ranking
    `depth` deep as the pipeline fuses them (the BM25 index is the work folder's, built once)."""
    import pandas as pd

    from ance_core.data.layout import has_labels
    from ance_core.data.sources import resolve_dataset
    from ance_core.retrieval.bm25 import BM25
    from ance_core.retrieval.fusion import fuse
    from ance_core.retrieval.provenance import encoded_corpus
    from ance_core.retrieval.search import Hit, search_text
    from tasks.bm25 import bm25_index
    from tasks.common import faults_off
    from tasks.data import prepare_corpus, prepare_data, stage_data_config

    with faults_off():
        folder = resolve_dataset(dataset, download=False)
        if has_labels(folder):  # the data stage: a run's BM25 index is reused
            data = prepare_data.fn(stage_data_config(encoded_corpus(index), dataset), work_dir)
        else:  # a corpus to search, with no queries or qrels
            data = prepare_corpus(folder, work_dir)
        check_same_corpus(index, data, dataset)
        bm25 = BM25.load(bm25_index(data, bm25_cfg, work_dir), bm25_cfg)
    # BM25's ranking as deep as the run's the fusion was chosen on (bm25.top_k may be the shallower)
    sparse = bm25.search(pd.DataFrame({"query_id": ["q"], "text": [query]}), min(bm25_cfg.top_k, depth))
    dense = pd.DataFrame([("q", h.doc_id, h.score) for h in search_text(model, index, query, depth)],
                         columns=["query_id", "doc_id", "score"])
    run = fuse(dense, sparse, fusion, depth).head(top_k)
    return [Hit(d, float(s)) for d, s in zip(run["doc_id"], run["score"], strict=True)]
