"""Every user command on every family's small random checkpoint (every command must run on each family's
small config): the model that `headcount bench exactness --families` checks against transformers,
saved as a transformers checkpoint with smollm2's tokenizer beside it, then each command run as a user
would run it (a fresh process, `python -m headcount ...`). Prints one row per family: the exit status and
seconds of each command; the first line of stderr for any that failed.

    python benchmarks/families_commands.py [--families llama3,gemma2,...] [--json out.json]

Slow (dozens of processes per family): a benchmark, not a test. The report step uses --quick.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "importance": ["importance", "--windows", "2", "--window", "64", "--json"],
    "roles": ["roles", "--max-tokens", "256", "--max-sentences", "8", "--json"],
    "faithfulness": ["faithfulness", "--examples", "1", "--length", "24", "--steps", "5", "--json"],
    "rank": ["rank", "--json"],
    "prune": ["prune", "--fraction", "0.25", "--out", "{tmp}/pruned", "--force", "--calibration-windows", "2", "--eval-windows", "1", "--json"],
    "prune-l0": ["prune", "--method", "l0", "--out", "{tmp}/pruned-l0", "--fraction", "0.25", "--steps", "5", "--calibration-windows", "2",
                 "--eval-windows", "1", "--force", "--json"],
    "merge-kv": ["merge-kv", "--method", "aware", "--kv-heads", "1", "--local-steps", "2", "--uptrain-steps", "0",
                 "--calibration-windows", "2", "--eval-windows", "1", "--json"],
    "cost": ["cost", "--config", "{dir}/config.json", "--seq", "4k", "--json"],
    "report": ["report", "--quick", "--no-cache", "--out", "{tmp}/report", "--force"],
    "generate": ["generate", "hello world", "-n", "8"],
    "generate --tp 2": ["TP2"],
    "generate --tp 3": ["TP3"],
}


def save_family(family: str, directory: Path, tokenizer_dir: Path) -> None:
    """The random small model of `family` (vocabulary widened to the tokenizer's), saved for transformers."""
    import json as _json

    from headcount.models.exactness import random_transformers_model
    vocab = _json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    model = random_transformers_model(family, shape={"vocab_size": vocab, "num_hidden_layers": 2, "max_position_embeddings": 1024,
                                                     "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, directory / name)


def run(argv: list[str], env: dict) -> tuple[int, float, str]:
    start = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    err = next((line for line in reversed(p.stderr.strip().splitlines()) if line.strip()), "") if p.returncode else ""
    return p.returncode, time.perf_counter() - start, err[:200]


def main() -> int:
    from headcount.models.exactness import RANDOM_FAMILIES
    from headcount.models.zoo import checkpoint_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=None, help="comma-separated (default: every decoder family)")
    parser.add_argument("--commands", default=None, help=f"comma-separated of {', '.join(COMMANDS)}")
    parser.add_argument("--json", default=None, help="write the table here")
    args = parser.parse_args()
    families = args.families.split(",") if args.families else [f for f in RANDOM_FAMILIES if "bidirectional" not in f and "part" not in f]
    commands = args.commands.split(",") if args.commands else list(COMMANDS)
    tokenizer_dir = checkpoint_dir("smollm2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    rows = []
    for family in families:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / family
            save_family(family, directory, tokenizer_dir)
            row = {"family": family}
            for name in commands:
                argv = COMMANDS[name]
                if argv[0].startswith("TP"):
                    n = argv[0][2:]
                    full = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", n, "-m", "headcount",
                            "generate", "hello world", "-n", "8", "--tp", "--model", str(directory)]
                else:
                    full = [sys.executable, "-m", "headcount"] + [a.format(dir=directory, tmp=tmp) for a in argv]
                    if name != "cost":
                        full += ["--model", str(directory)]
                code, seconds, err = run(full, env)
                row[name] = {"rc": code, "seconds": round(seconds, 1), **({"error": err} if err else {})}
                print(f"{family:12s} {name:16s} rc={code} {seconds:6.1f}s {err}", flush=True)
            rows.append(row)
    print()
    print("| family | " + " | ".join(commands) + " |")
    print("|---|" + "---|" * len(commands))
    for row in rows:
        print(f"| {row['family']} | " + " | ".join("ok" if row[c]["rc"] == 0 else f"rc {row[c]['rc']}"
                                                   for c in commands) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(row[c]["rc"] == 0 for row in rows for c in commands) else 1


if __name__ == "__main__":
    sys.exit(main())
