"""Stage folders named by a digest of (stage, config, input digests), written atomically.

A stage builds into `<work_dir>/<stage>/.partial-<key>/` and renames it to `<work_dir>/<stage>/<key>/` only
after its manifest is written, so a half-written folder is never visible to a later stage or a cache.
Resumable stages (training) keep the partial folder across failures and pick up their last checkpoint.
"""

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import ance_core

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ArtifactRef:
    """What a stage hands to the next one: where its folder is and the digest that names it."""

    path: str
    digest: str
    seconds: float = 0.0  # wall time of the build that produced the folder
    cached: bool = False  # True when an existing complete folder was reused


def canonical_json(obj: Any) -> str:
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest_of(obj: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def stage_key(stage: str, config: Any, inputs: Mapping[str, str]) -> str:
    return digest_of({"stage": stage, "config": config, "inputs": dict(inputs), "version": ance_core.__version__})


def is_complete(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / MANIFEST).read_text())


def run_stage(
    work_dir: str | Path,
    stage: str,
    config: Any,
    inputs: Mapping[str, str],
    build: Callable[[Path], Mapping[str, Any] | None],
    resumable: bool = False,
) -> ArtifactRef:
    """Return the stage's folder, building it with `build(tmp_dir)` unless a complete one exists.

    `build` writes its files into the temporary folder and may return a small summary for the manifest.
    """
    key = stage_key(stage, config, inputs)
    final = Path(work_dir) / stage / key
    if is_complete(final):
        return ArtifactRef(str(final), key, read_manifest(final).get("seconds", 0.0), cached=True)
    partial = final.parent / f".partial-{key}"
    if partial.exists() and not resumable:
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        summary = build(partial) or {}
    except BaseException:
        if not resumable:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    manifest = {
        "stage": stage,
        "key": key,
        "config": json.loads(canonical_json(config)) if config is not None else None,
        "inputs": dict(inputs),
        "summary": dict(summary),
        "seconds": round(time.time() - started, 3),
        "version": ance_core.__version__,
    }
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    if final.exists():  # an incomplete leftover (no manifest) from an older layout: replace it
        shutil.rmtree(final)
    os.replace(partial, final)
    return ArtifactRef(str(final), key, manifest["seconds"])


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON through a temporary file and rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)
