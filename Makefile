# Two entry points: `make nightly` (the main job) and `make test`. Everything else is a helper of theirs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DATA_DIR ?= .data

.PHONY: nightly test install system-deps lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test,genai,peers]'
	touch $@

install: $(VENV)/.installed

# OpenSSH server and PostgreSQL binaries for the test services (the tests start and stop them on 127.0.0.1), and
# Chromium for the browser tests.
system-deps:
	bash scripts/install-system-deps.sh

# The nightly support matrix on the embedded default: the local x86-cpu device, SQLite under $(DATA_DIR), the
# bundled stories260K plus tiny checkpoints of every family. Docs land in $(DATA_DIR)/docs/.
nightly: install
	EDGEFARM_DATA_DIR=$(abspath $(DATA_DIR)) $(VENV)/bin/edgefarm nightly

lint: install
	$(VENV)/bin/ruff check .

# GPU tests are deselected here (pytest's summary counts them); run them on a GPU machine with `pytest -m gpu`.
test: install system-deps lint
	$(PY) -m pytest -m "not gpu"

clean:
	rm -rf $(VENV) $(DATA_DIR) .pytest_cache .ruff_cache
