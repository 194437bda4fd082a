# Two commands do all the set-up on a fresh machine (Python 3.11, Java 17, gcc):
#   make demo   the main job on the embedded default
#   make test   the test suite (what .ci/run calls)
# and CI also runs make lint, make docs (the API reference, build/docs) and
# make wheel-smoke (the wheel, installed alone into a fresh venv, smoke-tested).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
# `make demo` runs the full-size demo; CI (CI set) or DEMO_ARGS=--small runs the small one.
DEMO_ARGS ?= $(if $(CI),--small,)

SMOKE   = build/smoke-venv

.PHONY: demo test lint docs wheel-smoke bench soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,cli,bench,docs,server]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/walkv demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The API reference from the docstrings and docs/*.md (Sphinx: docs/conf.py); warnings are errors.
docs: $(STAMP)
	rm -rf build/docs
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs build/docs
	@echo "docs: build/docs/index.html"

# Build the sdist and the wheel (build/dist), install the wheel alone into a fresh venv and
# smoke-test it from a temporary directory (no checkout on sys.path): tests/wheel_smoke.py.
wheel-smoke: $(STAMP)
	rm -rf build/dist $(SMOKE)
	$(PY) -m build -q --outdir build/dist .
	$(PYTHON) -m venv $(SMOKE)
	$(SMOKE)/bin/python -m pip install -q build/dist/walkv-*.whl
	tmp=$$(mktemp -d) && cd $$tmp && $(abspath $(SMOKE))/bin/python -I $(CURDIR)/tests/wheel_smoke.py \
	    --mypy $(abspath $(VENV))/bin/mypy; rc=$$?; rm -rf $$tmp; exit $$rc

bench: $(STAMP)
	$(PY) -m benchmarks

soak: $(STAMP)
	$(PY) -m pytest -q --soak -m soak

clean:
	rm -rf $(VENV) build demo-store .pytest_cache .hypothesis
