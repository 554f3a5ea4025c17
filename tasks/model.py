import functools
from pathlib import Path

from ance_core.artifacts import ArtifactRef, digest_of, file_digest, run_stage
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import META_FILE, checkpoint_digest, init_model
from tasks.common import stage_task

MODEL_FILES = (".safetensors", ".bin", ".json", ".txt", ".model")  # what a local model folder computes with


def local_model_digest(name: str) -> str | None:
    """The content of a local model folder (one changed in place, weights retrained or replaced at the same path, is
    another model): a pipeline checkpoint's `checkpoint_digest`, another folder's weights, config and vocabulary
    files. None for a hub id or the 'minilm' alias (the installed package's weights), which their names name."""
    if name == "minilm" or not (path := Path(name).expanduser()).is_dir():
        return None
    if (path / META_FILE).is_file():
        return checkpoint_digest(path)
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(MODEL_FILES))
    return _files_digest(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


@functools.lru_cache(maxsize=16)
def _files_digest(stats: tuple[tuple[str, int, int], ...]) -> str:  # (memoised: the task's cache key and the task
    # itself both ask, and a BERT-base's weights are 440 MB)
    return digest_of({Path(name).name: file_digest(name) for name, _, _ in stats})


def _content(cfg: ModelConfig) -> dict:
    return {"content": digest} if (digest := local_model_digest(cfg.name)) else {}


@stage_task("init-model", extra_key=lambda inputs: _content(inputs["cfg"]))
def init_checkpoint(cfg: ModelConfig, work_dir: str) -> ArtifactRef:
    """The starting checkpoint: pretrained encoder plus a freshly initialised projection head. A local model folder's
    content keys it (its path alone kept the stage, and everything after it, of the weights it held before)."""
    return run_stage(work_dir, "model", cfg, _content(cfg), lambda out: init_model(cfg, out))
