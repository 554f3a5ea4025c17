"""Gather here what the GPU machine lacks, in parts that each travel under its 64 MiB limit (docs/gpu-kit.md).

The GPU machine is bare (Python 3.12, CUDA torch, transformers, pandas, pyarrow, numpy; no Prefect, MLflow, faiss,
bm25s) and offline. This script writes, under --out (default .kit/, ignored by git):

- site/site.tar.xz     the project's dependencies the machine lacks, as cp312 manylinux wheels installed into one
                       folder (pip --target, for Python 3.12 on x86-64), pruned (Prefect's UI build, caches) and
                       packed; its heavy packages that the machine has (numpy, scipy, tokenizers, ...) left out;
- site/scifact.tar.xz  the SciFact collection from the data home (BEIR layout);
- site/tokenizer/      MiniLM's tokenizer and config (the BERT-base-shaped benchmark takes its vocabulary);
- model/minilm/        all-MiniLM-L6-v2's weights stored in fp16 (45 MB; the packaged wheel is 84 MB), restored to
                       fp32 on the GPU machine (scripts/gpu_kit/run.sh).

site/ and model/ together are over 64 MiB: they travel in two back-to-back calls (`carry: [.kit/site]`, then
`carry: [.kit/model]`) while the machine stays warm (30 s), the first installing into /tmp/kit. Prints each part's
size and whether it fits beside the working tree.

    python scripts/gpu_kit/gather.py [--out .kit] [--wheels ~/.cache/ance/gpu-kit-wheels] [--dry-run]

--dry-run also installs the packed site into a scratch folder and checks that every wheel of the closure is in it.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2 ** 20
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_34_x86_64", "manylinux1_x86_64", "linux_x86_64"]
# What the project needs beside torch and transformers (pyproject.toml), with MLflow's client alone (mlflow-skinny:
# tracking to SQLite or a server, pyfunc) in place of the full package and its UI.
REQUIREMENTS = ["transformers==5.17.0",  # the machine's: resolves its own needs against what is there
                "faiss-cpu", "bm25s", "PyStemmer", "ir-measures", "pytrec-eval-terrier", "pydantic>=2.7", "pyyaml",
                "tqdm", "typer", "prefect>=3.8,<3.10", "mlflow-skinny==3.17.2", "fastapi<0.151", "filelock",
                "sqlalchemy", "alembic"]
# On the machine already (KINDS.md's package list): heavy ones not carried. Light pure-Python packages of the closure
# are carried even where the machine has some version, so that Prefect runs on the versions it was resolved with.
ON_MACHINE = {"torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "hf-xet", "numpy", "scipy",
              "pandas", "pyarrow", "regex", "pyyaml", "markupsafe", "charset-normalizer", "psutil", "pygments",
              "fsspec", "jinja2", "requests", "urllib3", "idna", "certifi", "packaging", "filelock", "tqdm"}
# pyproject dependencies left behind on purpose: the malloc of CPU work (ance_core/allocator.py; docs/gpu-kit.md)
LEFT_OUT = {"cmeel-mimalloc"}
PRUNE = ["prefect/server/ui_build", "prefect/server/ui"]  # the temporary server runs without its UI on the machine


def dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def download(wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platform_args, "-d", str(wheels), "-c", str(ROOT / "constraints.txt"),
                    *REQUIREMENTS], check=True)
    found = sorted(wheels.glob("*.whl"))
    carried = [w for w in found if dist_name(w) not in ON_MACHINE]
    names = [dist_name(w) for w in carried]
    doubles = {n for n in names if names.count(n) > 1}
    if doubles:  # an earlier download left another version: pip would refuse two
        sys.exit(f"two versions of {sorted(doubles)} in {wheels}: remove the old ones")
    return carried


def install(carried: list[Path], target: Path) -> None:
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platform_args,
                    "--target", str(target), *map(str, carried)], check=True)
    for rel in PRUNE:
        shutil.rmtree(target / rel, ignore_errors=True)
    for cache in target.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: the run calls python -m


def pack(folder: Path, archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)


def model_parts(out: Path) -> None:
    """MiniLM's weights in fp16 (model/minilm) and its tokenizer and config alone (site/tokenizer)."""
    import torch
    from safetensors.torch import load_file, save_file

    from ance_core.modeling.model import resolve_model_name

    source = Path(resolve_model_name("minilm"))
    if not source.is_dir():
        sys.exit(f"the packaged MiniLM weights are not installed ({source}): make env")
    model_dir, tok_dir = out / "model" / "minilm", out / "site" / "tokenizer"
    for d in (model_dir, tok_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    weights = source / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()},
              str(model_dir / "model.safetensors.fp16"), metadata={"format": "pt"})
    for f in source.iterdir():
        if f.is_file() and f.suffix in (".json", ".txt") and f.name != "model.safetensors":
            shutil.copy2(f, model_dir / f.name)
            shutil.copy2(f, tok_dir / f.name)


def scifact(out: Path) -> None:
    import os

    home = Path(os.environ.get("ANCE_DATA_HOME", ROOT.parent / "shared" / "data"))
    src = home / "scifact"
    if not (src / "corpus.jsonl").is_file():
        sys.exit(f"SciFact not found at {src}: set ANCE_DATA_HOME")
    with tarfile.open(out / "site" / "scifact.tar.xz", "w:xz", preset=9) as tar:
        for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
            tar.add(src / name, arcname=f"scifact/{name}")


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def tree_size() -> int:
    """What travels of the checkout besides carried paths: tracked and untracked, not ignored files."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def dry_run(archive: Path, carried: list[Path]) -> dict:
    """Unpack the site as the machine does and check that every carried distribution is installed in it."""
    with tempfile.TemporaryDirectory(prefix="gpu-kit-dry-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        installed = {p.name.split("-")[0].lower().replace("_", "-") for p in Path(tmp).glob("*.dist-info")}
        missing = sorted({dist_name(w) for w in carried} - installed)
        unpacked = size(Path(tmp))
    return {"distributions": len(installed), "missing": missing, "unpacked_mb": round(unpacked / 2 ** 20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".kit")
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "ance" / "gpu-kit-wheels")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out = args.out.resolve()
    carried = download(args.wheels)
    with tempfile.TemporaryDirectory(prefix="gpu-kit-site-") as tmp:
        install(carried, Path(tmp))
        pack(Path(tmp), out / "site" / "site.tar.xz")
    scifact(out)
    model_parts(out)
    tree = tree_size()
    report = {"wheels": len(carried), "tree_mb": round(tree / 2 ** 20, 1)}
    for part in ("site", "model"):
        mb = size(out / part)
        report[f"{part}_mb"] = round(mb / 2 ** 20, 1)
        report[f"{part}_fits"] = tree + mb <= LIMIT
    if args.dry_run:
        report["dry_run"] = dry_run(out / "site" / "site.tar.xz", carried)
    print(json.dumps(report, indent=1))
    if not all(report[f"{p}_fits"] for p in ("site", "model")) or report.get("dry_run", {}).get("missing"):
        sys.exit(1)


if __name__ == "__main__":
    main()
