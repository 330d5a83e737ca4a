"""`headcount bench scale`: how the cost of dissection grows with the model — time and peak memory of the
commands a user runs (perplexity, importance, prune, report), each in a fresh process, on several models,
with the slope against parameters.

Every step is the real command line (`python -m headcount ...`) with its defaults plus the options given;
peak resident memory is the child's own VmHWM, written by the child itself at exit (a wrapper's atexit
hook; polled from /proc while it runs, for a child that is killed). Not ru_maxrss: Linux carries the
forking parent's resident size into the child's ru_maxrss across exec, which would add the parent's; forward_equivalents and the model's size are read from the command's --json where it reports
them. The slope is the least-squares exponent b of seconds ~ params^b over the models measured (b ~ 1:
linear).

Nothing here imports a model: the steps are subprocesses, so this module sits low (measure layer).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODELS = ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
STEPS = ("perplexity", "importance", "prune", "report")


@dataclass
class Step:
    model: str
    step: str
    dtype: str
    seconds: float
    peak_rss_bytes: int
    returncode: int
    params: int | None = None
    forward_equivalents: float | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ScaleResult:
    steps: list[Step] = field(default_factory=list)
    slopes: dict = field(default_factory=dict)  # step -> exponent b of seconds ~ params^b
    rss_slopes: dict = field(default_factory=dict)  # step -> exponent b of peak RSS ~ params^b

    def to_json(self) -> dict:
        return {"steps": [s.to_json() for s in self.steps], "slopes": self.slopes, "rss_slopes": self.rss_slopes}


def command(step: str, model: str, dtype: str, out: Path, *, windows: int | None = None) -> list[str]:
    """The command line of one step: a user's command with its defaults (and --windows if given)."""
    base = [sys.executable, "-m", "headcount"]
    if step == "perplexity":
        return base + ["perplexity", "--model", model, "--dtype", dtype, "--json"]
    if step == "importance":
        extra = [] if windows is None else ["--windows", str(windows)]
        return base + ["importance", "--model", model, "--dtype", dtype, "--json"] + extra
    if step == "prune":
        extra = [] if windows is None else ["--calibration-windows", str(windows)]
        return base + ["prune", "--model", model, "--dtype", dtype, "--fraction", "0.2", "--out",
                       str(out / "pruned"), "--force", "--json"] + extra
    if step == "report":  # from an empty cache: the bench measures the report's work, not a read of its cache
        return base + ["report", "--model", model, "--dtype", dtype, "--out", str(out / "report"), "--no-cache"]
    raise ValueError(f"step: expected one of {', '.join(STEPS)}, got {step!r}")


def _last_json(text: str):
    """The command's JSON document (its whole stdout, or the last line that parses)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        for line in reversed(text.strip().splitlines()):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


_WRAPPER = """
import atexit, runpy, sys
out = sys.argv[1]
def _hwm():
    try:
        with open("/proc/self/status") as f:
            kb = [line.split()[1] for line in f if line.startswith("VmHWM:")]
        with open(out, "w") as f:
            f.write(kb[0] if kb else "")
    except OSError:
        pass
atexit.register(_hwm)
kind, target = sys.argv[2], sys.argv[3]
sys.argv = [target] + sys.argv[4:]
if kind == "-m":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
"""


def _vm_hwm(pid: int) -> int:
    """A running process's peak resident bytes (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def run_step(step: str, model: str, dtype: str = "fp32", *, windows: int | None = None,
             timeout: float | None = None) -> Step:
    """Run one step in a fresh process: its wall time, its own peak RSS and what its --json says."""
    with tempfile.TemporaryDirectory(prefix="headcount-scale-") as tmp:
        cmd = command(step, model, dtype, Path(tmp), windows=windows)
        hwm_file = Path(tmp) / "vmhwm"
        wrapped = [cmd[0], "-c", _WRAPPER, str(hwm_file)] + cmd[1:] if cmd[1] in ("-m", "-c") else cmd
        t0 = time.perf_counter()
        peak = 0
        with open(Path(tmp) / "stdout", "w+") as out, open(Path(tmp) / "stderr", "w+") as err:
            proc = subprocess.Popen(wrapped, stdout=out, stderr=err, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            while True:
                peak = max(peak, _vm_hwm(proc.pid))
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
                if pid:
                    break
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    proc.kill()
                    pid, status = os.waitpid(proc.pid, 0)
                    break
                time.sleep(0.2)
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            seconds = time.perf_counter() - t0
            out.seek(0)
            err.seek(0)
            text, errors = out.read(), err.read()
        try:
            peak = max(peak, int(hwm_file.read_text()) * 1024)
        except (OSError, ValueError):
            pass
    code = proc.returncode
    result = Step(model, step, dtype, round(seconds, 1), peak, code)
    if code != 0:
        result.error = (errors.strip().splitlines() or [f"exit {code}"])[-1][:300]
        return result
    data = _last_json(text)
    if isinstance(data, dict):
        info = data.get("info") if isinstance(data.get("info"), dict) else {}
        fe = data.get("forward_equivalents", info.get("forward_equivalents"))
        result.forward_equivalents = None if fe is None else float(fe)
        params = data.get("params_before") or data.get("params")
        result.params = int(params) if isinstance(params, (int, float)) else None
    return result


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares b of y ~ x^b (log-log); None with fewer than two distinct x."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x and y and x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 3)


def run(models=MODELS, steps=STEPS, dtypes=("fp32",), *, windows: int | None = None, timeout: float | None = None,
        progress=None) -> ScaleResult:
    """Every (model, dtype, step), in that order; a model's parameter count comes from any step that says it."""
    for step in steps:
        if step not in STEPS:
            raise ValueError(f"steps: expected some of {', '.join(STEPS)}, got {step!r}")
    result = ScaleResult()
    for model in models:
        for dtype in dtypes:
            for step in steps:
                s = run_step(step, model, dtype, windows=windows, timeout=timeout)
                result.steps.append(s)
                if progress is not None:
                    progress(s)
        known = next((s.params for s in result.steps if s.model == model and s.params), None)
        for s in result.steps:
            if s.model == model and s.params is None:
                s.params = known
    for step in steps:
        ok = [s for s in result.steps if s.step == step and s.returncode == 0 and s.dtype == dtypes[0]]
        result.slopes[step] = slope([(s.params, s.seconds) for s in ok])
        result.rss_slopes[step] = slope([(s.params, s.peak_rss_bytes) for s in ok])
    return result


def render(result: ScaleResult, console) -> None:
    from rich.table import Table

    table = Table(title="headcount bench scale: each command in a fresh process, defaults")
    for col in ("model", "params", "dtype", "step", "seconds", "peak RSS", "fwd-equiv", "note"):
        table.add_column(col)
    for s in result.steps:
        table.add_row(s.model, f"{s.params / 1e6:.0f}M" if s.params else "", s.dtype, s.step, f"{s.seconds:.1f}",
                      f"{s.peak_rss_bytes / 2**30:.2f} GiB",
                      "" if s.forward_equivalents is None else f"{s.forward_equivalents:.2f}",
                      s.error or "")
    console.print(table)
    for title, slopes in (("seconds", result.slopes), ("peak RSS", result.rss_slopes)):
        given = [f"{k} {v}" for k, v in slopes.items() if v is not None]
        if given:
            console.print(f"slope of {title} ~ params^b: " + ", ".join(given))
