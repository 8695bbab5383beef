# Two entry points, each working on a fresh machine with only python3 (>= 3.11):
#   make run   set up .venv with the runtime only and serve the embedded default
#              config (CONFIG=path/to/gateway.yaml make run serves another)
#   make test  add the test extras to .venv and run every test
#   make bench the side-by-side benchmark suite (bench/results/latest.md)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?=

.PHONY: run test setup runtime check clean protos bench

# The runtime alone (what `make run` needs); test tooling (tritonclient,
# MLServer-side packages, fuzzers) only for `make test`.
$(VENV)/.runtime: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "the gateway needs Python >= 3.11 (PYTHON=$(PYTHON) is older)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

runtime: $(VENV)/.runtime
setup: $(VENV)/.test

run: runtime
	$(BIN)/gateway serve $(if $(CONFIG),--config $(CONFIG))

test: setup
	sh scripts/ensure-prometheus.sh
	sh scripts/ensure-redis.sh
	sh scripts/ensure-nginx.sh
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

check: runtime
	$(BIN)/gateway check --config $(or $(CONFIG),config/gateway.yaml)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
