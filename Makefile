# Every target creates or refreshes .venv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint demo venv clean opencode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,demo]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check django_outbox tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check django_outbox tests
	$(BIN)/ruff format --check django_outbox tests

# The real opencode server (npm opencode-ai, pinned) for the integration tests,
# installed into the git-ignored .opencode/ folder.
opencode:
	sh scripts/install-opencode.sh

clean:
	rm -rf $(VENV) var .pytest_cache
