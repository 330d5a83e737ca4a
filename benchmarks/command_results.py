"""Run the surgery commands the head report quotes, each in a fresh process, and save their --json results where
the report reads them (the report says what the commands do, from their own output).

    python benchmarks/command_results.py [--model smollm2] [--only prune,merge,heal] [--results DIR]

Runs, one after the other (never together: each is timed alone),
    headcount prune    --model M --fraction 0.2 --out TMP --json                  -> DIR/commands/M-prune-0.2.json
    headcount merge-kv --model M --kv-heads 1 --json                              -> DIR/commands/M-merge-kv-1.json
    headcount prune    --model M --fraction 0.5 --heal-steps 200 --out TMP --json -> DIR/commands/M-prune-0.5-heal-200.json
(DIR: benchmarks/results/). Each file is the JSON the command printed: it carries `weights_sha256` (the model's
weights before the edit) and `command`, and the report (report/commands.py) shows it only for those weights.
On smollm2 on 2 cores the three take about 15 minutes in all (the heal most of it). `--extra-args` passes more
flags to every command (tests use it for small settings; the saved results are the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from headcount.report.commands import COMMANDS, COMMANDS_DIR, command_args, file_name  # noqa: E402


def last_json(stdout: str) -> dict:
    """The JSON object a command printed with --json (the last top-level object on stdout)."""
    start = stdout.find("{")
    while start != -1:
        try:
            data, end = json.JSONDecoder().raw_decode(stdout[start:])
            if isinstance(data, dict) and not stdout[start + end:].strip():
                return data
        except ValueError:
            pass
        start = stdout.find("{", start + 1)
    raise ValueError("no JSON object at the end of the command's output")


def run_command(kind: str, model: str, results: Path, *, extra: list[str] = (), python: str = sys.executable,
                env: dict | None = None) -> Path:
    """Run one command in a fresh process (--out in a temporary folder, removed after) and save its JSON."""
    with tempfile.TemporaryDirectory(prefix="headcount-command-") as tmp:
        args = [a if a != "DIR" else str(Path(tmp) / "out") for a in command_args(kind, model)]
        args = [*args[:-1], *extra, args[-1]]  # extra flags before the final --json
        cmd = [python, "-m", "headcount", *args]
        print(f"$ headcount {' '.join(args)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        if env is None:  # this checkout's headcount, whatever the environment has installed
            env = os.environ.copy()
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{kind}: `headcount {' '.join(args)}` exited with {proc.returncode}")
        data = last_json(proc.stdout)
        print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if not data.get("weights_sha256"):
        raise SystemExit(f"{kind}: the command's JSON has no weights_sha256 (an older headcount?)")
    path = results / COMMANDS_DIR / file_name(kind, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp_path, path)
    print(f"  saved {path.relative_to(results.parent) if results.parent in path.parents else path}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--only", default=",".join(COMMANDS), help=f"comma-separated among {', '.join(COMMANDS)}")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--extra-args", default="", help="more flags for every command (tests only)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in kinds if k not in COMMANDS]
    if bad:
        parser.error(f"--only: expected some of {', '.join(COMMANDS)}, got {', '.join(bad)}")
    for kind in kinds:
        run_command(kind, args.model, args.results, extra=args.extra_args.split())


if __name__ == "__main__":
    main()
