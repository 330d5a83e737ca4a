"""`headcount bench capture`: the peak memory of capture() against need_weights on every layer at once.

Each measurement runs in its own Python process (as headcount.cost.measure does): load the model,
warm up on a few tokens, reset the resident-set high-water mark (Linux /proc/self/clear_refs), run
one forward of a `length`-token window, read VmHWM - VmRSS(before) = the resident bytes the forward
added at its peak (elsewhere: the ru_maxrss delta).

    naive      model(ids, need_weights=True): every layer's weights [1, n_heads, T, T] held at once
    capture    for layer, w in capture(model, ids): one layer's weights alive at a time
    summaries  capture(model, ids, summaries=...): a per-head reduction per layer, weights dropped

The formula column: n_layers x n_heads x T^2 x 4 bytes (all weights, fp32) and n_heads x T^2 x 4
(one layer's).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from headcount.cost.measure import status_kib

MODES = ("naive", "capture", "summaries")


def _child(args: dict) -> dict:
    import torch

    from headcount.analysis.batches import token_windows
    from headcount.analysis.capturing import capture
    from headcount.models import load

    torch.set_num_threads(int(args.get("threads", 2)))
    model = load(args["model"]).eval()
    length, mode = args["length"], args["mode"]
    ids = token_windows(model, None, window=length, max_windows=1)
    with torch.no_grad():  # warm-up: kernels, allocator, hooks
        model(ids[:, :16], need_weights=True, **({"compute_logits": False} if hasattr(model, "lm_head") else {}))
        for _ in capture(model, ids[:, :16]):
            pass
    method = "VmHWM - VmRSS"
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        before = status_kib("VmRSS")
    except OSError:
        before = None
    if before is None:
        method, before = "ru_maxrss delta", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    checksum = 0.0
    with torch.no_grad():
        if mode == "naive":
            kwargs = {"compute_logits": False} if hasattr(model, "lm_head") else {}
            out = model(ids, need_weights=True, **kwargs)
            checksum = float(sum(w[..., 0].sum() for w in out.weights))
        elif mode == "capture":
            for _, w in capture(model, ids):
                checksum += float(w[..., 0].sum())
                del w
        else:
            sums = capture(model, ids, summaries=lambda layer, w: w[..., 0].sum(-1))
            checksum = float(sum(s.sum() for s in sums.values()))
    after = status_kib("VmHWM") if method.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mods = model.layers
    return {"mode": mode, "peak_bytes": (after - before) * 1024, "method": method, "length": length,
            "n_layers": len(mods), "n_heads": mods[0].attn.n_heads, "checksum": checksum}


def peak(mode: str, *, model: str = "smollm2", length: int = 1024, threads: int = 2, timeout: float = 900.0) -> dict:
    """Run one measurement in a child process; returns its dict (peak_bytes, method, ...)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    args = {"mode": mode, "model": model, "length": length, "threads": threads}
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-m", "headcount.analysis.bench", json.dumps(args)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"capture benchmark child ({mode}) failed ({proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(model: str = "smollm2", length: int = 1024, threads: int = 2) -> list[dict]:
    rows = [peak(mode, model=model, length=length, threads=threads) for mode in MODES]
    n_layers, n_heads = rows[0]["n_layers"], rows[0]["n_heads"]
    all_weights = n_layers * n_heads * length * length * 4
    for r in rows:
        r["all_weights_bytes"] = all_weights
        r["one_layer_bytes"] = n_heads * length * length * 4
    return rows


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
