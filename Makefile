# Two commands for a fresh machine: `make demo` and `make test`. Each creates .venv when missing.
# `make check` is the quick loop for every edit (lint and the engine's tests, under a minute).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# The suite runs in TEST_PROCESSES processes (pytest-xdist; the tests that start whole stacks run one
# after another in one of them, tests/conftest.py). TEST_PROCESSES=1 runs it in this process.
TEST_PROCESSES ?= 2
CHECK_TESTS ?= tests/test_engine_*.py tests/test_lifecycle_table.py tests/test_glossary.py \
	tests/test_import_layers.py tests/test_steptime.py tests/test_network.py tests/test_agent_network.py

.PHONY: demo test check lint bench clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	MYRIAD_DEBUG=$${MYRIAD_DEBUG:-1} $(PY) manage.py migrate --noinput
	MYRIAD_DEBUG=$${MYRIAD_DEBUG:-1} $(PY) manage.py build_cluster demo --if-empty
	MYRIAD_DEBUG=$${MYRIAD_DEBUG:-1} $(PY) manage.py seed_queues
	MYRIAD_DEBUG=$${MYRIAD_DEBUG:-1} $(PY) manage.py create_login operator --role operator
	@echo "Serving Myriad on http://$(HOST):$(PORT)/ (log in with the operator login above)"
	MYRIAD_DEBUG=$${MYRIAD_DEBUG:-1} MYRIAD_SIMULATED_FLEET=$${MYRIAD_SIMULATED_FLEET:-1} $(PY) manage.py runstack $(HOST):$(PORT)

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES)) $(PYTEST_ARGS)

check: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q $(CHECK_TESTS) $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(VENV)/.installed
	$(PY) -m bench.build_cluster
	$(PY) -m bench.scheduling_engine
	$(PY) -m bench.scheduling_e2e
	$(PY) -m bench.ettr
	$(PY) -m bench.plans
	$(PY) -m bench.packing
	$(PY) -m bench.simulate
	$(PY) -m bench.live_tick
	$(PY) -m bench.dashboard
	$(PY) -m bench.ingest
