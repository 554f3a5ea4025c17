"""Which queries a run trains on: the dev split carved from the training queries (model selection and recipe
choices), and the lowest relevance grade that counts as a training positive."""

import hashlib
from dataclasses import replace

from ance_core.data.dataset import QUERY_TOP_GRADE, Dataset
from ance_core.errors import AnceError, warn


def with_dev_split(dataset: Dataset, train_split: str, dev_split: str | None, fraction: float, seed: int,
                   fold: int = 0) -> Dataset:
    """The dataset with a dev split for model selection and recipe choices.

    A dataset that has a split named `dev_split` keeps it, and its queries are not trained on: their rows of the train
    split (a query in both files) are left out, with a warning naming them. Otherwise about `fraction` of the train
    split's queries that have a positive (relevance > 0) move to a new split `dev_split`, with all their qrels: they
    are no longer trained on. Each query moves when sha256(seed, query id), read as a number in [0, 1), is below
    `fraction`: its membership depends on nothing else, so adding queries to a dataset never moves the others, and
    seeds give independent splits. `fold` i moves those whose number is in [i * fraction, (i + 1) * fraction) instead:
    the folds are disjoint dev splits of the same size (cross-validation), fold 0 the default one.
    """
    splits = set(dataset.qrels["split"])
    if dev_split is not None and dev_split in splits and train_split in splits and train_split != dev_split:
        return _without_dev_queries(dataset, train_split, dev_split)
    if dev_split is None or dev_split in splits or fraction <= 0 or train_split not in splits:
        return dataset
    train = dataset.split_qrels(train_split)
    candidates = sorted(set(train.loc[train["relevance"] > 0, "query_id"]))
    low, high = fold * fraction, (fold + 1) * fraction
    dev = {q for q in candidates if low <= _unit_hash(seed, q) < high}
    n_dev = len(dev)
    if not candidates:  # a train split with no positive: refused by the checks that follow, without this warning
        return dataset
    if n_dev == 0 or n_dev == len(candidates):
        which = f"{fraction}{f' (fold {fold})' if fold else ''}"
        warn(f"no dev split: data.dev_fraction {which} of the {len(candidates)} '{train_split}' queries with a "
             f"positive leaves {'no dev' if n_dev == 0 else 'no training'} queries, so all of them are trained on and "
             f"the run's result is its last model (add a '{dev_split}' split to the dataset, or more queries)")
        return dataset
    if fraction > 0.5 and n_dev > len(candidates) - n_dev:  # (0.9 for 0.1: a typo as likely as a choice)
        warn(f"most training queries held out: data.dev_fraction {fraction} makes {n_dev} of the {len(candidates)} "
             f"'{train_split}' queries with a positive the dev split, which chooses the result, and leaves "
             f"{len(candidates) - n_dev} to train on (a dev split is usually 0.2-0.3 of them)")
    moved = (dataset.qrels["split"] == train_split) & dataset.qrels["query_id"].isin(dev)
    qrels = dataset.qrels.copy()
    qrels.loc[moved, "split"] = dev_split
    return Dataset(dataset.corpus, dataset.queries, qrels)


def fold_count(fraction: float) -> int:
    """How many disjoint dev folds of `fraction` the training queries hold (`data.dev_fold` 0 .. this - 1); unless
    1 / fraction is whole, the last (1 - count * fraction) of them are never in one."""
    return int(1 / fraction + 1e-9) if fraction > 0 else 0


def _without_dev_queries(dataset: Dataset, train_split: str, dev_split: str) -> Dataset:
    """The dataset without the train rows of the queries its own dev split holds (they would choose the run's result
    and the champion on queries the models trained on)."""
    dev = set(dataset.split_qrels(dev_split)["query_id"])
    shared = (dataset.qrels["split"] == train_split) & dataset.qrels["query_id"].isin(dev)
    if not shared.any():
        return dataset
    ids = sorted(set(dataset.qrels.loc[shared, "query_id"]))
    warn(f"{len(ids)} queries of the '{dev_split}' split are in the '{train_split}' split too "
         f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}): they are not trained on (a model is chosen on "
         "them)")
    return Dataset(dataset.corpus, dataset.queries, dataset.qrels.loc[~shared].reset_index(drop=True))


def _unit_hash(seed: int, query_id: str) -> float:
    """A number in [0, 1) that depends only on (seed, query id)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\t{query_id}".encode()).digest()[:8], "big") / 2**64


def with_training_grades(dataset: Dataset, train_split: str, min_relevance: int | str) -> Dataset:
    """The dataset with the rule that says which relevant pairs of the train split are training positives.

    "auto": each query's own top grade (QUERY_TOP_GRADE); on binary qrels that is every positive. It serves both
    shapes graded collections come in: many weak links per query (NFCorpus: 96% of its training pairs are grade-1
    "indirect" links; trained on as positives they pull the model away from what the top grade means) keep only their
    strong ones, and a collection of few queries whose top grade is rare (four grades, "complete answer" for a few
    queries) keeps every query, each with its best documents (a collection-wide top grade left most of such queries
    with no positive). An integer: every pair of at least that grade, for all queries. Lower grades are never sampled
    as negatives either way. One warning says what was left out."""
    if train_split not in set(dataset.qrels["split"]):
        return dataset
    train = dataset.split_qrels(train_split)
    grades = sorted(set(train.loc[train["relevance"] > 0, "relevance"]))
    if min_relevance == "auto":
        if len(grades) < 2:
            return replace(dataset, min_relevance={train_split: 1})
        graded = replace(dataset, min_relevance={train_split: QUERY_TOP_GRADE})
        relevant = train[train["relevance"] > 0]
        kept = sum(len(d) for d in graded.positives(train_split).values())
        top = relevant.groupby("query_id")["relevance"].max().value_counts().sort_index(ascending=False)
        warn(f"training positives are the {kept} '{train_split}' pairs at each query's own top grade (graded qrels, "
             f"grades {', '.join(map(str, grades))}; queries by their top grade: "
             f"{', '.join(f'{g}: {n}' for g, n in top.items())}); the other {len(relevant) - kept} relevant pairs "
             f"({100 * (1 - kept / len(relevant)):.0f}%) are not trained on as positives, nor sampled as negatives; "
             f"set data.train_min_relevance: {grades[0]} to train on every relevant pair")
        return graded
    grade = int(min_relevance)
    if grades and grade > grades[0]:
        relevant = train[train["relevance"] > 0]
        kept = relevant[relevant["relevance"] >= grade]
        lost = set(relevant["query_id"]) - set(kept["query_id"])
        if kept.empty:
            raise AnceError(f"data.train_min_relevance {grade}: no pair of the '{train_split}' split has that grade "
                            f"(grades: {', '.join(map(str, grades))})")
        warn(f"training positives are the {len(kept)} '{train_split}' pairs of relevance >= {grade}; the other "
             f"{len(relevant) - len(kept)} relevant pairs ({100 * (1 - len(kept) / len(relevant)):.0f}%, grades "
             f"{', '.join(str(g) for g in grades if g < grade)}) are not trained on as positives, nor sampled as "
             f"negatives, and {len(lost)} queries have no training positive left; set data.train_min_relevance: "
             f"{grades[0]} to train on every relevant pair, or auto for each query's own top grade")
    return replace(dataset, min_relevance={train_split: grade})
