#!/usr/bin/env bash
# The GPU machine's side of the device kit (docs/gpu-kit.md): every figure of issue 42 written under $OUT.
# Two parts, run back to back on one warm machine (the kit is over the 64 MiB a call carries):
#   bash scripts/gpu_kit/run.sh site    carry .kit/site : installs the site into $KIT; the GPU suite, exact search
#                                                          (torch vs faiss-cpu), BERT-base-shaped encoding and training
#   bash scripts/gpu_kit/run.sh measure carry .kit/site : one call, no weights: the compiled training step and encoding
#                                                          with MiniLM's and BERT-base's shapes, then the GPU suite
#   bash scripts/gpu_kit/run.sh pace    carry .kit/site : one call, no weights: what sets encoding's pace
#                                                          (bench/encode_pace.py: as shipped, with the first chunk
#                                                          as large as the rest, bf16 weights), then the GPU suite
#   bash scripts/gpu_kit/run.sh model   carry .kit/model: MiniLM restored to fp32; `ance demo` end to end (Prefect's
#                                                          temporary server, MLflow's SQLite store), MiniLM's benchmark
# Each step has a time limit (the whole of a part stays under ~5 min) and a line in $OUT/steps.txt (rc, seconds).
# At most 8 files come back from $OUT: each part writes 6.
set -uo pipefail
part=${1:?usage: run.sh site|model|measure|pace}
OUT=${OUT:-/tmp/kit-out}
KIT=${KIT:-/tmp/kit}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$KIT"
export PYTHONPATH=$KIT/site:$PWD PYTHONUNBUFFERED=1
export ANCE_DATA_HOME=$KIT/data PREFECT_HOME=$KIT/prefect PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false  # the image's JAX would take 75% of the GPU
SMALL=${KIT_SMALL:-}  # set: tiny sizes (the dry run of this script on a CPU)

step() {  # step NAME SECONDS CMD...: its output in $OUT/NAME.log (appended), a line in steps.txt
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  echo "== $*" >>"$OUT/$name.log"
  timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*" | tee -a "$OUT/steps.txt"
}

if [ "$part" = site ] || [ "$part" = measure ] || [ "$part" = pace ]; then
  t0=$(date +%s%N)
  mkdir -p "$KIT/site" "$KIT/data"
  if [ -z "${KIT_LOCAL:-}" ]; then  # KIT_LOCAL: the dry run here, on this checkout's environment
    tar xJf .kit/site/site.tar.xz -C "$KIT/site" || exit 3
  fi
  tar xJf .kit/site/scifact.tar.xz -C "$KIT/data" && rm -rf "$KIT/tokenizer" && cp -r .kit/site/tokenizer "$KIT/tokenizer"
  echo "install $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/steps.txt"
  { nvidia-smi -L; lscpu | grep -E 'Model name|^CPU\(s\)'; $PY -c "
import sys, torch, transformers, prefect, mlflow, faiss, bm25s, pydantic
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers',
      transformers.__version__, 'prefect', prefect.__version__, 'mlflow', mlflow.__version__, 'faiss', faiss.__version__,
      'faiss gpus', getattr(faiss, 'get_num_gpus', lambda: 0)())"; } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  if [ "$part" = pace ]; then  # each variant in its own process: cold and warm passes, the forwards alone
    if [ -n "$SMALL" ]; then sizes=(--passages 100 --length 64); bt=(2048 2048); else sizes=(--passages 30000)
      bt=(131072 65536); fi
    # as shipped (profiled), before the small first chunk (fullchunk), bf16 weights instead of autocast
    step pace 240 $PY bench/encode_pace.py --model "$KIT/tokenizer" --shape bert-base "${sizes[@]}" --profile \
      --batch-tokens "${bt[0]}" --variants thread thread+fullchunk thread+bf16w --timeout 75 \
      --json "$OUT/pace_bert.json"
    step pace 130 $PY bench/encode_pace.py --model "$KIT/tokenizer" "${sizes[@]}" --batch-tokens "${bt[1]}" \
      --variants thread thread+fullchunk --timeout 55 --json "$OUT/pace_minilm.json"
    step tests_gpu 150 $PY -m pytest -q -p no:cacheprovider tests/gpu
    exit 0
  fi
  if [ "$part" = measure ]; then  # one call, no weights carried: the captured (compiled) training step and encoding
    # with random weights of MiniLM's and BERT-base's shapes (the same speed as the trained ones), then the GPU suite
    if [ -n "$SMALL" ]; then sizes=(--passages 300 --steps 6 --skip 2 --batch-size 4); else sizes=(--passages 30000
      --steps 160 --skip 60); fi
    step bench 200 $PY bench/gpu.py --model "$KIT/tokenizer" --random-init "${sizes[@]}" --loader-workers 2 --compile \
      --encode-batch-tokens 65536 --json "$OUT/bench_minilm.json"
    step bench 240 $PY bench/gpu.py --model "$KIT/tokenizer" --shape bert-base "${sizes[@]}" --loader-workers 2 \
      --compile --encode-batch-tokens 131072 --json "$OUT/bench_bert.json"
    step tests_gpu 120 $PY -m pytest -q -p no:cacheprovider tests/gpu
    exit 0
  fi
  step tests_gpu 120 $PY -m pytest -q -p no:cacheprovider tests/gpu
  if [ -n "$SMALL" ]; then
    step bench 120 $PY bench/search.py --shape 5183x384 --shape 20000x768 --faiss-queries 200 --torch-queries 400 \
      --batch 200 --json "$OUT/search.json"
    step bench 300 $PY bench/gpu.py --model "$KIT/tokenizer" --shape bert-base --passages 200 --steps 3 --skip 1 \
      --batch-size 4 --loader-workers 2 --encode-batch-tokens 4096 --json "$OUT/bench_bert.json"
  else
    step bench 75 $PY bench/search.py --shape 5183x384 --shape 1000000x768 --json "$OUT/search.json"
    step bench 130 $PY bench/gpu.py --model "$KIT/tokenizer" --shape bert-base --passages 30000 --steps 120 \
      --skip 20 --loader-workers 2 --encode-batch-tokens 65536 --json "$OUT/bench_bert.json"
  fi
elif [ "$part" = model ]; then
  [ -d "$KIT/site" ] && [ -d "$KIT/data/scifact" ] || { echo "no $KIT/site: run part 'site' first, on the same warm machine"; exit 3; }
  $PY - "$KIT/minilm" <<'EOF' || exit 3
import shutil, sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

src, dst = Path(".kit/model/minilm"), Path(sys.argv[1])
dst.mkdir(parents=True, exist_ok=True)
tensors = load_file(str(src / "model.safetensors.fp16"))
save_file({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(dst / "model.safetensors"),
          metadata={"format": "pt"})
for f in src.iterdir():
    if f.suffix in (".json", ".txt"):
        shutil.copy2(f, dst / f.name)
print("minilm restored to fp32:", len(tensors), "tensors")
EOF
  if [ -n "$SMALL" ]; then
    $PY -c "from pathlib import Path; from tests.tiny import build_tiny_scifact
build_tiny_scifact(Path('$KIT/data/scifact'), Path('$KIT/data/tiny'))"  # ~200 documents
    step demo 900 $PY -m ance_cli demo --json --work-dir "$KIT/work" --set "model.name=$KIT/minilm" \
      --set "data.dataset=$KIT/data/tiny"
  else
    step demo 300 $PY -m ance_cli demo --json --work-dir "$KIT/work" --set "model.name=$KIT/minilm"
    step bench 200 $PY bench/gpu.py --model "$KIT/minilm" --passages 50000 --steps 150 --skip 20 \
      --loader-workers 0 2 --compile --encode-batch-tokens 65536 --json "$OUT/bench_minilm.json"
  fi
  # the demo's run record: stage times and results (the last JSON line of its output)
  $PY - "$OUT" "$KIT/work" <<'EOF'
import json, sys
from pathlib import Path

out, work = Path(sys.argv[1]), Path(sys.argv[2])
lines = [l for l in (out / "demo.log").read_text().splitlines() if l.startswith("{")]
if lines:
    (out / "demo_result.json").write_text(lines[-1])
print("demo result:", lines[-1][:400] if lines else "none")
EOF
else
  echo "usage: run.sh site|model|measure|pace" >&2
  exit 2
fi
