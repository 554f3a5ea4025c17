"""What the evaluate and search commands look up from their arguments: the data of a split they evaluate, a TREC
run's metrics, the index that goes with a model, the passages' text."""

from pathlib import Path

TRAINING_WARNINGS = ("no dev split: ", "most training queries held out: ", "training positives are the ")


def training_free(body):
    """`body` (a command that trains nothing: bm25, evaluate, search) without the data stage's warnings about what a
    run would train on (every query, with no dev split carved; most queries held out; which graded pairs are
    positives): a training run's concern, noise here."""
    import warnings

    from ance_core.errors import AnceWarning

    def quiet():
        with warnings.catch_warnings():
            for said in TRAINING_WARNINGS:
                warnings.filterwarnings("ignore", message=said, category=AnceWarning)
            return body()

    return quiet


def evaluation_data(dataset: str, split: str, work_dir: str, checkpoint: Path | None = None):
    """The data of a command that only evaluates `split`: the pipeline's (its data stage reused). The split a
    pipeline chooses its result on (`dev`) is the dataset's own where it has one (MS MARCO's), and otherwise the one
    a pipeline carves from the training queries: carved as the run that trained `checkpoint` carved it (its
    data.dev_fraction, dev_seed, dev_fold), else with the defaults (the same queries as a run with the defaults).
    `train` is likewise the queries that run trained on."""
    import typer

    from ance_cli.app import preflight
    from ance_core.data.config import DataConfig

    defaults = DataConfig.model_fields
    traced = trained_data(checkpoint, dataset) if split in (defaults["dev_split"].default,
                                                          defaults["train_split"].default) else None
    if split != defaults["dev_split"].default:
        return DataConfig(**(traced.model_dump() if traced else {"dataset": dataset}) | {"eval_split": split})
    native = DataConfig(dataset=dataset, eval_split=split, dev_split=None)
    tables = preflight(native, work_dir, ())  # (bad data: one line, and no empty work folder left behind)
    if (tables.qrels["split"] == split).any():
        return native
    data = traced or DataConfig(dataset=dataset)  # (evaluated on `split`, the carved one: not its eval_split)
    if not (preflight(data, work_dir, ()).qrels["split"] == split).any():
        return data  # none carved (no training queries to carve it from): the caller's pre-flight says why
    typer.echo(f"split '{split}': carved from the '{data.train_split}' queries "
               + ("as the run that trained the checkpoint carved it" if traced else "with the defaults")
               + f" (data.dev_fraction {data.dev_fraction}, dev_seed {data.dev_seed}"
               + (f", dev_fold {data.dev_fold}" if data.dev_fold else "") + ")"
               + ("" if traced or not trained_on_data(checkpoint) else ": the data stage the checkpoint's run read is "
                  "gone from its work folder or holds another version of the dataset, so that run's carve is not "
                  "known"))
    return data


def trained_on_data(checkpoint: Path | None) -> bool:
    """Whether `checkpoint` is a training stage's (its manifest names the data stage it read)."""
    from ance_core.artifacts import read_manifest

    try:
        return checkpoint is not None and bool(read_manifest(checkpoint)["inputs"]["data"])
    except (OSError, KeyError, TypeError, ValueError):
        return False


def trained_data(checkpoint: Path | None, dataset: str):
    """The data settings of the run that trained `checkpoint` (the data stage its training read, in the checkpoint's
    own work folder), when that stage holds `dataset` as it is now; None otherwise (no checkpoint; a pretrained,
    initial or exported model; a stage moved or collected; another dataset, or this one edited since)."""
    from ance_core.artifacts import read_manifest
    from ance_core.data.sources import dataset_digest, resolve_dataset
    from ance_core.errors import AnceError
    from tasks.data import stage_data_config

    if checkpoint is None:
        return None
    try:
        stage = Path(checkpoint).resolve().parent.parent / "data" / read_manifest(checkpoint)["inputs"]["data"]
        held = read_manifest(stage)["inputs"]["content"]
        now = dataset_digest(resolve_dataset(dataset, download=False))
    except (OSError, KeyError, TypeError, ValueError, AnceError):
        return None
    return stage_data_config(stage, dataset) if held == now else None


def say_training_split(data, tables, split: str) -> None:
    """Scoring the train split of a dataset with a dev split: say that its queries are those a pipeline trains on,
    the dev split's left out (carved from the train split, or the dataset's own), not every query of the file."""
    import typer

    if split != data.train_split or data.dev_split is None or not (tables.qrels["split"] == data.dev_split).any():
        return
    n = tables.qrels.loc[tables.qrels["split"] == split, "query_id"].nunique()
    n_dev = tables.qrels.loc[tables.qrels["split"] == data.dev_split, "query_id"].nunique()
    typer.echo(f"split '{split}': its {n:,} queries that train, as a pipeline's runs split them (the dev split "
               f"'{data.dev_split}', {n_dev:,} queries, left out)")


def score_run(path: Path, dataset: str, split: str, work_dir: str, relevant_grade: int = 1) -> dict:
    """A TREC run's metrics on a split, as the pipeline computes them (identical ids dropped, as in BEIR;
    `relevant_grade`: EvalConfig's)."""
    from ance_cli.app import preflight
    from ance_core.errors import AnceError, warn
    from ance_core.retrieval.config import EvalConfig
    from ance_core.retrieval.evaluate import evaluate_run, identical_ids_rule, without_identical_ids
    from ance_core.retrieval.search import read_trec

    run = read_trec(path)  # a malformed file fails before the data is read
    data = evaluation_data(dataset, split, work_dir)
    tables = preflight(data, work_dir, (split,), doc_ids=True, relevant_grade=relevant_grade,
                       grade_setting="--relevant-grade")
    qrels = tables.split_qrels(split)  # (a split it lacks: one line naming its file)
    say_training_split(data, tables, split)
    judged, ran = set(qrels["query_id"]), set(run["query_id"])
    if not judged & ran:
        raise AnceError(f"{path}: none of its {len(ran):,} queries (e.g. {sorted(ran)[:3]}) is a judged query of "
                        f"split '{split}' of {dataset} ({len(judged):,}, e.g. {sorted(judged)[:3]}): a run of "
                        "another split or collection?")
    if len(judged - ran):
        warn(f"{path} ranks {len(judged & ran):,} of the {len(judged):,} judged queries of split '{split}': the other "
             f"{len(judged - ran):,} count as zero (e.g. {sorted(judged - ran)[:3]})")
    if len(ran - judged):
        warn(f"{path}: {len(ran - judged):,} of its {len(ran):,} queries are not judged queries of split '{split}' "
             f"and are not scored (e.g. {sorted(ran - judged)[:3]})")
    ranked = run["doc_id"].drop_duplicates()  # (a hash of the corpus's ids, not a Python set of millions)
    unknown = sorted(ranked[~ranked.isin(tables.corpus["doc_id"])])
    if len(unknown) == len(ranked):
        raise AnceError(f"{path}: none of its {len(ranked):,} document ids (e.g. {unknown[:3]}) is in the corpus of "
                        f"{dataset} (e.g. {tables.corpus['doc_id'].head(3).tolist()}): a run of another collection?")
    if unknown:
        warn(f"{path}: {len(unknown):,} of its {len(ranked):,} document ids are not in the corpus of {dataset} and "
             f"count as not relevant (e.g. {unknown[:3]})")
    if identical_ids_rule(EvalConfig(), tables.qrels).ignore_identical_ids:
        run = without_identical_ids(run)
    return evaluate_run(run, qrels, relevant_grade)[0]


def index_of(model: Path, index: Path | None, dataset: str | None = None) -> Path:
    """The index to search `model` with: `index`, refused when its manifests say it holds another checkpoint's
    encoding (its scores would mean nothing); without one, the newest exact index of the model's encoding in the work
    folder the model is a stage of, of `dataset`'s corpus (as it is now), or without one of the corpus the model was
    trained on (where the manifests say: a model evaluated on other collections has their indexes too)."""
    from ance_core.errors import AnceError, warn
    from ance_core.modeling.model import checkpoint_files
    from ance_core.retrieval.index import is_index_folder
    from ance_core.retrieval.provenance import CheckpointMatch, index_checkpoint, indexes_of, work_folder_of

    if index is None:
        checkpoint_files(model)  # (a damaged one said first)
        work = work_folder_of(model)
        if not (work / "index").is_dir():
            raise AnceError(f"--index: {model} is no stage of a work folder, so its index cannot be found; give one "
                            "with --index (an index folder of its encoding, e.g. work/index/<digest> after ance "
                            "evaluate --checkpoint; a compressed model's: the index_path of its row in "
                            "work/compression/<digest>/compression.json)")
        if not (found := indexes_of(model, work)):
            raise AnceError(f"--index: no index of {model}'s encoding in {work / 'index'}; give one with --index")
        return _of_corpus(found, model, work, dataset)
    if not is_index_folder(index):
        raise AnceError(f"{index}: not an index folder (no faiss 'index' file, no 'index-part-*' parts, no "
                        "'flat.json' with its emb_*.npy shards)")
    work = index.resolve().parent.parent
    if (built := index_checkpoint(index)) is None:
        warn(f"--index {index}: which checkpoint encoded it is not recorded (no manifests of its encoding in the "
             "work folder beside it): if not --model, its scores mean nothing")
    elif CheckpointMatch(model, work)(built) is False:
        if ours := indexes_of(model, work):
            try:
                ours = [_of_corpus(ours, model, work, dataset)]
            except AnceError:  # (none of --dataset's corpus: its other ones)
                pass
        raise AnceError(f"--index {index} holds the encoding of checkpoint {built}, not of --model {model}: its "
                        "scores would mean nothing; " + (f"this model's index is {ours[0]}" if ours else
                                                         "encode the corpus with this model first"))
    return index


def _of_corpus(found: list[Path], model: Path, work: Path, dataset: str | None) -> Path:
    """Of `found` (a model's indexes, best first), the first of `dataset`'s corpus; without `dataset`, of the corpus
    the model's training read, else the first."""
    from ance_core.artifacts import read_manifest
    from ance_core.data.dataset import corpus_rows
    from ance_core.data.sources import dataset_digest, resolve_dataset
    from ance_core.errors import AnceError
    from ance_core.retrieval.provenance import corpus_content, data_content, document_set, holds_documents

    if len(found) == 1:  # (a wrong --dataset is said by the hits' check: the model's one index holds another corpus)
        return found[0]
    if dataset is not None:
        wanted = dataset_digest(resolve_dataset(dataset, download=False))
    else:
        try:
            wanted = data_content(work / "data" / read_manifest(model)["inputs"]["data"])
        except (OSError, KeyError, TypeError, ValueError):  # (not a training stage)
            return found[0]
        if wanted is None:  # (its data stage is gone)
            return found[0]
    if ours := [index for index in found if corpus_content(index) == wanted]:
        return ours[0]
    if dataset is None:
        return found[0]
    # (the same corpus in another folder: a corpus-only copy, or the dataset with its queries edited since)
    ids = document_set(row[0] for row in corpus_rows(resolve_dataset(dataset, download=False))[1])
    if ours := [index for index in found if holds_documents(index, ids)]:
        return ours[0]
    raise AnceError(f"--dataset {dataset}: none of the {len(found)} index{'es' * (len(found) > 1)} of {model}'s "
                    f"encoding in {work / 'index'} holds its corpus's documents (another collection's, or this one's "
                    f"before an edit): encode it with `ance evaluate --checkpoint {model} --dataset {dataset} "
                    f"--work-dir {work}` (a collection with queries and qrels), or give --index")


def corpus_titles(dataset: str, doc_ids: list[str]) -> dict[str, str]:
    """The passages (title and text, joined as the encoder reads them) of `doc_ids` in `dataset`'s corpus, read a row
    at a time: memory holds those documents' texts and the corpus's ids, not its texts (the whole corpus as a table, to
    print ten hits, was ~3 GB of text at MS MARCO's size)."""
    import pandas as pd

    from ance_core.data.dataset import corpus_rows, passage_texts
    from ance_core.data.sources import resolve_dataset

    wanted = set(doc_ids)
    found = pd.DataFrame([row for row in corpus_rows(resolve_dataset(dataset, download=False))[1] if row[0] in wanted],
                         columns=["doc_id", "title", "text"])
    return dict(zip(found["doc_id"], passage_texts(found), strict=True))


def model_work_dir(model: Path) -> str:
    """The work folder a checkpoint is a stage folder of (<work>/<stage>/<key>, beside its data and latest.json);
    ./work for a checkpoint elsewhere."""
    model = model.resolve()
    work = model.parent.parent
    stage = (model / "manifest.json").is_file() and any((work / name).exists() for name in ("runs", ".locks"))
    return str(work) if stage else "work"


def check_same_corpus(index: Path, data, dataset: str) -> None:
    """BM25 over `dataset`'s corpus fused with an index of another corpus would interleave two collections' documents:
    refused unless the index holds exactly the corpus's documents."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ance_core.artifacts import INDEX_DOCIDS, id_lines
    from ance_core.data.corpus import ParquetCorpus
    from ance_core.errors import AnceError
    from ance_core.retrieval.provenance import encoded_corpus

    # (arrow arrays, not Python sets: millions of ids; a MaxP index lists a document once per window)
    held = pc.unique(pa.array(id_lines(index / INDEX_DOCIDS), pa.string()))
    corpus = pq.read_table(ParquetCorpus.of_folder(data.path).path, columns=["doc_id"])["doc_id"]  # (ids unique)
    common = pc.sum(pc.is_in(held, value_set=corpus)).as_py() or 0

    def documents(n: int) -> str:
        return f"{n:,} document{'s' * (n != 1)}"

    if not common == len(held) == len(corpus):
        raise AnceError(f"--dataset {dataset}: its corpus ({documents(len(corpus))}) is not the one the index {index} "
                        f"holds ({documents(len(held))}, {common:,} of them in {dataset}): give the dataset the "
                        "model's run encoded")
    if (encoded := encoded_corpus(index)) is None or encoded.resolve() == Path(data.path).resolve():
        return  # (nothing to compare with, or the very stage folder)
    ends = min(TEXT_SAMPLE // 2, len(held))  # the first and the last documents: two row groups of each corpus to read
    sample = sorted(set(held[:ends].to_pylist()) | set(held[len(held) - ends:].to_pylist()))
    _compare_texts(encoded, index, dict(zip(*texts_of(Path(data.path), sample), strict=True)), dataset)


TEXT_SAMPLE = 64  # documents whose text --hybrid compares between --dataset and the corpus the index was encoded from


def texts_of(folder: Path, doc_ids: list[str]) -> tuple[list[str], list[str]]:
    """(doc ids, passage texts) of those of these documents a data (or corpus) stage folder holds, read by row: the
    id column and the row groups that hold them, not the corpus's whole text."""
    import numpy as np

    from ance_core.data.corpus import ParquetCorpus

    corpus = ParquetCorpus.of_folder(folder)
    rows = corpus.rows_of(doc_ids)
    order = np.argsort(rows, kind="stable")
    order = order[rows[order] >= 0]  # (ids it lacks left out)
    ids, texts = [doc_ids[i] for i in order], []
    for _, batch in corpus.passages(rows[order]):
        texts += batch
    return ids, texts


def check_same_texts(index: Path, texts: dict[str, str], dataset: str) -> None:
    """Documents of --dataset whose text is not the text the index's encoding was made from (the same ids, another
    collection's or another version's texts): refused, naming one. Not told when the index's data stage is gone."""
    from ance_core.retrieval.provenance import encoded_corpus

    if (encoded := encoded_corpus(index)) is not None:  # (None: the index's data stage is gone, or unsaid)
        _compare_texts(encoded, index, texts, dataset)


def _compare_texts(encoded: Path, index: Path, texts: dict[str, str], dataset: str) -> None:
    """`check_same_texts` against `encoded`, the data stage folder the index's encoding read."""
    from ance_core.errors import AnceError

    theirs = dict(zip(*texts_of(encoded, list(texts)), strict=True))
    differ = [d for d, text in texts.items() if d in theirs and theirs[d] != text]
    if differ:
        raise AnceError(f"--dataset {dataset}: {len(differ)} of {len(texts)} documents compared hold other texts than "
                        f"the corpus the index {index} was encoded from (e.g. '{differ[0]}': "
                        f"{texts[differ[0]][:60]!r} against {theirs[differ[0]][:60]!r}): give the dataset the "
                        "model's run encoded")
