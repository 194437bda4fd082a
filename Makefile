# Two commands do all the set-up on a fresh machine (Python 3.11, Java 17, gcc):
#   make demo   the main job on the embedded default
#   make test   the test suite (what .ci/run calls)
# and CI also runs make lint, make docs (the API reference, build/docs),
# make wheel-smoke (the wheel, installed alone into a fresh venv, smoke-tested)
# and make test-pure (the format, property and crash tests on the interpreted twin).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
COMPILED = $(VENV)/.compiled
# What the compiled twins are built from: setup.py and the modules wal/compiled.py lists.
CORE_SOURCES = setup.py wal/compiled.py $(shell $(PYTHON) -c "import runpy; \
    print(*(m.replace('.', '/') + '.py' for m in runpy.run_path('wal/compiled.py')['COMPILED_MODULES']))")
# `make demo` runs the full-size demo; CI (CI set) or DEMO_ARGS=--small runs the small one.
DEMO_ARGS ?= $(if $(CI),--small,)

SMOKE   = build/smoke-venv

.PHONY: demo test test-half test-durations test-pure bytecode lint docs wheel-smoke bench soak clean

# The dependencies and walkv, editable; WALKV_NO_COMPILE: $(COMPILED) compiles, once.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	WALKV_NO_COMPILE=1 $(PY) -m pip install -q -e '.[dev,spark,cli,bench,docs,server]'
	touch $(STAMP)

# The hot modules compiled with mypyc (setup.py), beside their sources: `pip install -e .`, walkv
# alone, again whenever a source changed (an edited source would otherwise run interpreted, with a
# warning: wal/compiled.py). About a minute of gcc on 2 cores.
$(COMPILED): $(STAMP) $(CORE_SOURCES)
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -c "import wal; print('walkv:', wal.build_info())"
	touch $(COMPILED)

# The project's own sources byte-compiled first (demo, test, test-pure): where PYTHONDONTWRITEBYTECODE is
# set (many images set it), every Python a test starts (the CLI, the crash children, Spark's workers) would
# compile ~220 modules again, 0.2 s each: 40% of the CLI tests' time.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 wal kvstore snapshot benchmarks tests

demo: $(COMPILED) bytecode
	$(VENV)/bin/walkv demo $(DEMO_ARGS)

# The whole suite on what users get: the compiled twins (a build that fell back to pure Python fails here),
# in an order shuffled by pytest-randomly (modules, then the tests in each), the same order for the same
# TEST_SEED: a test that passes only after another, or only alone, fails here every time, never now and then.
# `make test TEST_SEED=7` tries another order; --randomly-dont-reset-seed leaves `random` alone.
#
# That order is cut once, by pytest-split, into two halves of about equal time as tests/durations.json
# recorded it (a test it does not know counts as the average), and the halves run at once: most of the
# suite waits (fsyncs, child processes, servers, Spark), and one test at a time kept the 2 cores a third
# busy. Each half is the same run every time (the seed and the file decide it): `make test-half HALF=2`
# runs one alone. The first half prints as it goes; the second's output goes to build/test-half-2.log and
# is printed after. `make test-durations` records the durations again (one test at a time, ~15 min).
TEST_SEED ?= 32713
TEST_ORDER = -p randomly --randomly-seed=$(TEST_SEED) --randomly-dont-reset-seed
HALVES = $(TEST_ORDER) --splits 2 --splitting-algorithm duration_based_chunks --durations-path tests/durations.json
test: $(COMPILED) bytecode
	$(PY) -c "import wal, sys; info = wal.build_info(); sys.exit(None if info.startswith('compiled') else 'make test: ' + info)"
	mkdir -p build
	$(PY) -m pytest -q $(HALVES) --group 2 > build/test-half-2.log 2>&1 & second=$$!; \
	trap 'kill $$second 2>/dev/null' INT TERM; \
	$(PY) -m pytest -q $(HALVES) --group 1; first=$$?; \
	wait $$second; second=$$?; \
	echo "== the second half (build/test-half-2.log), exit $$second =="; cat build/test-half-2.log; \
	test $$first -eq 0 && test $$second -eq 0

test-half: $(COMPILED) bytecode
	$(PY) -m pytest -q $(HALVES) --group $(HALF)

test-durations: $(COMPILED) bytecode
	$(PY) -m pytest -q $(TEST_ORDER) --store-durations --durations-path tests/durations.json

# The format, property and crash tests again on the interpreted twin (WALKV_PURE=1: wal/compiled.py).
PURE_TESTS = tests/test_record.py tests/test_record_properties.py tests/test_wal_properties.py \
             tests/test_kvstore_model.py tests/test_crash_kill.py tests/test_crashpoints.py tests/test_compiled.py \
             tests/test_aio.py tests/test_aio_crash.py tests/test_fast_path.py
test-pure: $(COMPILED) bytecode
	WALKV_PURE=1 $(PY) -m pytest -q $(PURE_TESTS)

lint: $(COMPILED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The API reference from the docstrings and docs/*.md (Sphinx: docs/conf.py); warnings are errors.
docs: $(STAMP)
	rm -rf build/docs
	WALKV_PURE=1 $(VENV)/bin/sphinx-build -W --keep-going -q -b html docs build/docs  # the sources' signatures
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

bench: $(COMPILED)
	$(PY) -m benchmarks

soak: $(COMPILED)
	$(PY) -m pytest -q --soak -m soak

clean:
	rm -rf $(VENV) build demo-store .pytest_cache .hypothesis wal/_compiled.json
	find wal kvstore snapshot -name '*.so' -delete
