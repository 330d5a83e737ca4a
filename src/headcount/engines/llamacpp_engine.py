"""llama.cpp as a measured peer: the GGUF `headcount export --to gguf` writes, served by node-llama-cpp (pinned
in tools/llamacpp; `make llamacpp` installs it) through tools/llamacpp/serve.mjs, with llama.cpp's default f16
KV cache."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from headcount.engines.processes import run_json
from headcount.engines.rows import EngineUnavailable

KV_DTYPE = "fp16"  # llama.cpp's default cache type, the one served here
WEIGHT_DTYPE = "fp32"  # the f32 GGUF: the same weights as headcount's fp32 model
# uneven GQA groups (a query-mode prune) padded with zero query heads where that writes the smaller KV cache,
# so the served file keeps the model's KV cache instead of growing it with K/V copies
GROUPS = "auto"


def tools_dir() -> Path:
    """tools/llamacpp of this checkout ($HEADCOUNT_LLAMACPP_DIR overrides)."""
    env = os.environ.get("HEADCOUNT_LLAMACPP_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "tools" / "llamacpp"


def check() -> Path:
    """The serve.mjs to run, or EngineUnavailable naming what is missing."""
    tools = tools_dir()
    if shutil.which("node") is None:
        raise EngineUnavailable("llamacpp: Node.js is not installed (node-llama-cpp needs node >= 20)")
    if not (tools / "serve.mjs").is_file():
        raise EngineUnavailable(f"llamacpp: {tools}/serve.mjs not found (run from a headcount checkout)")
    if not (tools / "node_modules" / "node-llama-cpp").is_dir():
        raise EngineUnavailable("llamacpp: node-llama-cpp is not installed (`make llamacpp`)")
    return tools / "serve.mjs"


def export(model, path: Path) -> dict:
    """The f32 GGUF of `model` at `path`, groups=GROUPS (reused when it is there: the caller's name carries the
    weights' hash and the layout), and the export's plan: the architecture llama.cpp gets and the heads it holds
    (zero heads included)."""
    from headcount.models.formats.gguf_deci import export_gguf, plan_gguf_export

    plan = plan_gguf_export(model, "f32", groups=GROUPS)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        export_gguf(model, path, dtype="f32", groups=GROUPS)
    return plan


def notes(plan: dict) -> list[str]:
    """A row's notes on what the GGUF holds: why this architecture, and which group layout was written."""
    out = [plan["reason"]]
    if plan["architecture"] == "gemma3" and plan.get("zero_query_heads"):
        out.append(f"saves nothing: {plan['zero_query_heads']} pruned query heads are written as zero heads "
                   "(llama.cpp's graph has one head count for every layer) and computed; `headcount prune --uniform` "
                   "gives a GGUF that saves")
        return out
    layouts = plan["layouts"]
    padded, copied = layouts.count("pad"), layouts.count("copy")
    if padded:
        out.append(f"groups {plan['groups']}: {padded} layer(s) with uneven GQA groups padded with "
                   f"{plan['zero_query_heads']} zero query heads (computed), each KV head written once: "
                   "the model's KV cache")
    if copied:
        out.append(f"groups {plan['groups']}: {copied} layer(s) with uneven GQA groups written with "
                   f"{plan['kv_heads_copied']} K/V heads copied")
    if not padded and not copied:
        out.append("groups: every layer's GQA groups are equal, written as they are")
    if plan.get("grows"):
        out.append("llama.cpp's cache is LARGER than the model's")
    return out


def serve(gguf: Path, prompt: list[int], *, batch: int, new_tokens: int, threads: int, timeout: float = 3600) -> dict:
    """serve.mjs's answer (see its header) for one context x batch."""
    script = check()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"prompt": prompt, "batch": batch, "new_tokens": new_tokens, "threads": threads, "kv": "f16"}, f)
    try:
        return run_json(["node", str(script), str(gguf), f.name], timeout=timeout, what="llamacpp")
    finally:
        os.unlink(f.name)
