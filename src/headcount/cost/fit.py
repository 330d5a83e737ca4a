"""The memory-budget solver: the longest context (or largest batch) whose weights + KV cache fit."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from headcount.arguments import positive_int
from headcount.cost.accounts import kv_cache, param_counts
from headcount.cost.shape import CostError, ModelShape, parse_dtype

# Binary units are powers of 1024 (GiB), decimal ones powers of 1000 (GB): 80GiB != 80GB.
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5, "pb": 1000**5,
}
_BUDGET = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_budget(text: str) -> int:
    """'80GiB' -> 85899345920, '80GB' -> 80000000000, '1.5TiB', '512MiB', '1000000' (bytes)."""
    if not isinstance(text, str):
        raise CostError(f"memory budget: expected text such as 80GiB, got {text!r}")
    m = _BUDGET.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise CostError(f"cannot parse memory budget {text!r}; write a number and a unit, e.g. 80GiB, 80GB, "
                        "1.5TiB, 512MiB")
    try:
        value = Decimal(m.group(1)) * _UNITS[m.group(2).lower()]
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise CostError(f"cannot parse memory budget {text!r}") from None
    nbytes = int(value)
    if nbytes <= 0:
        raise CostError(f"memory budget {text!r} is not a positive number of bytes")
    return nbytes


def parse_seq(text: str) -> int:
    """A context length: '8192', '8k' (= 8192), '128K' (= 131072), '1M' (= 1048576)."""
    s = str(text).strip().lower().replace(",", "").replace("_", "")
    mult = 1
    if s.endswith("k"):
        s, mult = s[:-1], 1024
    elif s.endswith("m"):
        s, mult = s[:-1], 1024**2
    if not s.lstrip("-").isdigit():
        raise CostError(f"seq: expected a whole number of tokens such as 4096 or 8k, got {text!r}")
    value = int(s) * mult
    if value <= 0:
        raise CostError(f"seq: expected a positive number of tokens, got {text!r}")
    return value


def fit(shape: ModelShape, budget_bytes: int, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16",
        kv_only: bool = False) -> dict:
    """Solve weights + batch x context x KV bytes per token <= budget, for the context and for the batch.

    Only the weights and the KV cache are counted (no activations, no score matrices, no allocator slack).
    kv_only: the budget is the KV cache's alone (what vLLM gives its cache: VLLM_CPU_KVCACHE_SPACE on a CPU, what
    gpu_memory_utilization leaves on a GPU), so the weights are not taken from it.
    """
    positive_int("memory budget", budget_bytes, expected="a positive number of bytes", error=CostError)
    for name, value in (("batch", batch), ("seq", seq)):
        positive_int(name, value, expected="a positive whole number", error=CostError)
    _, nbytes = parse_dtype(dtype)
    weights = 0 if kv_only else param_counts(shape)["total"] * nbytes
    per_token = kv_cache(shape, 1, 1, nbytes)["bytes_per_token"]
    left = max(budget_bytes - weights, 0)
    max_context = _max_context(shape, left, batch, nbytes)
    per_sequence = kv_cache(shape, 1, seq, nbytes)["bytes_for_context"]
    max_batch = left // per_sequence
    window = shape.max_positions or None
    result = {
        "budget_bytes": budget_bytes,
        "weights_bytes": weights,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_sequence": per_sequence,
        "kv_budget_bytes": left,
        "batch": batch,
        "max_context": max_context,
        "seq": seq,
        "max_batch": max_batch,
        "context_window": window,
        "counts": ("the KV cache alone (the budget an engine gives its cache; weights and activations apart)"
                   if kv_only else "weights + KV cache only (no activations, no score matrices)"),
        "kv_only": kv_only,
    }
    if shape.sliding_window is not None:
        result["counts"] += (f"; local layers cache at most {shape.sliding_window} positions, so past the window "
                             f"only the {shape.global_layers} global layers grow")
    if budget_bytes - weights <= 0 and not kv_only:
        result["note"] = "the weights alone do not fit the budget"
    elif max_context is None:
        result["note"] = (f"every layer is local: the KV cache stops growing at the {shape.sliding_window}-token "
                          "window, so any context fits")
    elif window and max_context > window:
        result["note"] = f"more than the model's context window of {window} tokens"
    return result


def _max_context(shape: ModelShape, left: int, batch: int, nbytes: int) -> int | None:
    """The largest n with batch x KV(n) <= left; None when the cache never outgrows the window (no global layer).

    KV(n) = c (global_layers n + local_layers min(n, w)), c = 2 n_kv_heads head_dim bytes: linear in n
    with slope c n_layers up to the window, c global_layers after it."""
    c = kv_cache(shape, 1, 1, nbytes)["bytes_per_token_per_layer"] * batch
    full = left // (c * shape.n_layers)
    w = shape.sliding_window
    if w is None or full <= w:
        return full
    if shape.global_layers == 0:
        return None
    return (left - c * shape.local_layers * w) // (c * shape.global_layers)
