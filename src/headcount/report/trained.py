"""The claims that need a model trained from scratch (C1, C3, C8, C9's low-rank experiment) and the one
that needs trained gates (C12): where their numbers come from, as report.json sections.

    results_dir() -> Path | None                  benchmarks/results/ of a source checkout, when it exists
    experiment_section(name, *, results, seed, progress) -> {"source", "path", "result"}
    gates_section(model, *, calibration, meter, steps, ...) -> {...}   (C12: a short train_gates run)
    saved_gates(results, model, weights=None) -> {...} | None   the gates bench's saved result for that model
    gates_source(results, model, weights=None) -> {"source": "saved", "file", "sha256"} | {"source": "run"}
                                                  (C12 prefers saved; weights: the model's weights_hash, or a
                                                  function giving it, checked against the saved section's)

C12 comes from gates trained WITH the model (Voita's setup, `headcount prune --method l0 --joint`): the saved
"l0 joint" points when the bench saved any, else its frozen "l0 + lstsq" points; a short run here trains jointly.

An experiment's numbers are the FULL run saved in benchmarks/results/<name>.json when that file exists (the
page says so, with the run's seeds and steps), otherwise the experiment's --quick run (run here; collect.py
caches it like every step). Neither depends on the report's model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from headcount.experiments import run_experiment
from headcount.surgery import apply_gates, train_gates
from headcount.surgery.pruning.gates_joint import teacher_copy, trained_parameters

EXPERIMENT_NAMES = ("multi-relation", "write-address", "heads-sweep", "low-rank")
GATES_FILES = ("surgery_gates.json", "gates.json")  # what the gates bench may have saved, first found wins
GATE_FRACTION = 0.5  # C12: the share of heads the report's gates are trained to remove ("most" = more than half)


def results_dir() -> Path | None:
    """The source checkout's benchmarks/results/ (src/headcount/report/trained.py -> repo root), or None for
    an installed package with no checkout beside it."""
    root = Path(__file__).resolve().parents[3]
    found = root / "benchmarks" / "results"
    return found if found.is_dir() else None


def saved_experiment(name: str, results: Path | None) -> tuple[dict, Path] | None:
    """benchmarks/results/<name>.json when it holds a FULL run of that experiment (quick runs are not used)."""
    if results is None:
        return None
    path = Path(results) / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("experiment") != name or data.get("quick") or not data.get("results"):
        return None
    return data, path


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def experiment_source(name: str, results: Path | None) -> dict:
    """What an experiment step will read or run, as cache-key parameters: {"source": "saved", "sha256"} or
    {"source": "quick"}."""
    saved = saved_experiment(name, results)
    if saved is None:
        return {"source": "quick"}
    return {"source": "saved", "sha256": file_hash(saved[1])}


def _trim(data: dict) -> dict:
    """An experiment's JSON without what the page never reads (per-layer geometry, per-model diagnostics)."""
    out = {k: data.get(k) for k in ("experiment", "claim", "quick", "config", "results", "notes", "seconds")}
    details = dict(data.get("details") or {})
    details.pop("per_model", None)
    real = details.get("real_models")
    if isinstance(real, dict):
        details["real_models"] = {m: {k: v for k, v in g.items() if k != "layers"} for m, g in real.items()
                                  if isinstance(g, dict)}
    out["details"] = details
    return out


def experiment_section(name: str, *, results: Path | None, seed: int = 0, progress: bool = True) -> dict:
    """{"source": "saved" | "quick", "path": file name or None, "command": how to reproduce, "result": JSON}."""
    if name not in EXPERIMENT_NAMES:
        raise ValueError(f"experiment: expected one of {EXPERIMENT_NAMES}, got {name!r}")
    saved = saved_experiment(name, results)
    if saved is not None:
        data, path = saved
        cfg = data.get("config") or {}
        return {"source": "saved", "path": f"benchmarks/results/{path.name}",
                "command": f"headcount experiment {name}", "seeds": cfg.get("seeds", cfg.get("targets")),
                "steps": cfg.get("steps"), "result": _trim(data)}
    result = run_experiment(name, quick=True, seed=seed, progress=progress)
    data = result.to_json()
    cfg = data.get("config") or {}
    return {"source": "quick", "path": None, "command": f"headcount experiment {name} --quick",
            "seeds": cfg.get("seeds", cfg.get("targets")), "steps": cfg.get("steps"), "result": _trim(data)}


# ------------------------------------------------------------------------------------------- gates
JOINT, FROZEN = "l0 joint", "l0 + lstsq"  # the gates bench's methods C12 reads, preferred first


def _weights_match(section: dict, weights) -> bool:
    """A saved section is this model's when it records no weights hash (older saves) or the same one."""
    saved = section.get("weights_sha256")
    if not saved or weights is None:
        return True
    return saved == (weights() if callable(weights) else weights)


def saved_gates(results: Path | None, model: str | None, weights=None) -> dict | None:
    """The gates bench's saved result for `model` (`headcount bench surgery --part gates --save-json
    benchmarks/results/surgery_gates.json`: {"gates": {model: {"heads", "steps", "base", "points"}}}), when it exists,
    as {"source": "saved", "path", "model", "steps", "points": [{"fraction", "heads_removed", "heads_before",
    "ppl", "base_ppl" | "cosine"}]}: the points of gates trained with the model ("l0 joint") when there are any,
    else of frozen gates followed by the default refit ("l0 + lstsq"). weights: the report's model's weights hash
    (or a function giving it): a section saved for other weights is not used."""
    if results is None or not model:
        return None
    for name in GATES_FILES:
        try:
            data = json.loads((Path(results) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        section = ((data.get("gates") if isinstance(data, dict) else None) or {}).get(model)
        if not isinstance(section, dict) or not section.get("heads") or "error" in section:
            continue
        if not _weights_match(section, weights):
            continue
        heads, base = section["heads"], section.get("base") or {}
        base_ppl = next(iter((base.get("ppl_by_text") or {}).values()), None)
        points = []
        found = {p.get("method") for p in section.get("points") or [] if p.get("heads_kept") is not None}
        method = JOINT if JOINT in found else FROZEN
        for p in section.get("points") or []:
            if p.get("method") != method or p.get("heads_kept") is None:
                continue
            point = {"fraction": p.get("fraction"), "heads_removed": heads - p["heads_kept"], "heads_before": heads,
                     "method": p["method"], "model": model, "steps": p.get("steps", section.get("steps")),
                     "params": p.get("params")}
            if base_ppl is not None and p.get("ppl_by_text"):
                point |= {"ppl": next(iter(p["ppl_by_text"].values())), "base_ppl": base_ppl}
            elif p.get("cosine") is not None:
                point |= {"cosine": p["cosine"]}
            points.append(point)
        if points:
            return {"source": "saved", "path": f"benchmarks/results/{name}", "model": model,
                    "steps": section.get("steps"), "quick": bool(((data.get("gates") or {}).get("quick"))),
                    "method": method, "joint": method == JOINT, "points": points}
    return None


def gates_source(results: Path | None, model: str | None, weights=None) -> dict:
    """What the gates step will read or run, as cache-key parameters: {"source": "saved", "file", "sha256"}
    when the gates bench saved a result for `model` (the report prefers it: minutes of training, not a dozen
    steps), else {"source": "run"} (a short train_gates run on the report's model)."""
    saved = saved_gates(results, model, weights)
    if saved is None:
        return {"source": "run"}
    path = Path(results) / Path(saved["path"]).name
    return {"source": "saved", "file": path.name, "sha256": file_hash(path)}


def gates_section(model, *, calibration, meter, steps: int, n_windows: int, window: int,
                  calibration_windows: int, fraction: float = GATE_FRACTION, lr: float | None = None,
                  progress: bool = True) -> dict:
    """Train hard-concrete gates WITH the attention weights of a copy of `model` to remove `fraction` of its heads
    (headcount.surgery.train_gates(joint=True), Voita's setup; the copy owns the tensors that train, every other
    one is shared), remove the heads they closed (apply_gates, its default compensation for joint gates), and
    measure held-out quality: {"fraction", "steps", "heads_before", "heads_removed", "reached", "n_closed",
    "ppl_before", "ppl_after" (decoders) | "cosine" (encoders), "gates": the GateResult's summary}.

    meter: meter.ReportMeter (the held-out sets and the unmodified model's quality, shared with the other steps)."""
    pruned = teacher_copy(model, trained_parameters(model, "attention"))
    kwargs = dict(fraction=fraction, steps=steps, calibration=calibration, n_windows=n_windows, window=window,
                  progress=progress, joint=True, params="attention")
    if lr is not None:
        kwargs["lr"] = lr
    gates = train_gates(pruned, **kwargs)
    g = gates.to_json()
    r = apply_gates(pruned, gates, calibration=calibration, calibration_windows=calibration_windows, window=window,
                    force=True, progress=progress).to_json()
    after = meter.headline(pruned)
    out = {"source": "run", "fraction": fraction, "steps": steps, "window": window, "n_windows": n_windows,
           "heads_before": r.get("heads_before", g.get("n_gates")), "heads_removed": r.get("heads_removed"),
           "heads_after": r.get("heads_after"), "compensate": r.get("compensate"), "mode": g.get("mode"),
           "reached": g.get("reached"), "n_closed": g.get("n_closed"), "n_gates": g.get("n_gates"),
           "n_removed_closed": g.get("n_removed_closed"), "n_removed_ranked": g.get("n_removed_ranked"),
           "final_expected_l0": g.get("final_expected_l0"), "heads_to_keep": g.get("heads_to_keep"),
           "final_loss": g.get("final_loss"), "objective": g.get("objective"), "joint": bool(g.get("joint")),
           "params": g.get("params"), "forward_equivalents": g.get("forward_equivalents"),
           "removed": r.get("removed", g.get("removed")), "gates": g.get("gates")}
    if hasattr(model, "lm_head"):
        out["ppl_before"], out["ppl_after"] = meter.base.headline, after
    else:
        out["cosine"], out["spearman"] = after
    return out
