"""Put `headcount prune --fraction F --heal-steps 200`'s saved --json (benchmarks/results/commands/, written by
benchmarks/command_results.py) into the gates bench's table as its "retraining-free + heal" row, so joint gates,
frozen gates, retraining-free and prune + heal sit at the same head count in one table and plot.

    python benchmarks/gates_heal_row.py [--model smollm2] [--fraction 0.5]

Refuses a result measured on other weights or other held-out windows (its unedited perplexity must be the
bench's base). Then `headcount bench surgery --part gates --from benchmarks/results/surgery_gates.json` prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GATES = ROOT / "benchmarks" / "results" / "surgery_gates.json"
METHOD = "retraining-free + heal"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--fraction", type=float, default=0.5)
    args = ap.parse_args()
    name = f"{args.model}-prune-{args.fraction:g}-heal-200.json"
    cmd_path = ROOT / "benchmarks" / "results" / "commands" / name
    command = json.loads(cmd_path.read_text())
    data = json.loads(GATES.read_text())
    section = data["gates"][args.model]
    if command["weights_sha256"] != section["weights_sha256"]:
        raise SystemExit(f"{name}: measured on other weights than the gates bench's {args.model}")
    base = section["base"]["ppl_by_text"]
    if any(abs(command["ppl_by_domain_before"][k] - base[k]) > 1e-6 * base[k] for k in base):
        raise SystemExit(f"{name}: other held-out windows (unedited perplexity differs from the bench's base)")
    healed = command["ppl_by_domain_healed"]
    section["points"] = [p for p in section["points"]
                         if not (p.get("method") == METHOD and p.get("fraction") == args.fraction)]
    section["points"].append({
        "fraction": args.fraction, "method": METHOD, "heads_kept": command["heads_after"],
        "steps": command["heal"]["steps"], "params": command["heal"]["params"], "seconds": command["seconds"],
        "ppl_by_text": {k: healed[k] for k in base}, "from": f"benchmarks/results/commands/{name}: {command['command']}"})
    GATES.write_text(json.dumps(data, indent=1, default=str))
    print(f"{args.model} {args.fraction:.0%}: {METHOD} row from {name}")


if __name__ == "__main__":
    main()
