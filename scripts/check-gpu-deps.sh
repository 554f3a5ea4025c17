#!/usr/bin/env bash
# Does the GPU worker image's dependency set resolve? docker/Dockerfile.gpu installs torch from PyTorch's CUDA 12.6
# index, then the project with constraints.txt, then faiss-gpu-cu12 in place of faiss-cpu. This resolves all of them
# together, as one pip dry-run for Python 3.11 on Linux x86_64: nothing is built or installed (pip >= 23.3 reads the
# wheels' metadata, without downloading them where the index serves it).
#   scripts/check-gpu-deps.sh            (make check-gpu-deps)
#   TORCH=torch==2.13.0 TORCH_INDEX=https://pypi.org/simple scripts/check-gpu-deps.sh   # PyPI's torch (CUDA 13)
# Exit 0 when they resolve; pip's error names the package that does not.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cu126}
TORCH=${TORCH:-$(grep -o '^torch==.*' constraints.txt)+cu126}
FAISS=$(grep -o 'faiss-gpu-cu12==[^" ]*' docker/Dockerfile.gpu)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --upgrade "pip>=23.3" 2>/dev/null
"$WORK/venv/bin/python" - > "$WORK/requirements.txt" <<'EOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["minilm"]:
    if requirement.split("[")[0].strip() not in ("torch", "faiss-cpu"):  # torch is pinned below; faiss-gpu replaces
        print(requirement)
EOF
grep -v '^torch==' constraints.txt > "$WORK/constraints.txt"
PLATFORMS=()
for v in 2014 _2_17 _2_24 _2_27 _2_28 _2_31 _2_34 _2_35 _2_39; do PLATFORMS+=(--platform "manylinux${v}_x86_64"); done
echo "resolving $TORCH (from $TORCH_INDEX), $FAISS and the project's dependencies with constraints.txt"
# --isolated: no pip config (this machine's find-links hold a CPU torch wheel that would answer for torch)
"$WORK/venv/bin/pip" install --isolated --dry-run --ignore-installed --target "$WORK/target" --python-version 3.11 \
  "${PLATFORMS[@]}" --only-binary=:all: --extra-index-url "$TORCH_INDEX" -c "$WORK/constraints.txt" \
  -r "$WORK/requirements.txt" "$TORCH" "$FAISS" | grep -E '^Would install' | fold -s -w 118
echo "the GPU image's dependencies resolve"
