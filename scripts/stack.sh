#!/usr/bin/env bash
# The local stack: a Prefect server on 127.0.0.1 and a process worker for the `cpu` pool, in the background.
#   scripts/stack.sh up | down | deploy | status
# State, logs and pid files live in $STACK_DIR (default .stack/); the server's database in $STACK_DIR/prefect.
# Environment: PREFECT_PORT (default 4200), VENV (default .venv), ANCE_GPU_IMAGE (image of the gpu pool's jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STACK_DIR=$(mkdir -p "${STACK_DIR:-.stack}" && cd "${STACK_DIR:-.stack}" && pwd)
PORT=${PREFECT_PORT:-4200}
BIN=${VENV:-$ROOT/.venv}/bin
mkdir -p "$STACK_DIR/logs"
export PREFECT_HOME="$STACK_DIR/prefect"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_API_URL="$PREFECT_API_URL"
export ANCE_PROJECT_DIR="$ROOT"
export ANCE_GPU_IMAGE="${ANCE_GPU_IMAGE:-ance-worker-gpu:latest}"
export TOKENIZERS_PARALLELISM=false

running() { [[ -f "$STACK_DIR/$1.pid" ]] && kill -0 "$(cat "$STACK_DIR/$1.pid")" 2>/dev/null; }

start() {  # name, command...
  local name=$1; shift
  if running "$name"; then echo "$name already running (pid $(cat "$STACK_DIR/$name.pid"))"; return; fi
  setsid "$@" >"$STACK_DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$STACK_DIR/$name.pid"
  echo "$name started (pid $!, log $STACK_DIR/logs/$name.log)"
}

wait_healthy() {
  for _ in $(seq 1 120); do
    if curl -sf "$PREFECT_API_URL/health" >/dev/null; then return 0; fi
    running prefect-server || { echo "prefect server exited; see $STACK_DIR/logs/prefect-server.log" >&2; tail -20 "$STACK_DIR/logs/prefect-server.log" >&2; exit 1; }
    sleep 1
  done
  echo "prefect server did not answer on $PREFECT_API_URL within 120 s" >&2; exit 1
}

pool() {  # name, type
  "$BIN/prefect" work-pool inspect "$1" >/dev/null 2>&1 || "$BIN/prefect" work-pool create "$1" --type "$2" >/dev/null
}

case "${1:-}" in
  up)
    start prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT"
    wait_healthy
    pool cpu process
    pool gpu docker
    start worker-cpu "$BIN/prefect" worker start --pool cpu --name "cpu-$(hostname)"
    echo "Prefect UI: http://127.0.0.1:$PORT   (export PREFECT_API_URL=$PREFECT_API_URL to use it from a shell)"
    ;;
  deploy)
    wait_healthy
    pool cpu process
    pool gpu docker
    "$BIN/prefect" --no-prompt deploy --all
    ;;
  down)
    for name in worker-cpu prefect-server; do
      if running "$name"; then
        pid=$(cat "$STACK_DIR/$name.pid")
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        echo "$name stopped"
      fi
      rm -f "$STACK_DIR/$name.pid"
    done
    ;;
  status)
    for name in prefect-server worker-cpu; do
      if running "$name"; then echo "$name: running (pid $(cat "$STACK_DIR/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: $0 up|down|deploy|status" >&2; exit 2 ;;
esac
