"""Where a dataset comes from: a folder, a name under the data home (ANCE_DATA_HOME), or a public BEIR archive
downloaded once (md5-checked, unpacked atomically); and the content digest a data stage's cache key is made of."""

import functools
import hashlib
import os
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from ance_core.artifacts import file_digest
from ance_core.data.layout import data_files
from ance_core.errors import AnceError

BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"
# md5 of each public BEIR archive, as published in the BEIR README.
BEIR_MD5 = {
    "msmarco": "444067daf65d982533ea17ebd59501e4",
    "trec-covid": "ce62140cb23feb9becf6270d0d1fe6d1",
    "nfcorpus": "a89dba18a62ef92f7d323ec890a0d38d",
    "nq": "d4d3d2e48787a744b6f6e691ff534307",
    "hotpotqa": "f412724f78b0d91183a0e86805e16114",
    "fiqa": "17918ed23cd04fb15047f73e6c3bd9d9",
    "arguana": "8ad3e3c2a5867cdced806d6503f29b99",
    "webis-touche2020": "46f650ba5a527fc69e0a6521c5a23563",
    "cqadupstack": "4e41456d7df8ee7760a7f866133bda78",
    "quora": "18fb154900ba42a600f84b839c173167",
    "dbpedia-entity": "c2a39eb420a3164af735795df012ac2c",
    "scidocs": "38121350fc3a4d2f48850f6aff52e4a9",
    "fever": "5a818580227bfb4b35bb6fa46d9b6c03",
    "climate-fever": "8b66f0a9126c521bae2bde127b4dc99d",
    "scifact": "5f7d1de60b170fc8027bb7898e2efca1",
}


def data_home(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("ANCE_DATA_HOME") or Path.home() / ".cache" / "ance" / "data")


def resolve_dataset(dataset: str, home: str | None = None, download: bool = True) -> Path:
    """A path to an existing folder, or a name under the data home (downloaded from BEIR when missing)."""
    if not dataset.strip():  # (Path("") is the current folder, or the data home itself)
        raise AnceError("the dataset is empty: give a dataset folder, or a name under the data home (e.g. scifact)")
    as_path = Path(dataset).expanduser()
    if as_path.is_dir():
        return as_path
    root = data_home(home)
    if (root / dataset).is_dir():
        return root / dataset
    if root.exists() and not root.is_dir():  # (a download tried first said only "File exists")
        raise AnceError(f"dataset '{dataset}': the data home {root} is a file, not a folder (set ANCE_DATA_HOME, or "
                        "data.data_home, to the folder that holds the datasets)")
    if dataset in BEIR_MD5 and download:
        try:
            return download_beir(dataset, root)
        except OSError as e:
            raise AnceError(
                f"dataset '{dataset}' is not in the data home {root} and downloading it failed ({e}); "
                f"put it at {root / dataset} or set ANCE_DATA_HOME"
            ) from None
    for there in (as_path, root / dataset):
        if there.exists():
            raise AnceError(f"dataset '{dataset}': {there} is a file, not a dataset folder (give the folder that "
                            "holds it)")
    known = ", ".join(sorted(BEIR_MD5))
    raise AnceError(
        f"dataset '{dataset}' not found: not a folder, not in the data home {root}"
        + (f" (downloadable BEIR names: {known})" if download else " and download is off")
    )


def download_beir(name: str, root: Path) -> Path:
    """Download the public BEIR zip for `name`, verify its md5, unpack atomically into root/name."""
    url = BEIR_URL.format(name=name)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".download-{name}-") as tmp:
        archive = Path(tmp) / f"{name}.zip"
        md5 = hashlib.md5()
        with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as out:
            while block := response.read(1 << 20):
                md5.update(block)
                out.write(block)
        if md5.hexdigest() != BEIR_MD5[name]:
            raise AnceError(f"{url}: checksum mismatch (md5 {md5.hexdigest()}, expected {BEIR_MD5[name]})")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():  # refuse entries that would escape the target folder
                if not (unpacked / member).resolve().is_relative_to(unpacked.resolve()):
                    raise AnceError(f"{url}: unsafe path in archive: {member}")
            zf.extractall(unpacked)
        source = unpacked / name if (unpacked / name).is_dir() else unpacked
        os.replace(source, root / name)
    return root / name


def dataset_digest(folder: Path) -> str:
    """Content digest of the folder's data files, those a load reads (names and bytes; layout.data_files): a qrels/
    folder that is a link is hashed through it (rglob did not follow it: an edited qrels file kept the data stage
    of before), and a work folder kept inside the dataset's is not (its stage manifests changed the digest).

    Memoised on the files' (name, size, mtime): the CLI's preflight, the data task's cache key and the task itself
    all ask for it, and hashing a large collection three times in one run is wasted I/O."""
    files = data_files(folder)
    stats = tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash_files(str(folder.resolve()), stats)


@functools.lru_cache(maxsize=32)
def _hash_files(folder: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(name.encode())
        h.update(file_digest(Path(folder) / name).encode())
    return h.hexdigest()[:16]
