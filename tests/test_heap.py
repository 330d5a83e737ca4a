"""headcount.heap: the command's fixed glibc mmap threshold (set by the command only, the user's env wins)."""

import ctypes
import platform

import pytest

from headcount import heap


def _glibc() -> bool:
    try:
        ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_bound_heap_sets_the_threshold_on_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert heap.bound_heap() is _glibc()


def test_the_users_environment_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert heap.bound_heap() is False


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4M"])
def test_bad_threshold_names_the_argument(bad):
    with pytest.raises(ValueError, match="threshold: expected bytes"):
        heap.bound_heap(bad)
