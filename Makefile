# creditlens — `make run` serves the app with demo data; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.creditlens-installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test bench lint fixtures clean

$(STAMP): pyproject.toml setup.py estimators/_native.c Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch from this machine's disk; any other spec downloads a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,verl,postgres]"
	# verl is the reference our estimators are checked against; its own deps are GPU-sized.
	$(PY) -m pip install -q --no-deps verl==0.9.1
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/creditlens serve --host $(HOST) --port $(PORT) --demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) -m bench

lint: install
	$(VENV)/bin/ruff check app estimators tests bench
	$(VENV)/bin/ruff format --check app estimators tests bench

fixtures: install
	$(PY) -m app.sim.make_fixtures

clean:
	rm -rf $(VENV) .pytest_cache
