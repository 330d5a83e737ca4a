"""The `headcount` command's heap policy: large blocks go back to the OS when freed (glibc; elsewhere nothing).

glibc serves a block above its mmap threshold with its own mmap and unmaps it on free, but the threshold is
dynamic: each freed mapped block RAISES it (up to 32 MiB), after which blocks of that size come from the heap
and stay in the process when freed. A dissection allocates and frees activations of a few MiB to tens of MiB
batch after batch, so the resident size climbs past what is live. A fixed threshold (setting it turns the
dynamic one off) keeps every block above it returned, which lowers a large model's peak at the same speed.

The price is a page fault per fresh page of every large block, which on a small model costs time and saves no
memory, so the commands set it only for a model of BOUND_FROM bytes of weights or more
(models.options.load_model, once the model is loaded). docs/scale.md ("Memory") has both measurements. Importing headcount as a library changes no allocator.
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
