# Two entry points, each working on a fresh machine with only python3:
#   make run   set up .venv and serve the embedded default config
#   make test  set up .venv (with test extras) and run every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test setup check clean

$(BIN)/gateway: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[fast,test]'
	touch $(BIN)/gateway

setup: $(BIN)/gateway

run: setup
	$(BIN)/gateway serve

test: setup
	sh scripts/ensure-prometheus.sh
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

check: setup
	$(BIN)/gateway check --config config/gateway.yaml

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
