# Two commands on a fresh machine: `make demo` and `make test`. Both build .venv from the
# project's own files (requirements.lock pins every dependency) and install the package editable.
# `make test` also builds (once) the CPU vLLM venv the integration tests serve a tiny model with:
# pinned by requirements-vllm.lock, kept outside the clone under $MASERVE_VLLM_CACHE (default
# ~/.cache/maserve) in a folder keyed by the lock's hash.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_LOCK := requirements-vllm.lock

.PHONY: demo test test-unit test-fast vllm-env lint typecheck clean venv sandbox-deps postgres-deps browser-deps

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml setup.py
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found; install Python 3.11 or run 'make PY=python3.x'"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The code-test sandbox jails untrusted code with bubblewrap (Debian package `bubblewrap`):
# installed here when `bwrap` is missing and we are root with apt-get; otherwise a note, and
# code-test tools refuse untrusted code (MASERVE_ALLOW_UNSANDBOXED=1 runs it unjailed).
BWRAP ?= bwrap
sandbox-deps:
	@command -v $(BWRAP) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (the code-test sandbox)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; } || \
	    echo "warning: could not install bubblewrap; code-test tools will refuse untrusted code"; \
	  else \
	    echo "note: $(BWRAP) not found and not installable here (needs root and apt-get):" \
	      "install the 'bubblewrap' package, or code-test tools refuse untrusted code"; \
	  fi; }

# The PostgreSQL ledger / Prefect tests start a private server from Debian's `postgresql`
# package (binaries only; no system service is used). Installed like bubblewrap when root can;
# elsewhere those tests skip, naming the package (CI sets MASERVE_REQUIRE_POSTGRES: they must run).
postgres-deps:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing postgresql (server binaries for the PostgreSQL tests)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q postgresql >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; } || \
	    echo "warning: could not install postgresql; the PostgreSQL tests will skip"; \
	  else \
	    echo "note: PostgreSQL server binaries not found and not installable here (needs root and" \
	      "apt-get): install the 'postgresql' package, or the PostgreSQL tests skip"; \
	  fi; }

# The Prefect UI test (tests/cli/test_prefect_ui_browser.py) drives headless Chromium with
# Playwright (pinned in requirements.lock) through the system browser (Debian package
# `chromium`): installed here when missing and we are root with apt-get; otherwise a note, and
# that test skips.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (the Prefect UI test's headless browser)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	    echo "warning: could not install chromium; the Prefect UI test will skip"; \
	  else \
	    echo "note: Chromium not found and not installable here (needs root and apt-get):" \
	      "install the 'chromium' package, or the Prefect UI test skips"; \
	  fi; }

demo: $(STAMP) sandbox-deps
	$(BIN)/python -m maserve_prefect.demo

test: $(STAMP) sandbox-deps postgres-deps browser-deps
	VLLM_PY="$$($(BIN)/python -m maserve_prefect.engines.vllm.venv --lock $(VLLM_LOCK))" && \
	MASERVE_VLLM_PYTHON="$$VLLM_PY" $(BIN)/python -m pytest tests

# Everything but the tests that need the real vLLM server (they skip without MASERVE_VLLM_PYTHON).
test-unit: $(STAMP)
	$(BIN)/python -m pytest tests -m "not integration"

# The edit-test loop: no Prefect server, no real engine.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not prefect and not integration"

vllm-env: $(STAMP)
	$(BIN)/python -m maserve_prefect.engines.vllm.venv --lock $(VLLM_LOCK)

# ruff, then the architecture: import-linter's contracts in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy maserve_prefect predictors flows tasks bindings

clean:
	rm -rf $(VENV) build *.egg-info
