# headlab: `make serve` runs the explainer, `make test` runs every check. Both set up .venv first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest-xdist workers for `make test`, each given whole modules, the slowest first (tests/conftest.py);
# JOBS=0 runs every test in the one pytest process
JOBS   ?= 2

.PHONY: install test lint serve bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -n $(JOBS)

serve: $(STAMP)
	$(VENV)/bin/headlab serve --host $(HOST) --port $(PORT)

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
