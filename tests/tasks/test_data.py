"""The data stage's key: graded qrels carry the training-grades rule they are read with (each query's own top grade
since issue 30), binary qrels the key they had before it (their positives are the same under either rule)."""

from pathlib import Path

from ance_core.artifacts import stage_key
from ance_core.data.config import DataConfig
from ance_core.data.dataset import positive_grades
from ance_core.data.sources import dataset_digest
from tasks.data import prepare_data
from tests.tiny import write_beir


def _dataset(folder: Path, grades: tuple[int, ...]) -> Path:
    corpus = [{"_id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(12)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(6)]
    train = [(f"q{i}", f"d{i}", grades[i % len(grades)]) for i in range(6)]
    return write_beir(folder, corpus, queries, {"train": train, "test": [("q0", "d1", 1)]})


def test_only_graded_qrels_carry_the_grades_rule_in_the_data_key(tmp_path):
    binary, graded = _dataset(tmp_path / "binary", (1,)), _dataset(tmp_path / "graded", (1, 2))
    assert positive_grades(binary, "train") == {1} and positive_grades(graded, "train") == {1, 2}
    assert positive_grades(binary, "dev") == set()
    for folder, rule in ((binary, {}), (graded, {"grades_rule": "query-top"})):
        cfg = DataConfig(dataset=str(folder), dev_fraction=0.0)
        ref = prepare_data.fn(cfg, str(tmp_path / "work"))
        key_cfg = {"format": cfg.format, "dev": [cfg.train_split, cfg.dev_split, cfg.dev_fraction, cfg.dev_seed],
                   "train_min_relevance": "auto"} | rule
        assert Path(ref.path).name == stage_key("data", key_cfg, {"content": dataset_digest(folder)})
    # another dev fold is another split (in the key); fold 0, the default, keeps the keys of before
    folded = prepare_data.fn(DataConfig(dataset=str(binary), dev_fraction=0.5, dev_fold=1), str(tmp_path / "work"))
    key_cfg = {"format": "auto", "dev": ["train", "dev", 0.5, 0], "train_min_relevance": "auto", "dev_fold": 1}
    assert Path(folded.path).name == stage_key("data", key_cfg, {"content": dataset_digest(binary)})


def test_the_grades_are_read_from_the_qrels_file_the_loader_reads(tmp_path):
    """An MS MARCO folder (collection.tsv, qrels.train.tsv) with a stray BEIR-style qrels/train.tsv beside it: the
    loader reads qrels.train.tsv, so the grades (which key the data stage) come from it too, not from the stray file;
    with `format: beir` forced on a folder that holds both corpora, from qrels/train.tsv."""
    folder = tmp_path / "marco"
    (folder / "qrels").mkdir(parents=True)
    (folder / "collection.tsv").write_text("".join(f"d{i}\ttext {i}\n" for i in range(4)))
    (folder / "queries.train.tsv").write_text("q0\tquery 0\nq1\tquery 1\n")
    (folder / "qrels.train.tsv").write_text("q0\t0\td0\t1\nq1\t0\td1\t2\n")
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    assert positive_grades(folder, "train") == {1, 2}
    (folder / "corpus.jsonl").write_text("".join(f'{{"_id": "d{i}", "text": "text {i}"}}\n' for i in range(4)))
    assert positive_grades(folder, "train", "msmarco") == {1, 2}
    assert positive_grades(folder, "train", "beir") == {1}


def test_the_content_digest_hashes_the_files_a_load_reads(tmp_path):
    """A qrels/ folder that is a link is hashed through it: an edited qrels file is another data stage (rglob did not
    follow the link, and the stage of before was reused); a work folder kept inside the dataset's folder, its stages'
    manifests and tables, is not hashed (each run changed the digest, and the data stage was built again)."""
    folder = _dataset(tmp_path / "ds", (1,))
    (tmp_path / "judged").mkdir()
    (folder / "qrels").rename(tmp_path / "judged" / "qrels")
    (folder / "qrels").symlink_to(tmp_path / "judged" / "qrels", target_is_directory=True)
    before = dataset_digest(folder)
    (folder / "work" / "data" / "stage").mkdir(parents=True)
    (folder / "work" / "data" / "stage" / "manifest.json").write_text("{}")
    (folder / "work" / "run.tsv").write_text("q0\td0\t1\n")
    (folder / "notes.json").write_text("{}")
    assert dataset_digest(folder) == before
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td2\t1\n")
    assert dataset_digest(folder) != before
