"""A child process with a JSON answer on stdout: a timeout, the last line of stderr as the reason it failed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from headcount.engines.rows import EngineUnavailable


def run_json(argv: list[str], *, timeout: float, what: str, env: dict | None = None, cwd: str | Path | None = None,
             stdin: str | None = None) -> dict:
    """Run argv; its last stdout line is a JSON object. Failure -> EngineUnavailable(one line)."""
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"{what}: no answer within {timeout:.0f} s") from None
    except OSError as e:
        raise EngineUnavailable(f"{what}: could not start {argv[0]} ({e.strerror})") from None
    lines = [l for l in proc.stdout.splitlines() if l.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        errs = [l for l in proc.stderr.splitlines() if l.strip()]
        last = errs[-1].strip() if errs else f"exit status {proc.returncode}"
        raise EngineUnavailable(f"{what}: {last[:500]}")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise EngineUnavailable(f"{what}: its answer is not JSON ({lines[-1][:200]})") from None


def cpu_name() -> str:
    """The CPU's model name (lscpu's 'Model name'), for every wall time printed beside it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def peak_rss_self() -> int:
    """This process's peak resident bytes (VmHWM: not ru_maxrss, which Linux carries over from a forking parent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
