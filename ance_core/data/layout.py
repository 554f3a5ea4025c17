"""Where a dataset folder's files are: its layout (BEIR or MS MARCO) told from its files, whether it holds queries and
qrels, and the qrels file of each split (data/sources.py resolves the folder; data/dataset.py loads it)."""

import os
from collections.abc import Callable
from pathlib import Path

from ance_core.errors import AnceError


def detect_format(folder: Path) -> str:
    if (folder / "corpus.jsonl").is_file():
        return "beir"
    if (folder / "collection.tsv").is_file():
        return "msmarco"
    for name in ("corpus.jsonl", "collection.tsv"):  # there, but not a file that can be read
        path = folder / name
        if path.is_dir():
            raise AnceError(f"{path}: a folder, not the corpus file")
        if path.is_symlink() and not path.exists():
            raise AnceError(f"{path}: a link to {os.readlink(path)}, which cannot be followed (missing, or a loop)")
        if path.exists():
            raise AnceError(f"{path}: not a regular file (a device or a pipe): give the corpus as a file")
    names = sorted(p.name for p in folder.glob("*"))
    packed = [name for name in names if name.startswith(("corpus.jsonl.", "collection.tsv."))]
    near = [name for name in names if name.lower() in ("corpus.jsonl", "corpus.json", "collection.tsv")]
    hint = (f"; it holds {packed[0]}: unpack it (e.g. gunzip) in place" if packed
            else f"; it holds {near[0]}: name it corpus.jsonl (one JSON object per line) or collection.tsv" if near
            else "")
    raise AnceError(f"{folder}: neither a BEIR folder (corpus.jsonl) nor MS MARCO (collection.tsv){hint}")


def has_labels(folder: Path, fmt: str = "auto") -> bool:
    """Whether a dataset folder holds queries and qrels beside its corpus (BEIR: queries.jsonl and a qrels/<split>.tsv;
    MS MARCO: a qrels.<split>.tsv, each with its queries.<split>.tsv); else it is a corpus to search only."""
    if (detect_format(folder) if fmt == "auto" else fmt) == "beir":
        return (folder / "queries.jsonl").is_file() and bool(beir_qrels(folder / "qrels"))
    splits = msmarco_splits(folder)
    return bool(splits) and all(queries.is_file() for _, _, queries in splits)


def beir_qrels(qrels: Path) -> list[Path]:
    """A BEIR folder's qrels/<split>.tsv files, without hidden files: macOS leaves `._<name>` files (AppleDouble
    metadata) beside each file it copies to a drive or zips, and one was read as a split `._test` that stopped the
    load."""
    return sorted(p for p in qrels.glob("*.tsv") if not p.name.startswith(".")) if qrels.is_dir() else []


def msmarco_splits(folder: Path) -> list[tuple[str, Path, Path]]:
    """(split, its qrels.<split>.tsv, its queries.<split>.tsv) of an MS MARCO folder, by file name."""
    splits = []
    for qrels in sorted(folder.glob("qrels.*.tsv")):
        split = qrels.name[len("qrels."):-len(".tsv")]
        splits.append((split, qrels, folder / f"queries.{split}.tsv"))
    return splits


def data_files(folder: Path) -> list[Path]:
    """The files a load of the folder may read (either layout's, where there; links followed, a linked qrels/ folder
    too), which its content digest hashes: not the rest of the folder (a work folder kept inside it, notes)."""
    files = [folder / "corpus.jsonl", folder / "queries.jsonl", *beir_qrels(folder / "qrels"),
             folder / "collection.tsv"]
    files += [path for _, qrels, queries in msmarco_splits(folder) for path in (qrels, queries)]
    return sorted(path for path in files if path.is_file())


def split_files(folder: Path, fmt: str = "auto") -> tuple[dict[str, Path], Callable[[str], Path]]:
    """The qrels file of each split of a dataset folder (BEIR: qrels/<split>.tsv; MS MARCO: qrels.<split>.tsv), and
    where a split of a given name would be read from."""
    if (detect_format(folder) if fmt == "auto" else fmt) == "beir":
        files = {p.stem: p for p in beir_qrels(folder / "qrels")}
        return files, lambda split: folder / "qrels" / f"{split}.tsv"
    return {split: qrels for split, qrels, _ in msmarco_splits(folder)}, lambda split: folder / f"qrels.{split}.tsv"
