# The two commands of the README: `make lab` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: lab test lint typecheck pytest bench notebooks clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# constraints.txt pins what must not drift (torch's CPU build): every install goes through it.
PIP_INSTALL := $(BIN)/python -m pip install --quiet -c constraints.txt

$(VENV)/.lab: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[lab]'
	touch $@

$(VENV)/.test: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	touch $@

# Root (CI, containers) needs --allow-root; LAB_ARGS passes more, e.g. LAB_ARGS=--no-browser.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(VENV)/.lab
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

test: $(VENV)/.test lint typecheck pytest

lint: $(VENV)/.test
	$(BIN)/ruff check labserve widgets tests benchmarks scripts
	$(BIN)/ruff format --check labserve widgets tests benchmarks scripts

typecheck: $(VENV)/.test
	$(BIN)/mypy

pytest: $(VENV)/.test
	$(BIN)/python -m pytest -n 2

# Re-execute the lessons in place (their saved outputs are what strict nbval compares).
notebooks: $(VENV)/.test
	$(BIN)/python scripts/run_notebooks.py

bench:
	$(MAKE) -C benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
