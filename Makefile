# Every target creates .venv on first use and installs the project with what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test soak demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m mypy --cache-dir $(VENV)/mypy_cache  # the [tool.mypy] config in pyproject.toml
	$(BIN)/python -m pytest -q -p no:cacheprovider

soak: $(STAMP)
	CTXRT_SOAK=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m soak

demo: $(STAMP)
	$(BIN)/python -m ctxrt demo

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
