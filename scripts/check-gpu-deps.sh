#!/usr/bin/env bash
# Does the GPU worker image's dependency set resolve? docker/Dockerfile.gpu installs the project with constraints.txt
# (torch==2.13.0 from PyPI: the CUDA build on Linux x86_64), then faiss-gpu in place of faiss-cpu. This resolves all of
# them together, as one pip dry-run for the image's Python (3.11) and platform (Debian bookworm: glibc 2.36, x86_64):
# nothing is built or installed (pip reads the wheels' metadata, downloading a wheel only where the index does not
# serve its metadata).
#   scripts/check-gpu-deps.sh            (make check-gpu-deps)
#   TORCH_INDEX=https://download.pytorch.org/whl/cu126 TORCH=torch==2.13.0+cu126 scripts/check-gpu-deps.sh   # another build
# Exit 0 when they resolve; pip's error names the package that does not.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_INDEX=${TORCH_INDEX:-https://pypi.org/simple}
TORCH=${TORCH:-$(grep -o '^torch==.*' constraints.txt)}
FAISS=$(grep -o 'faiss-gpu[a-z0-9-]*==[^" ]*' docker/Dockerfile.gpu)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --upgrade "pip>=23.3" 2>/dev/null
"$WORK/venv/bin/python" - > "$WORK/requirements.txt" <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for requirement in project["dependencies"] + extras["minilm"] + extras["gpu"]:  # Dockerfile.gpu's .[minilm,gpu]
    if requirement.split("[")[0].strip() not in ("torch", "faiss-cpu"):  # torch is pinned below; faiss-gpu replaces
        print(requirement)
EOF
grep -v -e '^torch==' -e '^faiss-cpu' constraints.txt > "$WORK/constraints.txt"
# every manylinux tag bookworm's glibc 2.36 runs (pip does not widen a --platform to older glibc versions)
PLATFORMS=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for minor in $(seq 5 36); do PLATFORMS+=(--platform "manylinux_2_${minor}_x86_64"); done
echo "resolving $TORCH (from $TORCH_INDEX), $FAISS and the project's dependencies with constraints.txt"
# --isolated: no pip config (this machine's find-links hold a CPU torch wheel that would answer for torch)
"$WORK/venv/bin/pip" install --isolated --dry-run --ignore-installed --target "$WORK/target" --python-version 3.11 \
  "${PLATFORMS[@]}" --only-binary=:all: --extra-index-url "$TORCH_INDEX" -c "$WORK/constraints.txt" \
  -r "$WORK/requirements.txt" "$TORCH" "$FAISS" | grep -E '^Would install' | fold -s -w 118
echo "the GPU image's dependencies resolve"
