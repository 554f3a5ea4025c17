"""Which checkpoint's encoding an index stage folder holds, told from the stage manifests (index -> encode ->
checkpoint): what `ance search` reads to pick a model's own index and to refuse another model's."""

import ast
import itertools
import json
import re
from collections.abc import Iterable
from pathlib import Path

from ance_core.artifacts import INDEX_DOCIDS, file_digest, read_manifest
from ance_core.modeling.model import HEAD_FILE, checkpoint_digest, checkpoint_ref


def index_checkpoint(index: str | Path) -> str | None:
    """The digest of the checkpoint whose encoding an index stage folder holds, read from the stage manifests (index
    -> encode -> checkpoint; a compressed encoding's index -> compress stage, whose `model` is the checkpoint, named
    by its content); None when they do not say (a folder moved out of its work folder)."""
    index = Path(index).resolve()
    try:
        embeddings = read_manifest(index)["inputs"]["embeddings"]
        if (compressed := index.parent.parent / "compress" / embeddings / "model").is_dir():
            return checkpoint_digest(compressed)
        return read_manifest(index.parent.parent / "encode" / embeddings)["inputs"]["checkpoint"]
    except (OSError, KeyError, TypeError, ValueError):
        return None


def work_folder_of(model: str | Path) -> Path:
    """The work folder a checkpoint is a stage of: <work>/<stage>/<key>, or a compressed model's
    <work>/compress/<key>/model (the folder two levels up where it is neither)."""
    model = Path(model).resolve()
    if model.name == "model" and model.parent.parent.name == "compress":
        return model.parent.parent.parent
    return model.parent.parent


def encoded_corpus(index: str | Path) -> Path | None:
    """The data (or corpus) stage folder whose corpus an index stage folder's encoding holds, read from the stage
    manifests (index -> encode -> data); None when they do not say or the folder is gone (gc, a moved index)."""
    index = Path(index).resolve()
    try:
        embeddings = read_manifest(index)["inputs"]["embeddings"]
        data = read_manifest(index.parent.parent / "encode" / embeddings)["inputs"]["data"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    found = [f for f in (index.parent.parent / stage / data for stage in ("data", "corpus"))
             if (f / "corpus.parquet").is_file()]
    return found[0] if found else None


def corpus_content(index: str | Path) -> str | None:
    """The content digest of the collection whose corpus an index stage folder's encoding holds (its data or corpus
    stage's input, `dataset_digest` of the dataset folder as it was read); None when the manifests do not say."""
    return None if (folder := encoded_corpus(index)) is None else data_content(folder)


def data_content(folder: str | Path) -> str | None:
    """The content digest of the collection a data (or corpus) stage folder read (`dataset_digest`); None when its
    manifest does not say or the folder is gone."""
    try:
        return read_manifest(folder)["inputs"]["content"]
    except (OSError, KeyError, TypeError, ValueError):
        return None


def document_set(doc_ids: Iterable[str], chunk: int = 1 << 16):
    """The distinct ids of `doc_ids` as an arrow array, read a chunk at a time: 2M ids of 8 characters held 131 MB as a
    list of Python strings, 24 MB as arrow strings (MS MARCO has 8.8M)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, chunks = iter(doc_ids), []
    while batch := list(itertools.islice(ids, chunk)):
        chunks.append(pc.unique(pa.array(batch, pa.string())))
    return pc.unique(pa.chunked_array(chunks, pa.string()))


def holds_documents(index: str | Path, wanted) -> bool:
    """Whether an index holds exactly the documents of `wanted` (`document_set`'s; a MaxP index lists a document once
    per window)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:  # (split by arrow: the index's ids never a Python list; on "\n" alone, as id_lines)
        text = (Path(index) / INDEX_DOCIDS).read_text(encoding="utf-8").removesuffix("\n")
    except OSError:  # (a folder removed meanwhile, or no index's)
        return False
    held = pc.unique(pc.list_flatten(pc.split_pattern(pa.array([text], pa.large_string()), "\n")))
    return len(held) == len(wanted) and bool(pc.all(pc.is_in(held, value_set=wanted)).as_py())


class CheckpointMatch:
    """Whether a checkpoint digest (a stage input: a training stage's key, or another folder's content digest) names the
    checkpoint folder `model`: True, False, or None when it cannot be told (a folder unreadable). A stage folder is
    told by its key alone; a copy (a registered or exported model) by content: its digest, or the content of the stage
    folder the digest names, comparing the small head file before the weights, so that a work folder of many
    checkpoints is not hashed whole."""

    def __init__(self, model: str | Path, work: Path):
        self.model, self.work = Path(model).resolve(), work
        self.key = checkpoint_ref(self.model).digest
        self.is_stage = self.key == self.model.name
        self._told: dict[str, bool | None] = {}

    def __call__(self, digest: str) -> bool | None:
        if digest == self.key:
            return True
        if self.is_stage:  # another key: another stage's checkpoint
            return False
        if digest not in self._told:
            self._told[digest] = self._same_content(digest)
        return self._told[digest]

    def _same_content(self, digest: str) -> bool | None:
        folders = [f for f in self.work.glob(f"*/{digest}") if (f / "model.safetensors").is_file()]
        if not folders:  # another content digest (or a stage folder removed since: its content cannot be compared)
            return False
        try:
            head = file_digest(self.model / HEAD_FILE)
            return any(file_digest(f / HEAD_FILE) == head and checkpoint_digest(f) == self.key for f in folders)
        except OSError:
            return None


def indexes_of(model: str | Path, work: Path) -> list[Path]:
    """The index stage folders of `work` that hold the encoding of checkpoint `model`: exact (flat) ones first, then
    newest first."""
    same, found = CheckpointMatch(model, work), []
    for index in (work / "index").glob("[!.]*"):
        try:
            if (digest := index_checkpoint(index)) is not None and same(digest):
                exact = read_manifest(index).get("config", {}).get("type", "flat") in ("flat", "flat_ip")
                found.append((not exact, -index.stat().st_mtime, index))
        except (OSError, KeyError, AttributeError, ValueError):  # (a folder removed meanwhile, a manifest of its own)
            continue
    return [index for *_, index in sorted(found)]


def fusion_of(model: str | Path, work: Path, content: str | None = None) -> dict | None:
    """The fusion a pipeline run in `work` chose on its dev split for checkpoint `model`'s ranking (the newest such
    fusion stage), as latest.json records a result's: the fusion, the BM25 settings it fused with (`bm25`) and how deep
    (`depth`), and `stage`, its folder; None when no run there fused this model. Read from the stage manifests
    (fusion -> the dense ranking -> its checkpoint), so that a model other than the work folder's last result (another
    collection trained since in the same work folder) still searches as its run chose. `content`: a dataset's content
    digest; a fusion made on its corpus is preferred (a model fused by runs on several collections)."""
    same, found = CheckpointMatch(model, work), []
    for folder in (work / "fusion").glob("[!.]*"):
        try:
            manifest = read_manifest(folder)
            if not same(read_manifest(work / "retrieve" / manifest["inputs"]["dense"])["inputs"]["checkpoint"]):
                continue
            bm25 = read_manifest(work / "bm25" / manifest["inputs"]["bm25"])["config"]["bm25"]
            chosen = json.loads((folder / "fusion.json").read_text())["chosen"]
            record = chosen | {"bm25": _settings(bm25), "depth": manifest["config"]["top_k"], "stage": str(folder)}
            ours = content is not None and data_content(work / "data" / str(manifest["inputs"].get("data"))) == content
            found.append((ours, folder.stat().st_mtime, record))
        except (OSError, KeyError, TypeError, ValueError, SyntaxError):  # (a stage folder of its own, or half gone)
            continue
    return max(found, key=lambda item: item[:2])[2] if found else None


def _settings(text: str) -> dict:
    """A stage config's repr, as a stage manifest records it (`k1=0.9 method='lucene' stemmer=None`), as a dict."""
    return {k: ast.literal_eval(v) for k, v in re.findall(r"(\w+)=('[^']*'|\S+)", text)}
