# imagebench: `make demo` and `make test` are all a fresh machine needs (Python 3.11).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Quiet Prefect's telemetry on the ephemeral API (it prints a "database is locked" traceback otherwise),
# and its client's (DO_NOT_TRACK: its "collects anonymous usage data" notice); flows/env.py sets both too.
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export GX_ANALYTICS_ENABLED := false

.PHONY: setup system-deps demo test test-numeric-avx2 serve bench clean-demo

# Debian packages the pipeline and its tests use: Tesseract (the offline OCR judge), Chromium
# with its driver (the report's browser tests) and PostgreSQL (the panel store's tests start a
# throwaway cluster: initdb/pg_ctl live in /usr/lib/postgresql/<major>/bin, not on PATH) and
# LibreOffice Calc without its GUI (the exports' tests open every CSV in a real spreadsheet), nginx
# and openssl (the panel's reverse-proxy test runs docs/BEAUTY.md's nginx set-up with a self-signed
# certificate; nginx lives in /usr/sbin, off a user's PATH; where systemd runs, Debian starts its
# default site on port 80: the tests start their own nginx and do not need it).
# Installed when missing and we are root.
SYSTEM_PACKAGES := tesseract-ocr chromium chromium-driver postgresql libreoffice-calc-nogui nginx openssl

setup: system-deps $(STAMP)

system-deps:
	@missing=""; \
	command -v tesseract >/dev/null || missing="$$missing tesseract-ocr"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null || missing="$$missing nginx"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v soffice >/dev/null || missing="$$missing libreoffice-calc-nogui"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing (sudo apt-get install$$missing)"; \
	  fi; \
	fi

# Each step says what it does first: the pinned packages take minutes (256 s measured on 2 cores,
# downloading 201 packages from PyPI, 2.6 GB installed; more on a slow link), and pip shows each
# package as it comes (issue 26 item 8: a quiet pip looked like a hang).
$(STAMP): requirements.lock pyproject.toml
	@echo "make: creating $(VENV) (once; again only when requirements.lock or pyproject.toml change)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "make: installing the pinned packages of requirements.lock into $(VENV) (about 4 min on 2 cores, longer on a slow link)..."
	$(PY) -m pip install -r requirements.lock
	@echo "make: installing imagebench itself into $(VENV) (editable: it runs from this checkout)"
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)
	@echo "make: $(VENV) is ready"

demo: setup
	$(VENV)/bin/imagebench demo

# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on processes of
# their own (servers, commands), so two share 2 cores well. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/pytest -q --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The tests that compare numbers produced by torch, again on the kernels every x86-64 CPU has and one
# thread (.ci/run): a test that only holds on the developer's CPU (MKL picks AMX, AVX-512 or AVX2 by
# itself) fails here before it lands. IMAGEBENCH_CPU_FACTS is emptied: this pass is about this
# machine's own kernels, never a recorded machine's facts (docs/HPSV3.md).
test-numeric-avx2: setup
	IMAGEBENCH_CPU_FACTS= MKL_ENABLE_INSTRUCTIONS=AVX2 OMP_NUM_THREADS=1 IMAGEBENCH_HPSV3_THREADS=1 $(VENV)/bin/pytest -q -m numeric

# Production mode: a real Prefect server on 127.0.0.1 (port IMAGEBENCH_PREFECT_PORT, default 4200) + the nightly and
# backfill deployments served against it; Ctrl-C stops both (docs/OPERATIONS.md).
serve: setup
	$(VENV)/bin/imagebench serve --local-server

bench: setup
	$(PY) bench/run_bench.py

clean-demo:
	rm -rf data/objects data/lake data/images data/staging data/reference data/demo-model data/imagebench.duckdb data/prefect data/prefect-server data/locks
