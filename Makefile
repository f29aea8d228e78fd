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

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/swarm-node demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
