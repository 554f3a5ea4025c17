"""What a pipeline run checks of a collection before any work: something to train on, a negative for every training
query, and evaluation queries that neither train nor choose (the CLI's pre-flight and the flow's first stage)."""

from pathlib import Path

from ance_core.data.dataset import QUERY_TOP_GRADE, Dataset, qrels_file
from ance_core.errors import DataError, preview, warn


def check_trainable(tables: Dataset, folder: Path, split: str, negatives: int = 0, fmt: str = "auto") -> None:
    """A pipeline run trains on `split`'s positives: without any (every grade 0, or below train_min_relevance) it
    is refused before any work, naming the file and the split. `negatives`: how many negatives mining draws per pair;
    a query with fewer documents that are not relevant to it (every document relevant, a one-document corpus) is
    refused too, naming it, rather than failing the mining after BM25 and a corpus encoding (the check reads the
    corpus's doc ids: `read_tables(..., corpus_columns=["doc_id"])`). `fmt`: the folder's layout (`data.format`), for
    the file the error names."""
    positives = tables.positives(split)
    if not positives:
        grade = tables.min_relevance.get(split, 1)
        grade = 1 if grade == QUERY_TOP_GRADE else grade
        raise DataError(qrels_file(folder, split, fmt), f"split '{split}' has no positive (no qrels row of "
                        f"relevance >= {grade}): nothing to train on")
    if negatives <= 0:
        return
    corpus, relevant = set(tables.corpus["doc_id"]), tables.relevant(split)
    short = {q: len(corpus) - len((relevant.get(q, set()) | docs) & corpus) for q, docs in positives.items()}
    short = {q: n for q, n in sorted(short.items()) if n < negatives}
    if short:
        q, left = next(iter(short.items()))
        raise DataError(qrels_file(folder, split, fmt), f"{len(short)} '{split}' queries have fewer than {negatives} "
                        f"documents that are not relevant to them, so no negative can be mined ({preview(list(short))}"
                        f"; '{q}': {left} of the corpus's {len(corpus)}): add documents that are not relevant to them "
                        "or remove those queries from the training qrels"
                        + (", or lower mining.num_negatives and bm25_negatives.num_negatives" if negatives > 1 else ""))


def warn_shared_queries(tables: Dataset, eval_split: str, *training: str | None) -> None:
    """A warning for each split that trains or chooses (train, dev) and holds queries of the evaluation split: the
    run's figures on it would be inflated. Names how many and the first ids."""
    splits = set(tables.qrels["split"])
    evaluated = set(tables.qrels.loc[tables.qrels["split"] == eval_split, "query_id"])
    for split in dict.fromkeys(s for s in training if s and s != eval_split and s in splits):
        shared = sorted(evaluated & set(tables.qrels.loc[tables.qrels["split"] == split, "query_id"]))
        if shared:
            warn(f"{len(shared)} of the {len(evaluated)} '{eval_split}' queries are also '{split}' queries "
                 f"({preview(shared)}): the run trains or chooses on them, so its '{eval_split}' figures are "
                 "inflated; use splits with distinct queries")
