"""Retrieval metrics with ir_measures (trec_eval): nDCG@10, RR@10 (MRR@10), R@100, R@1000 (the last three count a
document relevant from grade 1, or from `eval.relevant_grade`: TREC Deep Learning's passage collections use 2).

Metric keys avoid '@' (MLflow refuses it): ndcg_at_10, mrr_at_10, recall_at_100, recall_at_1000.
Queries of the split that the run does not cover count as zero, not as missing. Hits of equal score are ranked as
trec_eval ranks them (the greater document id first) by every metric: ir_measures computes RR@10 with another provider,
which broke ties the other way (nDCG@10 and MRR@10 of one run then described two rankings).
"""

from pathlib import Path

import ir_measures
import pandas as pd
from ir_measures import RR, R, nDCG

from ance_core.artifacts import METRICS, PER_QUERY, RUN_TREC, write_json
from ance_core.errors import warn
from ance_core.retrieval.search import write_trec


def measures(relevant_grade: int = 1) -> dict:
    """The metrics by key; `relevant_grade`: the lowest grade RR@10 and R@k count as relevant (trec_eval's -l; nDCG@10
    gains by the grades themselves)."""
    rel = {} if relevant_grade == 1 else {"rel": relevant_grade}
    return {"ndcg_at_10": nDCG @ 10, "mrr_at_10": RR(**rel) @ 10, "recall_at_100": R(**rel) @ 100,
            "recall_at_1000": R(**rel) @ 1000}


MEASURES = measures()
_NAMES = {str(m): k for k, m in MEASURES.items()}
CUTOFFS = {"nDCG@10": 10, "MRR@10": 10, "R@100": 100, "R@1000": 1000}


def warn_shallow(depths: dict[str, int]) -> None:
    """One warning per setting (`eval.top_k`, `bm25.top_k`: the depth of the runs it scores) shallower than a
    metric's cutoff: that column reads the metric at the run's depth (R@1000 of a 100-deep run is its R@100)."""
    for setting, depth in depths.items():
        if cut := [name for name, cutoff in CUTOFFS.items() if depth < cutoff]:
            warn(f"{setting} is {depth}: the runs it scores hold {depth} documents a query, so {', '.join(cut)} "
                 f"read{'s' if len(cut) == 1 else ''} the metric at {depth} (set it to at least "
                 f"{max(CUTOFFS[c] for c in cut)} for the columns as named)")


def nested(query_ids: pd.Series, doc_ids: pd.Series, values: list) -> dict[str, dict]:
    """{query: {doc: value}}, the form trec_eval takes. Built here from plain lists: given DataFrames, ir_measures
    builds it once per provider by iterating the rows as named tuples, 8x slower (3.2 s of a 300-query, 1000-deep
    evaluation's 3.7 s on an AVX2 EPYC; the same values)."""
    out: dict[str, dict] = {}
    for q, d, v in zip(query_ids.astype(str).tolist(), doc_ids.astype(str).tolist(), values, strict=True):
        out.setdefault(q, {})[d] = v
    return out


def _trec_keys(run: pd.DataFrame) -> pd.DataFrame:
    """The run's (q, s, d) as text and float, sorted as `trec_order` ranks them (indexed as the run)."""
    keys = pd.DataFrame({"q": run["query_id"].astype(str), "s": run["score"].astype(float),
                         "d": run["doc_id"].astype(str)}, index=run.index)
    return keys.sort_values(["q", "s", "d"], ascending=[True, False, False], kind="stable")


def trec_order(run: pd.DataFrame) -> pd.DataFrame:
    """The run best first per query as trec_eval ranks it: by score, equal scores by document id, the greater first."""
    return run.loc[_trec_keys(run).index]


def trec_ranked(run: pd.DataFrame) -> pd.DataFrame:
    """The run in `trec_order`, its `rank` numbered in that order (1 first); a document listed twice for a query is
    ranked where it scored best (trec_eval refuses such a run; a later copy would otherwise replace the first)."""
    keys = _trec_keys(run)
    keys = keys[~keys.duplicated(["q", "d"])]
    return run.loc[keys.index].assign(rank=keys.groupby("q", sort=False).cumcount() + 1)


def per_query_metrics(run: pd.DataFrame, qrels: pd.DataFrame, relevant_grade: int = 1) -> pd.DataFrame:
    """One row per query of the qrels: query_id and one column per metric (every metric on the one ranking:
    `trec_order`'s, given as strictly decreasing scores; `relevant_grade`: see `measures`)."""
    return _per_query(trec_ranked(run), qrels, relevant_grade)


def _per_query(ranked: pd.DataFrame, qrels: pd.DataFrame, relevant_grade: int = 1) -> pd.DataFrame:
    """`per_query_metrics` of a run `trec_ranked` already."""
    judged = nested(qrels["query_id"], qrels["doc_id"], qrels["relevance"].astype(int).tolist())
    scores = nested(ranked["query_id"], ranked["doc_id"], (-ranked["rank"].astype(float)).tolist())
    chosen = measures(relevant_grade)
    names = {str(m): k for k, m in chosen.items()}
    values = [
        (m.query_id, names[str(m.measure)], float(m.value))
        for m in ir_measures.iter_calc(list(chosen.values()), judged, scores)
    ]
    table = pd.DataFrame(values, columns=["query_id", "metric", "value"])
    table = table.pivot(index="query_id", columns="metric", values="value")
    all_queries = pd.Index(sorted(qrels["query_id"].astype(str).unique()), name="query_id")  # nested's str ids
    return table.reindex(all_queries).fillna(0.0)[list(MEASURES)].reset_index()


def aggregate(per_query: pd.DataFrame) -> dict[str, float]:
    return {k: float(per_query[k].mean()) for k in MEASURES}


def evaluate_run(run: pd.DataFrame, qrels: pd.DataFrame, relevant_grade: int = 1
                 ) -> tuple[dict[str, float], pd.DataFrame]:
    per_query = per_query_metrics(run, qrels, relevant_grade)
    return aggregate(per_query), per_query


def own_id_judgements(qrels: pd.DataFrame) -> pd.DataFrame:
    """The qrels rows that judge a document relevant to the query of the same id. BEIR's `ignore_identical_ids` is
    for collections whose queries are documents too (ArguAna, Quora), where such a pair is never judged; where one is,
    the query ids and the document ids are two numberings (a classic collection's query 7 and document 7), and
    dropping a hit by its id would drop a relevant document."""
    relevant = qrels[qrels["relevance"] > 0]
    return relevant[relevant["query_id"].astype(str) == relevant["doc_id"].astype(str)]


def identical_ids_rule(cfg, qrels: pd.DataFrame):
    """`cfg` (an EvalConfig) as it applies to a collection with these qrels (every split's): identical ids are not
    dropped where the qrels judge a document relevant to the query of its id (`own_id_judgements`), and that is said
    once. Returns the config to evaluate with."""
    if not cfg.ignore_identical_ids or (own := own_id_judgements(qrels)).empty:
        return cfg
    first = own.iloc[0]
    print(f"evaluation: {len(own):,} qrels judge a document relevant to the query of the same id (e.g. query "
          f"'{first['query_id']}' and document '{first['doc_id']}', split {first['split']}): the collection numbers "
          "its queries and documents apart, so no hit is dropped for having its query's id (eval.ignore_identical_ids "
          "is for collections whose queries are documents too: ArguAna, Quora)")
    return cfg.model_copy(update={"ignore_identical_ids": False})


def without_identical_ids(run: pd.DataFrame) -> pd.DataFrame:
    """The run without hits whose document id is the query's id (BEIR's `ignore_identical_ids`): the ranks of the
    hits below move up."""
    same = run["query_id"].astype(str) == run["doc_id"].astype(str)
    if not same.any():
        return run
    kept = run[~same].reset_index(drop=True)
    if "rank" in kept:
        kept["rank"] = kept.sort_values("rank", kind="stable").groupby("query_id").cumcount() + 1
    return kept


def write_evaluation(run: pd.DataFrame, qrels: pd.DataFrame, out: Path, tag: str,
                     ignore_identical_ids: bool = False, relevant_grade: int = 1) -> dict[str, float]:
    """metrics.json, per_query.parquet and the TREC run file (the run evaluated) of one evaluation, into `out`."""
    if ignore_identical_ids:
        run = without_identical_ids(run)
    run = trec_ranked(run)  # the TREC file lists the ranking evaluated, in its order (sorted once)
    per_query = _per_query(run, qrels, relevant_grade)
    metrics = aggregate(per_query)
    per_query.to_parquet(out / PER_QUERY, index=False)
    write_trec(run, out / RUN_TREC, tag)
    write_json(out / METRICS, metrics)
    return metrics
