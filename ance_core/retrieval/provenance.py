"""Which checkpoint's encoding an index stage folder holds, told from the stage manifests (index -> encode ->
checkpoint): what `ance search` reads to pick a model's own index and to refuse another model's."""

from pathlib import Path

from ance_core.artifacts import file_digest, read_manifest
from ance_core.modeling.model import HEAD_FILE, checkpoint_digest, checkpoint_ref


def index_checkpoint(index: str | Path) -> str | None:
    """The digest of the checkpoint whose encoding an index stage folder holds, read from the stage manifests (index
    -> encode -> checkpoint); None when they do not say (a folder moved out of its work folder, a compressed index)."""
    index = Path(index).resolve()
    try:
        embeddings = read_manifest(index)["inputs"]["embeddings"]
        return read_manifest(index.parent.parent / "encode" / embeddings)["inputs"]["checkpoint"]
    except (OSError, KeyError, TypeError, ValueError):
        return None


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
