"""The frontier of edits measured one command at a time: rows built from the saved results of `headcount prune`,
`drop-attention`, `merge-kv`, `heal` and `eval` runs (benchmarks/results/eval, benchmarks/results/heal_runs),
then marked, tabled and drawn by headcount.frontier exactly as `headcount frontier` marks its own rows.

A whole frontier in one command is hours of CPU on 2 cores; the points here were measured by their own commands
(each file's "command" field says which), every task row judged greedily on all 164 HumanEval problems in the
makers' format. pass@1, its Wilson interval and the paired comparison against the unedited model are computed
again here from the samples' per-problem verdicts (tasks.stats), not copied from the eval JSONs.

    python benchmarks/frontier_measured.py [--png docs/frontier_qwen.png] [--keep 0.9] [--json]

A point whose files are missing is left out with a line on stderr saying which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "results"
EVAL = ROOT / "eval"
HEAL = ROOT / "heal_runs"
MODEL = "qwen2.5-coder-0.5b"
UNEDITED_SAMPLES = EVAL / f"{MODEL}-makers-humaneval.samples.jsonl"
UNEDITED_EVAL = EVAL / f"{MODEL}-makers-humaneval.json"

# (point as `headcount frontier --point` spells it, healed, the edit's JSON, the heal's JSON, the eval's stem)
POINTS = [
    ("prune:0.1", False, "prune10-edit", None, "prune10-makers-humaneval"),
    ("prune:0.2", False, "prune20-edit", None, "prune20-makers-humaneval"),
    ("prune:0.2", True, "prune20-edit", "prune-0.2-heal-100-teacher-answers", "prune20-heal100-answers-humaneval"),
    ("merge:0.75", False, "mergekl75-edit", None, "mergekl75-humaneval"),
    ("merge:0.75", True, "mergekl75-edit", "mergekl75-heal-50-teacher-answers", "mergekl75-heal50-answers-humaneval"),
    ("drop:0.25", False, "drop25-edit", None, "drop25-humaneval"),
    ("drop:0.25", True, "drop25-edit", "drop-0.25-heal-100-teacher-answers", "drop25-heal100-answers-humaneval"),
    ("merge:0.9", False, "mergekl90-edit", None, "mergekl90-humaneval"),
    ("kv:0.5", False, "kv50-allow-drop-edit", None, "kv50-allow-drop-humaneval"),
    ("merge:0.5", False, "mqa-edit", None, "mqa-makers-humaneval"),
    ("merge:0.5", True, "mqa-edit", "mqa-heal-100-teacher-answers", "mqa-heal100-answers-humaneval"),
]


def verdicts(samples: Path) -> dict[str, bool]:
    """{task_id: passed} of a greedy run (one sample per problem)."""
    out = {}
    with open(samples) as fh:
        for line in fh:
            row = json.loads(line)
            out[row["task_id"]] = bool(row["passed"])
    return out


def heads_after(config, edit: dict) -> tuple[tuple[int, int], ...]:
    """Each layer's (n_heads, n_kv_heads) after the edit its JSON describes: prune's removed query heads, merge-kv's
    per-layer fits, a plan's K/V heads per layer (0: the layer's attention dropped), drop-attention's dropped
    layers."""
    heads = [[config.n_heads, config.n_kv_heads] for _ in range(config.n_layers)]
    removed = (edit.get("edit") or {}).get("removed")
    if removed:
        for layer, gone in (json.loads(removed) if isinstance(removed, str) else removed).items():
            heads[int(layer)][0] -= len(gone)
    for fit in (edit.get("edit") or {}).get("layers") or []:  # merge-kv's per-layer fits
        if isinstance(fit, dict) and "n_kv_after" in fit:
            heads[int(fit["layer"])][1] = fit["n_kv_after"]
    for layer, n_kv in (edit.get("plan") or {}).items():
        heads[int(layer)] = [0, 0] if n_kv == 0 else [heads[int(layer)][0], n_kv]
    if "plan" not in edit:
        for layer in edit.get("dropped") or []:
            heads[int(layer)] = [0, 0]
    return tuple((h, kv) for h, kv in heads)


def markdown(frontier) -> None:
    """The frontier's rows as a markdown table: what docs/frontier.md shows."""
    base = frontier.rows[0]
    domains = list(base.perplexity)
    print("| point | frontier | KV bytes / token | saved | attention FLOPs / token @ 4k | params | "
          + " | ".join(f"ppl {d}" for d in domains) + " | passed | pass@1 [95% CI] | kept | paired against the "
          "unedited: wins / losses, difference [95% CI], p |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(domains) + "---:|---|---:|---|")
    for r in frontier.rows:
        mark = ("KV" if r.frontier else "") + (" + FLOPs" if r.frontier and r.frontier_flops else
                                              "FLOPs" if r.frontier_flops else "")
        lo, hi = r.pass_at_1_ci95
        p = r.paired
        versus = "" if p is None else (f"{p['wins']} / {p['losses']}, {p['difference']:+.3f} "
                                       f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}], p = {p['p_value']:.2g}")
        ppl = " | ".join(f"{r.perplexity[d]:.2f}" if d in r.perplexity else "-" for d in domains)
        print(f"| {r.label} | {mark} | {r.kv_bytes_per_token:,} | {1 - r.kv_bytes_per_token / base.kv_bytes_per_token:.0%} "
              f"| {r.attention_flops_per_token_4k:,} | {r.params:,} | {ppl} | {sum(r.problems.values())} | "
              f"{r.pass_at_1:.3f} [{lo:.3f}, {hi:.3f}] | {frontier.kept(r):.0%} | {versus} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png", default=None, help="draw the frontier here (KV bytes saved against pass@1)")
    ap.add_argument("--keep", type=float, default=0.9, help="name the cheapest point keeping this share of pass@1")
    ap.add_argument("--json", action="store_true", help="print the frontier as JSON instead of the table")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/frontier.md's)")
    args = ap.parse_args()

    from headcount.cost.edited import EditedShape, decoder_config_shape, layer_rows
    from headcount.frontier.cli import _keeping_lines, _table, check_keep
    from headcount.frontier.result import Frontier, Row
    from headcount.frontier.run import FLOPS_CONTEXT, mark
    from headcount.models import load
    from headcount.tasks.stats import paired, wilson_interval

    keep = check_keep(args.keep)
    model = load(MODEL)
    base_shape = decoder_config_shape(model.config.to_dict())
    context = int(model.config.max_position)

    def flops(heads, seq: int) -> int:
        rows = layer_rows(EditedShape(base_shape, heads), batch=1, seq=seq, dtype="fp32")
        return sum(r["decode_attention_flops"] for r in rows)

    base_heads = EditedShape.unedited(base_shape).heads
    base_problems = verdicts(UNEDITED_SAMPLES)
    base_eval = json.loads(UNEDITED_EVAL.read_text())
    base_edit = json.loads((EVAL / f"{MODEL}-mergekl75-edit.json").read_text())  # its "before" is the unedited's

    def task_fields(problems: dict[str, bool], against: dict[str, bool] | None) -> dict:
        passed = sum(problems.values())
        return {"pass_at_1": passed / len(problems),
                "pass_at_1_ci95": [round(x, 6) for x in wilson_interval(passed, len(problems))],
                "paired": None if against is None else paired(problems, against).to_json(), "problems": problems}

    rows = [Row("unedited", False, base_edit["kv_bytes_per_token_before"], flops(base_heads, context),
                flops(base_heads, FLOPS_CONTEXT), context, base_edit["params_before"],
                dict(base_edit["ppl_by_domain_before"]), seconds=base_eval["seconds"],
                edit={"command": base_eval["command"]}, **task_fields(base_problems, None))]
    for point, healed, edit_stem, heal_stem, eval_stem in POINTS:
        files = [EVAL / f"{MODEL}-{edit_stem}.json", EVAL / f"{MODEL}-{eval_stem}.json",
                 EVAL / f"{MODEL}-{eval_stem}.samples.jsonl"] + ([HEAL / f"{MODEL}-{heal_stem}.json"] if heal_stem else [])
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            print(f"{point}{' healed' if healed else ''}: left out, no {', '.join(missing)}", file=sys.stderr)
            continue
        edit, evaluated = json.loads(files[0].read_text()), json.loads(files[1].read_text())
        heal = json.loads(files[3].read_text()) if heal_stem else None
        heads = heads_after(model.config, edit)
        perplexity = (heal or {}).get("ppl_by_domain_healed") if healed else edit["ppl_by_domain_after"]
        seconds = edit["seconds"] + evaluated["seconds"] + ((heal or {}).get("seconds") or 0.0)
        commands = {"edit": edit["command"], "eval": evaluated.get("command")}
        if heal:
            commands["heal"] = heal["command"]
        rows.append(Row(point, healed, edit["kv_bytes_per_token_after"], flops(heads, context),
                        flops(heads, FLOPS_CONTEXT), context, edit["params_after"], dict(perplexity or {}),
                        seconds=round(seconds, 1), edit=commands,
                        **task_fields(verdicts(files[2]), base_problems)))
    mark(rows, "pass_at_1")
    frontier = Frontier(MODEL, {"source": "benchmarks/results/eval (one command per point)"}, rows, "pass_at_1",
                        "humaneval")
    if args.png:
        from headcount.frontier.plot import plot
        plot(frontier, Path(args.png))
    if args.json:
        print(json.dumps(frontier.to_json(keep), indent=1))
        return
    if args.markdown:
        markdown(frontier)
    else:
        _table(frontier)
    for line in _keeping_lines(frontier, keep):
        print(line)


if __name__ == "__main__":
    main()
