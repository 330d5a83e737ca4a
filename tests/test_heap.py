"""headcount.heap: the command's fixed glibc mmap threshold (set by the command only, the user's env wins)."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from headcount import heap


def _glibc() -> bool:
    try:
        ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_bound_heap_sets_the_threshold_on_glibc():
    """In a child process: the threshold it fixes would stay fixed for the rest of this test session."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", "from headcount.heap import bound_heap; print(bound_heap())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(_glibc())


def test_the_users_environment_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert heap.bound_heap() is False


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4M"])
def test_bad_threshold_names_the_argument(bad):
    with pytest.raises(ValueError, match="threshold: expected bytes"):
        heap.bound_heap(bad)
