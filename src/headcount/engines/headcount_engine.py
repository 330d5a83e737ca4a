"""headcount's own engine as `bench serve` measures it: headcount_worker.py in a fresh process per row (its peak
memory is the row's own), fp32 weights and an fp32 KV cache."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from headcount.engines.processes import run_json

KV_DTYPE = "fp32"
WEIGHT_DTYPE = "fp32"


def serve(model: str, prompt: list[int], *, batch: int, new_tokens: int, threads: int, timeout: float = 3600) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"model": model, "prompt": prompt, "batch": batch, "new_tokens": new_tokens, "threads": threads}, f)
    try:
        return run_json([sys.executable, "-m", "headcount.engines.headcount_worker", f.name], timeout=timeout,
                        what="headcount")
    finally:
        os.unlink(f.name)
