#!/usr/bin/env bash
# The local stack, in the background, on 127.0.0.1: a Prefect server, process workers for the `cpu` and `infer` pools
# (infer: the asynchronous trainer's refresh flow runs), and an MLflow tracking server over the same store the
# embedded default writes (work/mlflow.db, work/mlartifacts).
#   scripts/stack.sh up | down | deploy | status
# deploy registers prefect.yaml on the server in PREFECT_API_URL when it is set, else on the one `up` started (its port
# is kept in $STACK_DIR), else on 127.0.0.1:$PREFECT_PORT.
# State, logs and pid files live in $STACK_DIR (default .stack/); the Prefect server's database in $STACK_DIR/prefect.
# Environment: PREFECT_PORT (default 4200), MLFLOW_PORT (default 5000), MLFLOW_STORE_DIR (default work/: the demo's
# work folder), VENV (default .venv), and the gpu pool's image, storage and tracking (docker/gpu-pool.env).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STACK_DIR=$(mkdir -p "${STACK_DIR:-.stack}" && cd "${STACK_DIR:-.stack}" && pwd)
PORT=${PREFECT_PORT:-4200}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
MLFLOW_STORE_DIR=$(mkdir -p "${MLFLOW_STORE_DIR:-work}" && cd "${MLFLOW_STORE_DIR:-work}" && pwd)
BIN=${VENV:-$ROOT/.venv}/bin
mkdir -p "$STACK_DIR/logs"
USER_API_URL=${PREFECT_API_URL:-}  # deploy registers on it when set (the compose stack's server, a remote one)
export PREFECT_HOME="$STACK_DIR/prefect"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_UI_API_URL="$PREFECT_API_URL"
export ANCE_PROJECT_DIR="$ROOT"
export TOKENIZERS_PARALLELISM=false
# flows run by the worker log to the tracking server
export MLFLOW_TRACKING_URI="http://127.0.0.1:$MLFLOW_PORT"
export MLFLOW_DISABLE_TELEMETRY=true
# lean: no job-execution workers (~500 MB instead of ~3.3 GB)
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false

running() { [[ -f "$STACK_DIR/$1.pid" ]] && kill -0 "$(cat "$STACK_DIR/$1.pid")" 2>/dev/null; }

start() {  # name, command...
  local name=$1; shift
  if running "$name"; then echo "$name already running (pid $(cat "$STACK_DIR/$name.pid"))"; return; fi
  setsid "$@" >"$STACK_DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$STACK_DIR/$name.pid"
  echo "$name started (pid $!, log $STACK_DIR/logs/$name.log)"
}

wait_healthy() {  # name, health url
  for _ in $(seq 1 120); do
    if curl -sf "$2" >/dev/null; then return 0; fi
    if [[ -f "$STACK_DIR/$1.pid" ]] && ! running "$1"; then  # started here and gone (not: a server of another stack)
      echo "$1 exited; see $STACK_DIR/logs/$1.log" >&2; tail -20 "$STACK_DIR/logs/$1.log" >&2; exit 1
    fi
    sleep 1
  done
  echo "$1 did not answer on $2 within 120 s" >&2; exit 1
}

taken() {  # name, port: something this stack did not start listens on the port (the compose stack's server, ...)
  ! running "$1" && (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null
}

pool() {  # name, type
  "$BIN/prefect" work-pool inspect "$1" >/dev/null 2>&1 || "$BIN/prefect" work-pool create "$1" --type "$2" >/dev/null
}

case "${1:-}" in
  up)
    for server in "prefect-server $PORT PREFECT_PORT" "mlflow-server $MLFLOW_PORT MLFLOW_PORT"; do
      read -r name port variable <<<"$server"
      if taken "$name" "$port"; then  # (else its server fails to bind, and the health check may ask the other one)
        echo "port $port (127.0.0.1) is in use by a server this stack did not start (the compose stack's? \`docker" \
          "compose -f docker/compose.yaml down\` stops it): stop it, or set $variable to a free port" >&2
        exit 1
      fi
    done
    # new experiments keep their artifacts at the path an embedded run writes (work/mlartifacts), not behind the
    # server's proxy (mlflow-artifacts:/), which only a client of the server can reach: a store made by `make up` is
    # then also one `ance run` without the stack, `mlflow models serve` and `ance export` read. The destination serves
    # the experiments a server made before with proxied artifacts.
    start mlflow-server "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
      --backend-store-uri "sqlite:///$MLFLOW_STORE_DIR/mlflow.db" \
      --default-artifact-root "file://$MLFLOW_STORE_DIR/mlartifacts" --artifacts-destination "$MLFLOW_STORE_DIR/mlartifacts"
    running prefect-server || echo "$PORT" > "$STACK_DIR/prefect.port"  # (a running one keeps the port it has)
    start prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT"
    wait_healthy prefect-server "$PREFECT_API_URL/health"
    wait_healthy mlflow-server "$MLFLOW_TRACKING_URI/health"
    pool cpu process
    pool infer process
    pool gpu docker
    # the workers' flow runs train and encode: on mimalloc, as the `ance` command does (ance_core/allocator.py), unless
    # ANCE_ALLOCATOR=system or another malloc is preloaded already
    preload=$("$BIN/python" -m ance_core.allocator --ld-preload)
    start worker-cpu env LD_PRELOAD="$preload" "$BIN/prefect" worker start --pool cpu --name "cpu-$(hostname)"
    # a name of its own at each start: a trainer following a refresh on the worker before a restart sees it gone
    start worker-infer env LD_PRELOAD="$preload" "$BIN/prefect" worker start --pool infer \
      --name "infer-$(hostname)-$(date +%s)"
    echo "Prefect UI: http://127.0.0.1:$PORT   (export PREFECT_API_URL=$PREFECT_API_URL to use it from a shell)"
    echo "MLflow UI:  $MLFLOW_TRACKING_URI   (export MLFLOW_TRACKING_URI=$MLFLOW_TRACKING_URI to log to it from a shell)"
    ;;
  deploy)
    # the gpu pool's storage and tracking (docker/gpu-pool.env), unless already set in the environment
    while IFS='=' read -r key value; do
      [[ -z "$key" || "$key" == \#* || -n "${!key:-}" ]] || export "$key=$value"
    done < "$ROOT/docker/gpu-pool.env"
    if [[ -n "$USER_API_URL" ]]; then
      export PREFECT_API_URL=$USER_API_URL
    elif running prefect-server && [[ -f "$STACK_DIR/prefect.port" ]]; then  # the server `up` started, on its port
      export PREFECT_API_URL="http://127.0.0.1:$(cat "$STACK_DIR/prefect.port")/api"
    fi
    echo "registering prefect.yaml's deployments on $PREFECT_API_URL"
    # (a server named by PREFECT_API_URL is not the one `up` started: its pid file says nothing about it)
    wait_healthy "$([[ -n "$USER_API_URL" ]] && echo "the server in PREFECT_API_URL" || echo prefect-server)" \
      "$PREFECT_API_URL/health"
    pool cpu process
    pool infer process
    pool gpu docker
    "$BIN/prefect" --no-prompt deploy --all
    ;;
  down)
    for name in worker-cpu worker-infer prefect-server mlflow-server; do
      if running "$name"; then
        pid=$(cat "$STACK_DIR/$name.pid")
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        echo "$name stopped"
      fi
      rm -f "$STACK_DIR/$name.pid"
    done
    rm -f "$STACK_DIR/prefect.port"
    ;;
  status)
    for name in prefect-server worker-cpu worker-infer mlflow-server; do
      if running "$name"; then echo "$name: running (pid $(cat "$STACK_DIR/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: $0 up|down|deploy|status" >&2; exit 2 ;;
esac
