"""The `headcount` command's heap policy: large blocks go back to the OS when freed (glibc; elsewhere nothing).

glibc serves a block above its mmap threshold with its own mmap and unmaps it on free, but the threshold is
dynamic: each freed mapped block RAISES it (up to 32 MiB), after which blocks of that size come from the heap
and stay in the process when freed. A dissection allocates and frees activations of a few MiB to tens of MiB
batch after batch, so the resident size climbs past what is live. A fixed threshold (setting it turns the
dynamic one off) keeps every block above it returned: measured on qwen2.5-coder-1.5b in bf16, the
reconstruction order's peak went from 6.17 to 5.69 GiB at 4 MiB, at the same speed (186 s against 189 s).

The price is a page fault per fresh page of every large block: on smollm2 (0.54 GB of weights) `merge-kv
--kv-heads 1` took 228 s with it against 220 s without (system time 31 s against 10 s) for the same peak (2.17 /
2.20 GB), so the commands set it only for a model of BOUND_FROM bytes of weights or more
(models.options.load_model, once the model is loaded). Importing headcount as a library changes no allocator.
MALLOC_MMAP_THRESHOLD_ in the environment (glibc's own knob) wins: then nothing is set here.
"""

from __future__ import annotations

import os

from headcount.arguments import positive_int

MMAP_THRESHOLD = 4 << 20  # bytes
BOUND_FROM = 1 << 30  # weights' bytes from which the commands fix the threshold
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def bound_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; True when set (False: not glibc, or the user's env)."""
    positive_int("threshold", threshold, 0, expected="bytes as an int >= 0")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
