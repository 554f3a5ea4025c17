#!/usr/bin/env bash
# The whole test suite, exactly as `make test` runs it, while two CPU-bound busy processes run beside it, several
# times in a row (default 3). CI's machine may be busy: the suite must pass without an idle machine. Prints each
# run's wall time and outcome (also appended to .stack/under-load.log) and stops at the first failure.
#   scripts/test-under-load.sh [runs]        or        make test-under-load [RUNS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
mkdir -p .stack
busy=()
cleanup() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
for _ in 1 2; do
  ( trap - INT TERM; while :; do :; done ) &
  busy+=($!)
done
echo "two CPU-bound busy processes running beside the suite: pids ${busy[*]} ($(nproc) cores)"
for k in $(seq 1 "$runs"); do
  started=$(date +%s)
  if make test; then outcome=passed; else outcome=FAILED; fi
  line="$(date -u +%FT%TZ) run $k/$runs under load: $outcome in $(( $(date +%s) - started )) s"
  echo "$line" | tee -a .stack/under-load.log
  [ "$outcome" = passed ] || exit 1
done
