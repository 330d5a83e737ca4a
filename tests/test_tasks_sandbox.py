"""tasks/sandbox.py against hostile and broken completions: each fails its own problem and never the run, the
test process, the user's files, network or environment. Run under every isolation that works here (bwrap;
uid when root); skipped for one that does not."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from headcount.tasks import Problem, SandboxUnavailable, run_program
from headcount.tasks import sandbox
from headcount.tasks.scoring import program

PROBLEM = Problem("t/0", "def f():\n", "def check(candidate):\n    assert candidate() == 1\n", "f")
TIMEOUT = 2.0  # for the hostile ones: each returns well within it unless it loops


def run(body: str, **kw):
    """The completion `body` (the function's indented body, and anything after it) as its problem's program."""
    return run_program(program(PROBLEM, body), timeout=kw.pop("timeout", TIMEOUT), **kw)


@pytest.fixture(params=["bwrap", "uid"])
def mode(request, monkeypatch):
    if sandbox._working(request.param) is None:
        pytest.skip(f"{request.param} does not work here: {sandbox._reasons.get(request.param)}")
    monkeypatch.setattr(sandbox, "isolation", lambda: request.param)
    return request.param


def _processes_with(token: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if token.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _gone(token: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _processes_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_isolation_is_probed_once_and_named():
    assert sandbox.isolation() in ("bwrap", "uid", None)
    assert sandbox.isolation() == sandbox.isolation()


def test_right_wrong_and_broken(mode):
    assert run("    return 1\n").status == "passed"
    wrong = run("    return 2\n")
    assert (wrong.status, wrong.detail) == ("failed", "AssertionError")
    assert run("    return undefined_name\n").detail == "NameError: name 'undefined_name' is not defined"
    syntax = run("    return (\n")
    assert syntax.status == "failed" and syntax.detail.startswith("SyntaxError")


def test_a_replaced_stdout_still_reports(mode):
    assert run("    import io, sys\n    sys.stdout = io.StringIO()\n    return 1\n").passed


@pytest.mark.parametrize("body", ["    import sys\n    sys.exit(0)\n", "    import os\n    os._exit(0)\n",
                                  "    return 1\nimport os\nos._exit(0)\n"])
def test_an_early_clean_exit_is_not_a_pass(mode, body):
    result = run(body)
    assert (result.status, result.detail) == ("failed", "exited early with status 0 before check() returned")


def test_an_endless_loop_times_out(mode):
    start = time.monotonic()
    result = run("    while True:\n        pass\n")
    assert result.status == "timed out" and not result.passed
    assert time.monotonic() - start < TIMEOUT + 5


def test_memory_bombs_fail(mode):
    at_once = run("    x = bytearray(1 << 40)\n    return 1\n")
    assert (at_once.status, at_once.detail) == ("failed", "MemoryError")
    growing = run("    chunks = []\n    while True:\n        chunks.append(bytearray(1 << 24))\n",
                  memory_bytes=256 << 20)
    assert growing.status == "failed"


def test_an_output_flood_fails_and_is_capped(mode):
    result = run("    import sys\n    sys.stdout.write('x' * (32 << 20))\n    return 1\n")
    assert result.status == "failed" and "16 MiB" in result.detail


@pytest.mark.parametrize("how", ["subprocess", "setsid"])
def test_no_process_outlives_its_program(mode, how):
    token = f"headcount-{secrets.token_hex(8)}"
    sleeper = f"['/usr/bin/python3', '-c', 'import time; time.sleep(1000)', {token!r}]"
    body = {"subprocess": f"    import subprocess\n    subprocess.Popen({sleeper})\n    return 1\n",
            # a daemon: fork, setsid, fork again, so neither its parent nor its process group holds it
            "setsid": (f"    import os\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
                       f"            os.execv('/usr/bin/python3', {sleeper})\n        os._exit(0)\n    return 1\n")}[how]
    result = run(body)
    assert result.passed  # leaving a process behind is not wrong, only never allowed to last
    assert _gone(token), f"still running: {_processes_with(token)}"


def test_writes_never_reach_home_or_the_working_directory(mode):
    name = f"headcount-{secrets.token_hex(8)}"
    for target in [Path.home() / name, Path.cwd() / name]:
        result = run(f"    open({str(target)!r}, 'w').write('x')\n    return 1\n")
        assert result.status == "failed", target
        assert not target.exists(), target
    if mode == "bwrap":  # its /tmp is its own (uid mode runs on the real file system, where /tmp is everyone's)
        target = Path(tempfile.gettempdir()) / name
        run(f"    open({str(target)!r}, 'w').write('x')\n    return 1\n")
        assert not target.exists()


def test_the_test_process_survives_kills(mode):
    for body in ["    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
                 "    import os, signal\n    os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n",
                 "    import os, signal\n    os.kill(-1, signal.SIGKILL)\n"]:
        assert run(body).status == "failed"
    assert run("    return 1\n").passed  # and the sandbox still works


def test_no_network(mode):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        result = run(f"    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                     f"    return 1\n")
        assert result.status == "failed"
        with pytest.raises(BlockingIOError):  # nobody knocked
            listener.accept()
    finally:
        listener.close()


def test_no_environment(mode, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_SECRET", "xyz")
    result = run("    import os\n    return 1 if os.environ.get('HEADCOUNT_SECRET') == 'xyz' else 0\n")
    assert result.status == "failed"
    allowed = {"PATH", "LANG", "PWD", "LC_CTYPE", "PYTHONHASHSEED"}
    assert run(f"    import os\n    return 1 if set(os.environ) <= {allowed!r} else 0\n").passed


def test_a_sets_order_of_strings_is_the_same_on_every_run(mode):
    """A completion that leans on a set's order (max over a set with ties) gets one verdict, not a coin flip: the
    order is the one a plain python3 gives under PYTHONHASHSEED=0 (and, without a fixed seed, 20 words' order
    matches it by chance with odds far below one in a million)."""
    import subprocess
    import sys

    words = [f"w{i}" for i in range(20)]
    code = f"print(','.join(set({words!r})))"
    expected = subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": "0"}, capture_output=True,
                              text=True, check=True).stdout.strip()
    body = f"    return 1 if ','.join(set({words!r})) == {expected!r} else 0\n"
    assert all(run(body).passed for _ in range(3))


def test_several_at_once(mode):
    bodies = ["    return 1\n", "    return 2\n"] * 3
    results = [None] * len(bodies)

    def one(i):
        results[i] = run(bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.passed for r in results] == [True, False] * 3


def test_without_isolation_it_refuses_unless_unsafe(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: None)
    with pytest.raises(SandboxUnavailable, match="--unsafe-exec") as info:
        run("    return 1\n")
    assert "\n" not in str(info.value)
    assert run("    return 1\n", unsafe_exec=True).passed
    assert run("    return 2\n", unsafe_exec=True).detail == "AssertionError"
    monkeypatch.setenv("HEADCOUNT_SECRET", "xyz")  # the environment is scrubbed even then
    assert not run("    import os\n    return 1 if os.environ.get('HEADCOUNT_SECRET') else 0\n", unsafe_exec=True).passed


@pytest.mark.parametrize("kw, message", [({"timeout": 0}, "timeout: expected seconds > 0, got 0"),
                                         ({"memory_bytes": 1000}, "memory_bytes: expected .* got 1000")])
def test_bad_arguments(kw, message):
    with pytest.raises(ValueError, match=message):
        run_program("pass", **kw)


def test_the_program_sees_none_of_the_callers_files(mode):
    # the working directory (the project) is hidden by bwrap, and unreadable to nobody if it is not world-readable
    here = sorted(os.listdir("."))
    result = run(f"    import os\n    return 1 if sorted(os.listdir({os.getcwd()!r})) == {here!r} else 0\n")
    if mode == "bwrap":
        assert result.status == "failed"
