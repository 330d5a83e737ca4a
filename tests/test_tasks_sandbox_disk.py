"""The sandbox's footprint is bounded (tasks/sandbox.py), tested as an attacker would: programs that write 15 MiB
files in a loop to /tmp, /dev/shm, their directory and every other place they find writable, two at once, while
this test watches the machine's available memory and disk; programs that make files until the inodes run out,
open files until the descriptors run out; each fails its own problem and the next one scores. Under every
isolation that works here."""

from __future__ import annotations

import shutil
import tempfile
import threading

import pytest

from headcount.tasks import Completion, Problem, sandbox
from headcount.tasks.scoring import program, score

PROBLEM = Problem("t/0", "def f():\n", "def check(candidate):\n    assert candidate() == 1\n", "f")
BOUND = 16 << 20  # each program's disk budget here
SLACK = 400 << 20  # the interpreters themselves, and whatever else this shared machine does meanwhile
TIMEOUT = 3.0

# every directory it can write (the usual places, then a walk three levels deep), 15 MiB files into each until a
# write fails; then the failure it met last is raised: the program fails its own problem
FILLER = """\
    import errno, os
    places = ['/tmp', '/dev/shm', '.', '/var/tmp', '/run/lock', '/dev', '/dev/mqueue', '/run', '/home', '/root']
    for root, dirs, files in os.walk('/'):
        if root.startswith(('/proc', '/sys')) or root.count('/') > 3:
            dirs[:] = []
            continue
        places.append(root)
    chunk = b'x' * (1 << 20)
    last = None
    for place in dict.fromkeys(places):
        if not os.access(place, os.W_OK):
            continue
        for i in range(1000):
            try:
                with open(os.path.join(place, f'fill-{i}'), 'wb') as f:
                    for _ in range(15):
                        f.write(chunk)
            except OSError as e:
                last = e
                break
    raise last
"""


@pytest.fixture(params=["bwrap", "uid"])
def mode(request, monkeypatch):
    if sandbox._working(request.param) is None:
        pytest.skip(f"{request.param} does not work here: {sandbox._reasons.get(request.param)}")
    monkeypatch.setattr(sandbox, "isolation", lambda: request.param)
    return request.param


def _available() -> int:
    return sandbox._available_memory()


class _Watch:
    """The lowest available memory and free disk (/ and the temporary directory) seen while it runs."""

    def __init__(self):
        self.memory, self.disk = _available(), self._disk()
        self.low_memory, self.low_disk = self.memory, self.disk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _disk() -> int:
        return min(shutil.disk_usage("/").free, shutil.disk_usage(tempfile.gettempdir()).free)

    def _run(self):
        while not self._stop.wait(0.02):
            self.low_memory = min(self.low_memory, _available())
            self.low_disk = min(self.low_disk, self._disk())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_filling_every_writable_place_is_bounded_and_fails_its_own_problem(mode):
    completions = [Completion("t/0", FILLER)] * 2  # two at once: what eval runs beside a loaded model
    with _Watch() as watch:
        results = score([PROBLEM], completions, timeout=TIMEOUT, disk_bytes=BOUND, workers=2)
    assert watch.memory - watch.low_memory < 2 * BOUND + SLACK, (watch.memory, watch.low_memory)
    assert watch.disk - watch.low_disk < 2 * BOUND + SLACK, (watch.disk, watch.low_disk)
    for r in results:
        assert not r.passed and "No space left on device" in r.result, r.result
    # the mounts went with the programs, and the next problem scores
    assert _available() > watch.memory - SLACK
    assert sandbox.run_program(program(PROBLEM, "    return 1\n"), timeout=TIMEOUT, disk_bytes=BOUND).passed


def test_a_program_within_the_budget_writes_what_it_needs(mode):
    body = ("    import os\n    for d in ('/tmp', '/dev/shm', '.'):\n"
            "        with open(os.path.join(d, 'data'), 'wb') as f:\n            f.write(b'x' * (2 << 20))\n"
            "    return 1\n")
    assert sandbox.run_program(program(PROBLEM, body), timeout=TIMEOUT, disk_bytes=BOUND).passed


def test_inodes_run_out_before_memory(mode):
    body = ("    import os\n    os.mkdir('d')\n    n = 0\n    while True:\n"
            "        open(f'd/{n}', 'w').close()\n        n += 1\n")
    result = sandbox.run_program(program(PROBLEM, body), timeout=TIMEOUT, disk_bytes=BOUND)
    if mode == "bwrap" and not sandbox._working("bwrap").prepared:
        pytest.skip("bubblewrap as a user: its tmpfs mounts take no inode limit")
    assert result.status == "failed" and "No space left on device" in result.detail, result


def test_descriptors_and_the_oom_killers_choice_are_bounded(mode):
    body = ("    import os\n    adj = int(open('/proc/self/oom_score_adj').read())\n    n = 0\n    try:\n"
            "        while True:\n            os.open('/dev/null', os.O_RDONLY)\n            n += 1\n"
            "    except OSError:\n        pass\n"
            f"    return 1 if n < {sandbox.OPEN_FILES} and adj == 1000 else 0\n")
    assert sandbox.run_program(program(PROBLEM, body), timeout=TIMEOUT).passed


@pytest.mark.parametrize("value", [0, -1, 1000, 1 << 60])
def test_bad_disk_budgets_are_refused(value):
    with pytest.raises(ValueError, match="--sandbox-disk"):
        sandbox.check_disk_bytes(value)


def test_bubblewraps_own_sized_mounts_bound_it_too():
    # the way a user without root gets (bwrap's --size tmpfs mounts): here run as nobody, started by root
    if sandbox._working("bwrap") is None or sandbox._system_python() is None:
        pytest.skip("no bubblewrap here")
    import os

    if os.geteuid() != 0:
        pytest.skip("run as root: the user's own way is the one the other tests use")
    way = sandbox._Way("bwrap", sandbox._system_python(), nobody=True)
    with _Watch() as watch:
        result = sandbox._execute(way, program(PROBLEM, FILLER), timeout=TIMEOUT, memory_bytes=1 << 30,
                                  disk_bytes=BOUND)
    assert watch.memory - watch.low_memory < BOUND + SLACK
    assert not result.passed and "No space left on device" in result.detail, result
