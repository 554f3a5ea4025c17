from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ance_core.artifacts import NEGATIVES, POSITIVE_SCORES, RUN, ArtifactRef, run_stage
from ance_core.data.corpus import ParquetCorpus
from ance_core.data.dataset import read_tables
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.mining import SortedIds, fallback_stats, sample_negatives, sorted_ids, warn_fallback
from ance_core.negatives.randomness import round_sample
from ance_core.negatives.teacher import Teacher, with_teacher_scores
from ance_core.retrieval.search import score_pairs
from ance_core.training.config import TrainConfig
from ance_core.training.plan import planned_epochs
from tasks.common import stage_task
from tasks.model import local_model_digest

MINE_CHUNK = 20_000  # queries mined at a time (their rankings' rows are read, sampled and dropped)
MAX_DRAWS = 8  # negatives drawn per pair for a stage of several epochs: one per epoch, cycling after this many


def teacher_digest(cfg: MiningConfig) -> str | None:
    """The content of a local teacher (a checkpoint retrained at the same path is another teacher, with other
    scores): `local_model_digest`. None without a teacher, or for a hub id (or the 'minilm' alias), which its name in
    the config names."""
    return local_model_digest(cfg.teacher.model) if cfg.teacher is not None else None


def _teacher_key(inputs: dict) -> dict:
    """The task cache's share of `teacher_digest` (the stage folder's key holds it too)."""
    digest = teacher_digest(inputs["cfg"])
    return {"teacher": digest} if digest else {}


@stage_task("mine-negatives", extra_key=_teacher_key)
def mine_negatives(rankings: dict[str, ArtifactRef], data: ArtifactRef, split: str, cfg: MiningConfig, round_: int,
                   work_dir: str, scorer: dict[str, ArtifactRef] | None = None,
                   train: TrainConfig | None = None) -> ArtifactRef:
    """Negatives per (query, positive) with the configured sampler (ance_core/negatives/samplers.py) from the rankings
    it mines (`dense`, `bm25`; none for random and in-batch samplers). `scorer` (a checkpoint and its index: the model
    training starts from) scores a BM25 ranking's candidates and the positives when no dense ranking did: for the
    `margin` false-negative control, and for a MaxP model, each document's best window.

    `train`: the config of the stage that trains on them; a stage of several epochs gets a draw of negatives per epoch
    from the same candidates (at most MAX_DRAWS, then they cycle)."""
    draws = epoch_draws(data, split, cfg, round_, train)

    def build(out):
        tables = read_tables(data.path, corpus_columns=["doc_id"])  # not the passages' text
        positives, relevant = tables.positives(split), tables.relevant(split)
        judged = tables.judged_nonrelevant(split) if cfg.judged_only else None
        corpus_ids = sorted_ids(tables.corpus["doc_id"].tolist())  # once for all the parts
        query_ids = round_sample(list(positives), cfg.queries, cfg.seed, round_)  # all, or the round's sample
        parts = [query_ids[i:i + MINE_CHUNK] for i in range(0, len(query_ids), MINE_CHUNK)] or [[]]
        mined = []
        teacher = Teacher(cfg.teacher) if cfg.teacher is not None else None  # distillation: loaded once
        for part in parts:  # a part of the queries at a time: the rankings of all of them are never held
            wanted = None if len(parts) == 1 else part
            table = mine_queries(cfg, {q: positives[q] for q in part}, round_, rankings, tables, relevant,
                                 corpus_ids, scorer, wanted, draws, judged)
            if teacher is not None:  # its scores of every pair's group, every draw's
                table = with_teacher_scores(table, cfg.teacher, ParquetCorpus.of_folder(data.path), tables.queries,
                                            teacher)
            mined.append(table)
        negatives = pd.concat(mined, ignore_index=True) if len(mined) > 1 else mined[0]
        warn_fallback(cfg, negatives)
        negatives.to_parquet(out / NEGATIVES, index=False)
        ranks = negatives["negative_ranks"].explode().dropna()
        return {"pairs": len(negatives), "sampler": cfg.sampler, "draws": draws,
                "mean_negative_rank": float(ranks[ranks > 0].mean()) if (ranks > 0).any() else None,
                **fallback_stats(negatives)}

    # draws 2: the counter-based draws (ance_core/negatives/randomness.py) that replaced the per-query generators
    # (issue 28); other negatives for the same config, so a folder mined before is not reused as if it were these
    config = {"mining": cfg, "split": split, "round": round_, "draws": 2}
    if cfg.margin is not None:  # s⁺ − m·|s⁺| since issue 30 ((1 − m)·s⁺ before: other negatives when s⁺ < 0)
        config["margin_rule"] = "relative-to-abs"
        if cfg.sampler == "simans":  # SimANS under a margin changed its draws without a key change (issue 41)
            config["margin_rule"] += ", simans 2"
    if cfg.spec.needs_positive_score:  # SimANS centres each pair on its own positive since session 29 (on a positive
        config["centre"] = "own positive"  # of the query drawn at random before: other negatives, a new key)
    if draws > 1:
        config["epoch_draws"] = draws
    # the first ranking keeps the key "run" (a one-ranking sampler's stage folder is the same as before the registry)
    names = [name for name in cfg.spec.rankings if name in rankings]
    inputs = {"run": rankings[names[0]].digest if names else None, "data": data.digest}
    inputs |= {f"{name}_run": rankings[name].digest for name in names[1:]}
    if scorer is not None:
        inputs |= {"scorer_checkpoint": scorer["checkpoint"].digest, "scorer_index": scorer["index"].digest}
    if (teacher := teacher_digest(cfg)) is not None:  # its content, not only its path (issue 41)
        inputs["teacher"] = teacher
    return run_stage(work_dir, "mine", config, inputs, build)


def epoch_draws(data: ArtifactRef, split: str, cfg: MiningConfig, round_: int, train: TrainConfig | None) -> int:
    """How many draws of negatives the stage training on them needs: one per epoch (at most MAX_DRAWS); 1 for an
    unknown stage, a sampler that mines nothing, or a single epoch."""
    if train is None or not cfg.spec.mines:
        return 1
    if train.max_steps is None:
        return min(train.epochs, MAX_DRAWS)
    return min(planned_epochs(stage_pairs(data, split, cfg, round_), train), MAX_DRAWS)  # epochs follow the pairs


def stage_pairs(data: ArtifactRef, split: str, cfg: MiningConfig, round_: int) -> int:
    """The (query, positive) pairs a stage mining with `cfg` in round `round_` trains on, known before it is mined
    (its negatives hold one row per pair): every training query's positives, or those of the round's sample of the
    queries (`cfg.queries`), drawn as `mine_negatives` draws it."""
    positives = read_tables(data.path, corpus_columns=[]).positives(split)
    return sum(len(positives[q]) for q in round_sample(list(positives), cfg.queries, cfg.seed, round_))


def ranking_rows(path: Path, query_ids: list[str] | None) -> pa.Table:
    """A ranking's (or positive-score table's) rows: all of them, or those of the range of query ids from the first of
    `query_ids` (sorted) to the last, and perhaps some of other queries. A file in query-id order (its row groups'
    statistics say so: ance_core/retrieval/search.py `RunWriter` writes runs so) is read by the row groups that hold
    the range, query_id as an Arrow dictionary; any other (a run written before) by a scan of the whole file that keeps
    the range's rows."""
    if query_ids is None:
        return pq.read_table(path)
    if not query_ids:
        return pq.read_schema(path).empty_table()
    with pq.ParquetFile(path, read_dictionary=["query_id"]) as file:
        if (groups := row_groups_between(file.metadata, query_ids[0], query_ids[-1])) is not None:
            return file.read_row_groups(groups)
    return pq.read_table(path, filters=[("query_id", ">=", query_ids[0]), ("query_id", "<=", query_ids[-1])])


def row_groups_between(meta: pq.FileMetaData, first: str, last: str) -> list[int] | None:
    """The row groups that may hold query ids from `first` to `last`; None when the row groups are not in query-id
    order (or have no statistics)."""
    column = meta.schema.to_arrow_schema().get_field_index("query_id")
    bounds = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        bounds.append((stats.min, stats.max))
    if any(low < previous_high for (_, previous_high), (low, _) in zip(bounds, bounds[1:], strict=False)):
        return None
    return [i for i, (low, high) in enumerate(bounds) if low <= last and high >= first]


def mine_queries(cfg: MiningConfig, positives: dict[str, set[str]], round_: int, rankings: dict[str, ArtifactRef],
                 tables, relevant: dict[str, set[str]], corpus_ids: SortedIds, scorer: dict[str, ArtifactRef] | None,
                 query_ids: list[str] | None, draws: int = 1, judged: dict[str, set[str]] | None = None
                 ) -> pd.DataFrame:
    """The negatives of some queries' pairs (`query_ids`, sorted; None: all of them) from the rankings' rows of those
    queries; `relevant`, `judged` and `corpus_ids` are the whole split's and corpus's, computed once for all the
    parts. `tables` (the dataset) serves only the scorer."""
    frames = {name: ranking_rows(Path(ref.path, RUN), query_ids) for name, ref in rankings.items()}
    if "bm25" in frames:  # BM25's matches only: its score-0 rows, which pad a query with few matches to the run's
        # depth, match no query term and sit at arbitrary ranks (one fixed block of the corpus for every such query)
        frames["bm25"] = frames["bm25"].filter(pc.greater(frames["bm25"]["score"], 0))
    scores, windows = None, None  # the positives' exact scores (and MaxP windows): dense retrieval writes them
    table = None
    if "dense" in rankings and Path(rankings["dense"].path, POSITIVE_SCORES).is_file():
        table = ranking_rows(Path(rankings["dense"].path, POSITIVE_SCORES), query_ids).to_pydict()
    elif scorer is not None:  # a BM25 ranking (or none), scored by the starting model
        bm25 = frames["bm25"].to_pandas() if "bm25" in frames else None
        bm25 = bm25[bm25["query_id"].isin(positives)] if bm25 is not None else None  # not its neighbours' rows
        top, table = dense_scores(bm25, tables, positives, cfg.depth, scorer)
        if top is not None:
            frames["bm25"] = top
    if table is not None:
        pairs = list(zip(table["query_id"], table["doc_id"], strict=True))
        scores = dict(zip(pairs, table["score"], strict=True))
        windows = dict(zip(pairs, table["window"], strict=True)) if "window" in table else None
    return sample_negatives(cfg, positives, round_, frames, corpus_ids, scores, relevant, windows, warn_short=False,
                            draws=draws, judged=judged)


def dense_scores(ranking: pd.DataFrame | None, tables, positives: dict[str, set[str]], depth: int,
                 scorer: dict[str, ArtifactRef]) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """A BM25 ranking's top-`depth` rows with the scorer model's score and best (MaxP) window instead of BM25's score
    (rank kept: BM25's), and the scorer's scores and windows of the training positives (`positives`)."""
    top = ranking[ranking["rank"] <= depth] if ranking is not None else None
    positives = {(q, d) for q, ds in positives.items() for d in ds}
    pairs = sorted(positives | (set(zip(top["query_id"], top["doc_id"], strict=True)) if top is not None else set()))
    scored = score_pairs(scorer["checkpoint"].path, scorer["index"].path, tables.queries, pairs)
    keys = list(zip(scored["query_id"], scored["doc_id"], strict=True))
    if top is not None:
        by_pair = scored.set_index(["query_id", "doc_id"])
        rows = pd.MultiIndex.from_arrays([top["query_id"], top["doc_id"]])
        top = top.assign(score=by_pair["score"].reindex(rows).to_numpy(),
                         window=by_pair["window"].reindex(rows).to_numpy())
    return top, scored[[p in positives for p in keys]]
