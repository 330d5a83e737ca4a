"""Run (or read back from the cache) every analysis the report shows and assemble report.json.

    collect(model, texts=None, *, seed=0, quick=False, sample=None, cache=None, progress=True) -> dict
    assemble(model_name=, kind=, results=, unavailable=, params=) -> report.json (a dict)

Each step (steps.py) goes through ResultCache keyed by the model's weights, the text and the step's parameters.
A step whose section does not apply to the model raises NotApplicable: the section becomes an entry of
`unavailable` with the reason, and the page shows a "not available" panel in its place. Any other exception
stops the report: a bug is a failure, never a panel.

Everything returned is JSON-ready and normalised: floats rounded to DIGITS significant digits,
tuples as lists, NaN / inf as null, so the same seed gives a byte-identical report.json.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from headcount.report.cache import ResultCache, cache_key, text_hash, weights_hash
from headcount.report.not_applicable import NotApplicable
from headcount.report.sections import FORMAT
from headcount.report.steps import Context, report_steps

DIGITS = 6  # significant digits kept for every float in report.json
DEFAULT_RESULTS = object()  # collect(results_dir=): the checkout's benchmarks/results/


@dataclass(frozen=True)
class Sizes:
    """How much text each analysis sees: sized so `make demo` stays within 2 minutes on 2 idle cores.

    Calibration is windows of `window` tokens of prune_to's default calibration text, batched once: the first
    importance_windows of them for the importance scores, the pruning order and its refit (one scoring pass
    shared by the curve), gate_windows for the gates. C11's prune, the K/V merge and healing are the commands' own
    (report/commands.py: their saved results for these weights, or their defaults run here), not sized here.
    """

    roles_tokens: int = 768  # tokens of windows for previous/duplicate/positional/sink
    roles_sentences: int = 40  # parsed sentences for syntactic / rare_word
    faithfulness_layers: int = 2  # layers (spread over the depth) for the adversarial search
    faithfulness_examples: int = 2
    rank_examples: int = 1
    importance_windows: int = 3  # calibration windows (see above): 768 tokens, as good as 1,024 for C11 (measured)
    pruning_fractions: tuple[float, ...] = (0.1, 0.2, 0.4)  # 0.2 is prune_to's (C11), the others the curve's
    eval_windows: int = 4  # held-out windows for every perplexity (pruning curve, K/V merge, gates)
    merge_windows: int = 3  # calibration windows of the K/V merge on a user's text (otherwise the command's merge)
    merge_local_steps: int | None = None  # ... its local steps and uptrain steps: None = merge_kv's defaults (the
    merge_uptrain_steps: int | None = None  # command's); tests set them small
    window: int = 256
    encoder_sentences: int = 64  # calibration / held-out sentences for an encoder's pruning and merge
    random_fractions: tuple[float, ...] = (0.2,)  # the random-order baseline (no refit)
    faithfulness_steps: int = 20  # steps of each adversarial-attention search (analysis default: 40)
    gate_steps: int = 12  # optimizer steps of the C12 gate training (a short run: the bench trains for minutes)
    gate_windows: int = 4  # its calibration windows, of gate_window tokens, batches of 2
    gate_window: int = 64
    gate_lr: float = 1.0  # Adam's on log_alpha: large, so that a dozen steps reach the target (measured on smollm2)
    domain_windows: int = 2  # held-out windows of the two other domains (code, stdlib source) ...
    domain_window: int = 128  # ... of this many tokens: small, the prose measure above stays the headline


FULL = Sizes()
QUICK = Sizes(roles_tokens=512, roles_sentences=16, faithfulness_layers=2, faithfulness_examples=2,
              rank_examples=1, importance_windows=2, pruning_fractions=(0.2, 0.4), eval_windows=2, merge_windows=2,
              window=128, encoder_sentences=24, random_fractions=(0.2, 0.4), faithfulness_steps=20, gate_steps=8,
              gate_windows=2)


def normalise(obj: Any, digits: int = DIGITS) -> Any:
    """JSON-ready copy: floats to `digits` significant digits (NaN/inf -> None), tuples -> lists,
    tensors / numpy arrays -> nested lists, dict keys -> str."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return None
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {str(k): normalise(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [normalise(v, digits) for v in obj]
    if hasattr(obj, "tolist"):  # torch / numpy arrays and scalars
        return normalise(obj.tolist(), digits)
    if hasattr(obj, "to_json"):
        return normalise(obj.to_json(), digits)
    raise TypeError(f"report: cannot put a {type(obj).__name__} into report.json")


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="report", unit="step", file=sys.stderr, disable=not enabled, leave=True)


def collect(model, texts: str | Sequence[str] | None = None, *, seed: int = 0, quick: bool = False,
            sample: str | None = None, cache: ResultCache | None = None, progress: bool = True,
            only: Sequence[str] | None = None, sizes: Sizes | None = None, timings: dict | None = None,
            results_dir=DEFAULT_RESULTS) -> dict:
    """Every section of report.json for `model` (see the module docstring).

    texts: None = the calibration part of the default corpus; a string or list of strings otherwise.
    only: run just these steps (the others are marked unavailable: "not run"); sizes: override FULL / QUICK.
    timings: a dict to receive each step's wall-clock seconds (kept out of report.json: it varies), and under
        ReportMeter.TIMING the part of those seconds spent measuring held-out quality (meter.py).
    results_dir: where saved full experiment runs are read from (default: the source checkout's
        benchmarks/results/, when there is one; None: always the experiments' --quick runs).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {seed!r}")
    if texts is not None:
        from headcount.analysis.batches import resolve_texts
        texts = resolve_texts(texts)
    for attr in ("layers", "config"):
        if not hasattr(model, attr):
            raise TypeError(f"model: expected a headcount model (Decoder or Encoder), got {type(model).__name__}")
    sizes = sizes if sizes is not None else (QUICK if quick else FULL)
    cache = cache if cache is not None else ResultCache()
    w_hash = weights_hash(model) if cache.enabled else "uncached"
    t_hash = text_hash(texts)
    results, unavailable = {}, {}
    if results_dir is DEFAULT_RESULTS:
        from headcount.report.trained import results_dir as default_results
        results_dir = default_results()
    ctx = Context.build(model, texts, seed=seed, sizes=sizes, sample=sample, progress=progress,
                        results_dir=results_dir, timings=timings, weights=None if w_hash == "uncached" else w_hash)
    ctx.done = results  # pruning reuses importance's scores
    steps = report_steps(ctx)
    bar = _progress(len(steps), progress)
    try:
        for step in steps:
            bar.set_description(f"report: {step.name}")
            if only is not None and step.name not in only:
                unavailable[step.name] = "not run"
                bar.update(1)
                continue
            if step.model_free:  # the same result whichever model or text the report is on
                key = cache_key(step.name, weights="-", text="-", params=step.params)
            else:
                key = cache_key(step.name, weights=w_hash, text=t_hash,
                                params=step.params | {"model": getattr(model, "name", None)})
            t0 = time.perf_counter()
            try:
                results[step.name] = cache.get_or_compute(
                    step.name, key, lambda s=step: json.loads(json.dumps(normalise(_untimed(s.run(ctx))))))
            except NotApplicable as err:
                unavailable[step.name] = " ".join(str(err).split())
            if timings is not None:
                timings[step.name] = time.perf_counter() - t0
            bar.update(1)
    finally:
        bar.close()
    return assemble(model_name=str(getattr(model, "name", None) or type(model).__name__),
                    kind="decoder" if hasattr(model, "lm_head") else "encoder",
                    results=results, unavailable=unavailable,
                    params={"seed": seed, "quick": quick, "text": "default corpus (calibration part)"
                            if texts is None else f"user text, sha256 {t_hash[:16]}"})


TIMING_KEYS = ("seconds", "elapsed", "elapsed_s", "wall_s", "time_s")


def _untimed(value):
    """A result without its wall-clock timings (they would make report.json differ run to run)."""
    data = value.to_json() if hasattr(value, "to_json") else value
    if isinstance(data, dict):
        data = {k: _untimed(v) for k, v in data.items() if k not in TIMING_KEYS}
    elif isinstance(data, (list, tuple)):
        data = [_untimed(v) for v in data]
    return data


def assemble(*, model_name: str, kind: str, results: dict, unavailable: dict | None = None,
             params: dict | None = None) -> dict:
    """report.json from the steps' JSON results (what the HTML builder reads; testable without a model).

    results: {"shape": {"shape", "accounts"}, "sample", "roles", "faithfulness", "rank", "checks",
              and optionally "importance", "pruning", "prune_command", "kv_merge", "healing", "gates",
              "experiment-<name>" (one per
              trained-from-scratch experiment: gathered into report["experiments"][name])}.
    """
    from headcount.report.claims import read_claims

    unavailable = dict(unavailable or {})
    shape_part = results.get("shape", {})
    report = {
        "format": FORMAT,
        "model": model_name,
        "kind": kind,
        "shape": shape_part.get("shape"),
        "accounts": shape_part.get("accounts"),
        "sample": results.get("sample"),
        "roles": results.get("roles"),
        "faithfulness": results.get("faithfulness"),
        "rank": results.get("rank"),
        "params": dict(params or {}),
    }
    for key in ("checks", "importance", "pruning", "prune_command", "kv_merge", "healing", "gates"):
        if results.get(key) is not None:
            report[key] = results[key]
    experiments = {k[len("experiment-"):]: v for k, v in sorted(results.items())
                   if k.startswith("experiment-") and v is not None}
    if experiments:
        report["experiments"] = experiments
    for key in ("shape", "sample", "roles", "faithfulness", "rank"):
        if report.get(key) is None and key not in unavailable:
            unavailable[key] = "not computed"
    report["unavailable"] = unavailable
    report["claims"] = read_claims(report)
    return normalise(report)
