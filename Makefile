# Two entry points, each working on a fresh machine with only python3:
#   make run   set up .venv and serve the embedded default config
#   make test  set up .venv (with test extras) and run every test
#   make bench the side-by-side benchmark suite (bench/results/latest.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test setup check clean protos bench

$(BIN)/gateway: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(BIN)/gateway

setup: $(BIN)/gateway

run: setup
	$(BIN)/gateway serve

test: setup
	sh scripts/ensure-prometheus.sh
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Regenerate gateway/protocols/v2_grpc/generated/ from protos/ (grpcio-tools
# comes with the test extra); tests/test_grpc_protos.py checks it is current.
protos: setup
	$(BIN)/python protos/generate.py

# Installs wrk and nginx (Debian) and matplotlib when missing, then runs every
# scenario once; BENCH_ARGS='--quick' or '--only a,c' narrows it.
bench: setup
	bench/install_tools.sh
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python bench/run.py $(BENCH_ARGS)

check: setup
	$(BIN)/gateway check --config config/gateway.yaml

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
