"""The precision and device every command that loads a model takes (`--dtype`, `--device`), checked before
anything is loaded: a bad name, or cuda with no GPU, is one clear error naming the flag.

    load_model(name, dtype="fp32", device="cpu")   headcount.models.load, then .to(device)

Weights are stored in the chosen dtype (bf16 / fp16 halve the memory of fp32). Statistics are not: every
sum the analysis and surgery code accumulates (Gram matrices of o_proj inputs, importance sums, role
pattern sums, losses) is taken in float32 or float64 whatever the weights are.
"""

from __future__ import annotations

DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("cpu", "cuda", "auto")


def parse_dtype(name, flag: str = "--dtype"):
    """'fp32' | 'bf16' | 'fp16' (or a torch.dtype of those) -> torch.dtype."""
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if isinstance(name, torch.dtype):
        if name not in table.values():
            raise ValueError(f"{flag}: expected one of {', '.join(DTYPES)}, got {name}")
        return name
    key = str(name).strip().lower()
    key = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(key, key)
    if key not in table:
        raise ValueError(f"{flag}: expected one of {', '.join(DTYPES)}, got {name!r}")
    return table[key]


def parse_device(name, flag: str = "--device"):
    """'cpu' | 'cuda' | 'cuda:N' | 'auto' (cuda when one is available) -> torch.device."""
    import torch

    key = str(name).strip().lower()
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if key == "cpu":
        return torch.device("cpu")
    if key == "cuda" or key.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"{flag}: {name!r} asked for, but no CUDA GPU is available here (torch.cuda.is_available() "
                             "is False); use --device cpu or auto")
        device = torch.device(key)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{flag}: {name!r}: only {torch.cuda.device_count()} GPU(s) here")
        return device
    raise ValueError(f"{flag}: expected cpu, cuda, cuda:N or auto, got {name!r}")


def load_model(name, dtype="fp32", device="cpu"):
    """headcount.models.load(name) in `dtype`, moved to `device` (both checked first). The commands load through
    here: a model of BOUND_FROM bytes of weights or more also fixes the process's mmap threshold (headcount.heap)."""
    from headcount.models.zoo import load

    from headcount.heap import BOUND_FROM, bound_heap

    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    model = load(name, dtype=torch_dtype)
    if sum(p.numel() * p.element_size() for p in model.parameters()) >= BOUND_FROM:
        bound_heap()  # a large model's freed activations go back to the OS (headcount.heap)
    return model.to(torch_device) if torch_device.type != "cpu" else model


def check_finite(value: float, what: str, dtype) -> float:
    """A statistic that came out inf / NaN (fp16 activations overflow past 65,504): a clear error, never a
    model written with NaN."""
    import math

    if not math.isfinite(float(value)):
        hint = " (fp16 overflows past 65,504: use --dtype bf16 or fp32)" if "16" in str(dtype) else ""
        raise ValueError(f"--dtype: {what} is {value} in {dtype}{hint}; nothing was written")
    return value


# the help texts are declared once with the shared options (headcount.cli_options); re-exported here
from headcount.cli_options import DEVICE_HELP, DTYPE_HELP, MODEL_HELP  # noqa: E402,F401
