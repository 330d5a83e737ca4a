"""What the surgery commands give on the report's model (the report says what the commands do): the
commands' own saved --json results, or their defaults run here, never the report's own smaller settings.

    COMMANDS                                       prune (C11), merge (C15), heal: the command each section quotes
    command_text(kind, model) -> str               `headcount prune --model smollm2 --fraction 0.2 --out DIR --json`
    saved_command(results, model, kind, weights) -> (JSON, path) | None
    command_source(results, model, kind, weights) -> cache-key parameters: {"source": "saved", "file", "sha256"}
                                                   | {"source": "run"}
    prune_section / merge_section / healing_section(model, *, results, weights, progress) -> report.json section

Saved results: benchmarks/results/commands/<model>-<slug>.json, each the JSON the command printed
(`benchmarks/command_results.py` runs the commands in fresh processes and writes them). One counts only for the
weights it was measured on: its `weights_sha256` (the weights before the edit, models/fingerprint.py) must be the
report's model's. Otherwise the report runs the command's defaults itself, through the functions the command calls
with nothing overridden (prune_to(model, 0.2), merge_kv(model, 1)), in the commands' one edit pipeline
(surgery.editing.run_edit) with the commands' measure: a surgery.quality.QualityMeter on the three held-out domains,
EVAL_WINDOWS windows of EVAL_WINDOW tokens. A saved result's `tasks` block ({task: {stage: pass@1}}, --eval) is
carried into its section for the page.
Healing is minutes of training: without a saved result the section says "not measured" and names the command.
Each section's `source` says which ("saved" / "run"), and its `command` what a user types to get the same numbers.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from headcount.models.copying import attention_copy
from headcount.report.not_applicable import NotApplicable
from headcount.surgery import merge_kv, prune_to
from headcount.surgery.editing import run_edit
from headcount.surgery.merging.uptraining import summary as uptrain_summary
from headcount.surgery.quality import QualityMeter

COMMANDS_DIR = "commands"  # under benchmarks/results/
EVAL_WINDOWS, EVAL_WINDOW = 4, 512  # the commands' --eval-windows default and their held-out window
PRUNE_FRACTION = 0.2  # C11: `headcount prune --fraction 0.2`
MERGE_KV_HEADS = 1  # C15: `headcount merge-kv --kv-heads 1` (every layer MQA)
HEAL_FRACTION, HEAL_STEPS = 0.5, 200  # the healed edit: `headcount prune --fraction 0.5 --heal-steps 200`

# kind: (file slug, the command's arguments after --model M; --out DIR where the command needs one)
COMMANDS = {
    "prune": ("prune-0.2", ["prune", "--fraction", f"{PRUNE_FRACTION:g}", "--out", "DIR", "--json"]),
    "merge": ("merge-kv-1", ["merge-kv", "--kv-heads", str(MERGE_KV_HEADS), "--json"]),
    "heal": ("prune-0.5-heal-200", ["prune", "--fraction", f"{HEAL_FRACTION:g}", "--heal-steps", str(HEAL_STEPS),
                                    "--out", "DIR", "--json"]),
}


def _safe(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(str(model)).name) or "model"


def command_args(kind: str, model: str) -> list[str]:
    """The command's words after `headcount`, --model included (--out DIR as a placeholder where it needs one)."""
    words = COMMANDS[kind][1]
    return [words[0], "--model", str(model), *words[1:]]


def command_text(kind: str, model: str) -> str:
    return shlex.join(["headcount", *command_args(kind, model)])


def file_name(kind: str, model: str) -> str:
    return f"{_safe(model)}-{COMMANDS[kind][0]}.json"


def _weights(weights):
    return weights() if callable(weights) else weights


def saved_command(results, model: str | None, kind: str, weights) -> tuple[dict, Path] | None:
    """The command's saved --json for `model` when it exists and was measured on these weights (its weights_sha256
    equals `weights`, a hash or a function giving it; a result that records no hash is not used)."""
    if results is None or not model:
        return None
    path = Path(results) / COMMANDS_DIR / file_name(kind, model)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data.get("weights_sha256"):
        return None
    if data["weights_sha256"] != _weights(weights):
        return None
    return data, path


def command_source(results, model: str | None, kind: str, weights) -> dict:
    """What a command step will read or run, as cache-key parameters."""
    found = saved_command(results, model, kind, weights)
    if found is None:
        return {"source": "run"}
    from headcount.report.trained import file_hash
    return {"source": "saved", "file": found[1].name, "sha256": file_hash(found[1])}


def _eval_windows(command: str | None) -> int:
    """--eval-windows N from a saved command line (the commands' default otherwise)."""
    words = shlex.split(command or "")
    for i, w in enumerate(words[:-1]):
        if w == "--eval-windows":
            try:
                return int(words[i + 1])
            except ValueError:
                break
    return EVAL_WINDOWS


def _domain_sizes(model, windows: int) -> dict:
    w = min(EVAL_WINDOW, model.config.max_position)
    return {name: [windows, w] for name in ("prose", "code", "source")}


def _common(data: dict, kind: str, model, *, source: str, path: Path | None) -> dict:
    """The keys every command section shares, from the command's --json (or the same keys made here)."""
    name = getattr(model, "name", None) or "MODEL"
    out = {"source": source, "command": command_text(kind, name),
           "path": f"benchmarks/results/{COMMANDS_DIR}/{path.name}" if path is not None else None,
           "weights_sha256": data.get("weights_sha256")}
    for key in ("heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
                "kv_bytes_per_token_after", "ppl_before", "ppl_after", "ppl_by_domain_before", "ppl_by_domain_after",
                "forward_equivalents", "fraction_removed", "method", "tasks"):
        if data.get(key) is not None:
            out[key] = data[key]
    if data.get("fidelity_after"):
        out["cosine"] = data["fidelity_after"].get("cosine")
    if out.get("ppl_by_domain_before"):
        out["domain_sizes"] = _domain_sizes(model, _eval_windows(data.get("command")))
    if source == "saved":
        out["saved_command"] = data.get("command")
        if data.get("seconds") is not None:  # a saved figure (the report's own runs keep no timings)
            out["command_seconds"] = data["seconds"]
    return out


def command_meter() -> QualityMeter:
    """The commands' held-out measure (surgery.cli_common.quality_meter without --eval): EVAL_WINDOWS windows of
    EVAL_WINDOW tokens (clamped to the model's context) on each held-out domain of the default corpus."""
    return QualityMeter(None, eval_windows=EVAL_WINDOWS, window=EVAL_WINDOW)


def prune_section(model, *, results, weights, progress: bool = True) -> dict:
    """C11: what `headcount prune --fraction 0.2` gives on this model (saved, or prune_to(copy, 0.2) run here)."""
    found = saved_command(results, getattr(model, "name", None), "prune", weights)
    if found is not None:
        data, path = found
        out = _common(data, "prune", model, source="saved", path=path)
        p = data.get("prune") or {}
    else:
        # the command's defaults are prune_to's; the copy is edited, the report's model is not
        report = run_edit(attention_copy(model), lambda m: prune_to(m, PRUNE_FRACTION, progress=progress),
                          meter=command_meter())
        p = report.edit
        data = report.to_json()
        data["fraction_removed"] = round((data["heads_before"] - data["heads_after"]) / data["heads_before"], 4)
        data["forward_equivalents"] = round(p.get("forward_equivalents") or 0.0, 2)
        data["weights_sha256"] = _weights(weights)
        out = _common(data, "prune", model, source="run", path=None)
    out |= {"fraction": PRUNE_FRACTION, "order": p.get("order"), "compensate": p.get("compensate"),
            "mode": p.get("mode"), "protected": p.get("protected"),
            "heads_removed": (out.get("heads_before") or 0) - (out.get("heads_after") or 0),
            "calibration_tokens": p.get("calibration_tokens")}
    return out


def _one_kv_head(model) -> None:
    if all(layer.attn.n_kv_heads == 1 for layer in model.layers):
        raise NotApplicable(f"{getattr(model, 'name', None) or 'the model'} already has one KV head per layer "
                            "(MQA): there are no K/V heads left to merge")


def merge_section(model, *, results, weights, progress: bool = True) -> dict:
    """C15: what `headcount merge-kv --kv-heads 1` gives on this model (saved, or merge_kv(copy, 1) run here)."""
    _one_kv_head(model)
    found = saved_command(results, getattr(model, "name", None), "merge", weights)
    if found is not None:
        data, path = found
        out = _common(data, "merge", model, source="saved", path=path)
    else:
        # the merge (and its uptrain) edit attention only: the rest is shared; the command's defaults are merge_kv's
        report = run_edit(attention_copy(model), lambda m: merge_kv(m, MERGE_KV_HEADS, progress=progress),
                          meter=command_meter())
        merged = report.edit
        data = report.to_json()
        # merge-kv's heads_* count KV heads (what the merge changes), as the command prints them
        data["heads_before"], data["heads_after"] = data["kv_heads_before"], data["kv_heads_after"]
        data |= {"forward_equivalents": round(merged["forward_equivalents"], 2), "weights_sha256": _weights(weights),
                 "method": merged["method"], "merge_options": merged.get("options"),
                 "uptrain": uptrain_summary(merged.get("uptrain"))}
        out = _common(data, "merge", model, source="run", path=None)
    out["kv_heads"] = MERGE_KV_HEADS
    out["options"] = data.get("merge_options")
    out["uptrain"] = data.get("uptrain")
    return out


def healing_section(model, *, results, weights, progress: bool = True) -> dict:
    """The healed edit: `headcount prune --fraction 0.5 --heal-steps 200`'s saved result for this model, held-out
    perplexity per domain before the edit, after it and after healing, with the heal's steps, tokens and seconds.
    Not run here (minutes of training): without a saved result, NotApplicable naming the command to run."""
    name = getattr(model, "name", None)
    if not hasattr(model, "lm_head"):
        raise NotApplicable("healing distils next-token distributions; an encoder is not healed")
    found = saved_command(results, name, "heal", weights)
    if found is None:
        raise NotApplicable(f"not measured: run `{command_text('heal', name or 'MODEL')}` (minutes of training; "
                            f"benchmarks/command_results.py saves it under benchmarks/results/{COMMANDS_DIR}/ for "
                            "the report)")
    data, path = found
    heal = data.get("heal") or {}
    out = _common(data, "heal", model, source="saved", path=path)
    out |= {"fraction": HEAL_FRACTION, "held_out": heal.get("held_out"), "steps": heal.get("steps"),
            "planned_steps": heal.get("planned_steps"), "tokens": heal.get("tokens"),
            "tokens_seen": heal.get("tokens_seen"), "params": heal.get("params"), "lr": heal.get("lr"),
            "trainable_params": heal.get("trainable_params"), "heal_forward_equivalents": heal.get("forward_equivalents"),
            "heal_seconds": heal.get("seconds"), "val_kl_first": heal.get("val_kl_first"),
            "val_kl_best": heal.get("val_kl_best"), "best_step": heal.get("best_step"),
            "stopped_early": heal.get("stopped_early")}
    return out


def text_merge_section(model, *, calibration, meter, n_windows: int, window: int, progress: bool = True,
                       **steps) -> dict:
    """A report on the user's own text (the commands measure the default corpus): merge_kv(copy, 1) with its
    defaults (the command's local reconstruction and uptrain) on `n_windows` windows of `window` tokens of the
    text, measured on the text's held-out part (meter.ReportMeter `meter`). source "text"; no command quoted."""
    _one_kv_head(model)
    decoder = hasattr(model, "lm_head")
    kwargs = {} if decoder else {"method": "mean"}  # an encoder has no perplexity to show the cost: the quick merge
    before = meter.base if decoder else None  # the unmodified model's, shared with the other steps
    report = run_edit(attention_copy(model), lambda m: merge_kv(m, MERGE_KV_HEADS, calibration=calibration,
                                                                 n_windows=n_windows, window=window, progress=progress,
                                                                 **kwargs, **steps),  # steps: tests set them small
                      meter=meter.meter, before=before)
    merged, after = report.edit, report.quality["after_edit"]
    return {"source": "text", "command": None, "kv_heads": MERGE_KV_HEADS,
            "heads_before": report.accounts_before["kv_heads"], "heads_after": report.accounts_after["kv_heads"],
            "params_before": report.accounts_before["params"], "params_after": report.accounts_after["params"],
            "kv_bytes_per_token_before": report.accounts_before["kv_bytes_per_token"],
            "kv_bytes_per_token_after": report.accounts_after["kv_bytes_per_token"],
            "ppl_before": before.headline if decoder else None, "ppl_after": after.headline if decoder else None,
            "method": merged["method"], "options": merged.get("options"), "uptrain": uptrain_summary(merged.get("uptrain")),
            "calibration_tokens": merged.get("calibration_tokens"), **meter.domains(after)}
