# The two commands of the README live here: `make run` and `make test`.
# Both create the virtual environment on first use, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,audit,chaos]'
	$(BIN)/python bench/anchors_compat/install.py
	touch $(STAMP)

setup: $(STAMP)

# The main job: see README.md.
run: setup
	$(BIN)/ledgermq demo

# The whole test suite: lint, the import contracts (pyproject.toml,
# [tool.importlinter]) and the type checker first. The tests run on
# TEST_WORKERS processes: most of them wait on clusters, sockets and fsyncs,
# not the CPU (tests/conftest.py says which tiers share a worker).
TEST_WORKERS ?= 3
test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

bench: setup
	$(BIN)/python bench/storage.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
