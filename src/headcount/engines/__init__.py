"""Other engines as measured peers: llama.cpp (node-llama-cpp) and vLLM, always out of process, and headcount's
own engine run the same way, so that `headcount bench serve` measures each in a fresh process of its own.

- `rows.py`: ServeRow (the row `bench serve --json` prints: its keys are a contract), EngineUnavailable.
- `processes.py`: a child process run with a timeout, its JSON answer, its peak resident memory.
- `headcount_engine.py` + `headcount_worker.py`: headcount's KV cache and generation, batched, in a child.
- `llamacpp_engine.py` (+ tools/llamacpp/serve.mjs): the GGUF `export --to gguf` writes, run by node-llama-cpp.
- `vllm_engine.py` + `vllm_worker.py`: what `export --to vllm` writes, run by `.venv-vllm/bin/python`.
- `serve.py` (the rows, in order), `table.py` (ratios to the unedited model beside the predictions), `plots.py`
  (the PNG), `cli.py`: `headcount bench serve`. The predictions are headcount.cost.edited's.
"""
