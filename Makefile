# Two commands do all the set-up on a fresh machine (Python 3.11, Java 17, gcc):
#   make demo   the main job on the embedded default
#   make test   the test suite (what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
# `make demo` runs the full-size demo; CI (CI set) or DEMO_ARGS=--small runs the small one.
DEMO_ARGS ?= $(if $(CI),--small,)

.PHONY: demo test lint bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,cli,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/walkv demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m benchmarks

soak: $(STAMP)
	$(PY) -m pytest -q --soak -m soak

clean:
	rm -rf $(VENV) demo-store .pytest_cache .hypothesis
