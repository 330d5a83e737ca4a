"""Run (or read back from the cache) every analysis the report shows and assemble report.json.

    collect(model, texts=None, *, seed=0, quick=False, sample=None, cache=None, progress=True) -> dict

Each step goes through ResultCache keyed by the model's weights, the text and the step's parameters.
A step whose code is not there yet (ImportError / AttributeError / NotImplementedError from
headcount.analysis or headcount.surgery) becomes an entry of `unavailable` with the reason, and the
page shows a "not available" panel in its place; bad input (ValueError) still stops the report.

Everything returned is JSON-ready and normalised: floats rounded to DIGITS significant digits,
tuples as lists, NaN / inf as null, so the same seed gives a byte-identical report.json.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from headcount.models.copying import attention_copy
from headcount.report.cache import ResultCache, cache_key, text_hash, weights_hash
from headcount.report.calls import MISSING, NotApplicable, call_with, default_of  # noqa: F401 (re-exported)
from headcount.report.calls import fn as _fn

DIGITS = 6  # significant digits kept for every float in report.json
FORMAT = 2  # report.json's format version (2: all fifteen claims, each with its source)
DEFAULT_RESULTS = object()  # collect(results_dir=): the checkout's benchmarks/results/
C11_FRACTION = 0.2  # the share of heads the report removes with prune_to's defaults (claim C11)


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
    domain_windows: int = 2  # held-out windows of the two other domains (code, stdlib source: issue 16) ...
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


def _spread(n_layers: int, k: int) -> list[int]:
    """k layers spread evenly over the depth, first and last included."""
    if k >= n_layers:
        return list(range(n_layers))
    if k <= 1:
        return [n_layers // 2]
    return sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)})


@dataclass
class Step:
    name: str
    params: dict
    run: Callable[[], Any]
    optional: bool = False  # importance / pruning / kv_merge / gates / experiments: in report.json when present
    model_free: bool = False  # the result does not depend on the model or the text (the experiments)


@dataclass
class Collected:
    results: dict = field(default_factory=dict)
    unavailable: dict = field(default_factory=dict)


def split_texts(texts: list[str] | None) -> tuple[list[str] | None, list[str] | None]:
    """(calibration, held_out): (None, None) for the default corpus (each analysis takes its own part),
    or a user's text split by paragraph like the default corpus (headcount.data.corpus_from_text). A
    text too short to split is used for both."""
    from headcount.data import corpus_from_text
    if texts is None:
        return None, None
    corpus = corpus_from_text("\n\n".join(texts))
    cal, held = corpus.texts("calibration"), corpus.texts("held_out")
    if not cal or not held:
        return list(texts), list(texts)
    return cal, held


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


class HeldOut:
    """Held-out quality through surgery's one measure (headcount.surgery.held_out): the sets built once, the
    unmodified model's quality evaluated once per report run, whichever step asks first."""

    DOMAIN_TIMING = "of which held-out domains"  # collect(timings=): the seconds the code / source measures took

    def __init__(self, model, held, sizes: Sizes, timings: dict | None = None):
        self.model, self.held, self.sizes, self.timings = model, held, sizes, timings
        self._sets = self._base = self._refs = self._domain_base = None
        self.window = min(sizes.window, model.config.max_position)  # of the held-out windows, once `sets` is built

    @property
    def sets(self) -> dict:
        if self._sets is None:
            from headcount.surgery.held_out import held_out_sets
            w = min(self.sizes.window, self.model.config.max_position)
            if hasattr(self.model, "lm_head") and self.held is not None:  # a short user text: one shorter window
                from headcount.analysis.batches import resolve_texts
                from headcount.models.evaluation import token_stream
                w = max(2, min(w, len(token_stream(self.model, resolve_texts(self.held, "held_out")))))
            self._sets = held_out_sets(self.model, self.held, self.sizes.eval_windows, w,
                                       sentences=self.sizes.encoder_sentences)
            self.window = w
        return self._sets

    @property
    def references(self) -> dict | None:
        if self._refs is None and not hasattr(self.model, "lm_head"):
            from headcount.surgery.held_out import embed
            self._refs = {name: embed(self.model, s) for name, s in self.sets.items()}
        return self._refs

    def evaluate(self, model) -> dict:
        from headcount.surgery.held_out import evaluate
        return evaluate(model, self.sets, self.references)

    @property
    def base(self) -> dict:
        if self._base is None:
            self._base = self.evaluate(self.model)
        return self._base

    def first(self, values: dict):
        return values[next(iter(self.sets))]

    @property
    def domain_sizes(self) -> dict | None:
        """{domain: [windows, tokens per window]} of by_domain's measures, or None when there are none."""
        if not self.domains_apply:
            return None
        w = min(self.sizes.domain_window, self.model.config.max_position)
        return {"prose": [self.sizes.eval_windows, self.window], "code": [self.sizes.domain_windows, w],
                "source": [self.sizes.domain_windows, w]}

    @property
    def domains_apply(self) -> bool:
        """The three held-out domains are measured for a decoder on the default corpus (as surgery's commands do)."""
        return hasattr(self.model, "lm_head") and self.held is None

    def by_domain(self, model, prose: float) -> dict | None:
        """{"prose", "code", "source"}: perplexity of `model` on the three held-out domains (headcount.data.
        held_out_domains) through surgery's own held_out_report, on sizes.domain_windows windows of
        sizes.domain_window tokens; "prose" is `prose`, the report's headline measure (eval_windows of the
        report's window), so the page shows one prose number. None where held_out_report measures one set only
        (an encoder, a user's text)."""
        if not self.domains_apply:
            return None
        from headcount.surgery.cli_common import held_out_report

        windows, w = self.domain_sizes["code"]
        t0 = time.perf_counter()
        _, _, found = held_out_report(model, None, windows, w)
        if self.timings is not None:
            self.timings[self.DOMAIN_TIMING] = self.timings.get(self.DOMAIN_TIMING, 0.0) + time.perf_counter() - t0
        return None if found is None else dict(found) | {"prose": prose}

    @property
    def domain_base(self) -> dict | None:
        """by_domain of the unmodified model, measured once per report run."""
        if self._domain_base is None:
            self._domain_base = self.by_domain(self.model, self.first(self.base))
        return self._domain_base

    def domains(self, model, prose: float) -> dict:
        """What a section adds for issue 16: {"ppl_by_domain_before", "ppl_by_domain_after", "domain_sizes"}
        (the names surgery's commands use in their --json), or {"domains_note": why not} when not measured."""
        if not self.domains_apply:
            why = ("an encoder's held-out quality is embedding fidelity on prose sentences" if not hasattr(
                self.model, "lm_head") else "the report's own text: its held-out part is the one held-out set")
            return {"domains_note": why}
        try:
            before, after = self.domain_base, self.by_domain(model, prose)
        except (ValueError, *MISSING) as err:  # e.g. no torch / numpy sources for the code domain
            return {"domains_note": f"not measured: {' '.join(str(err).split())}"}
        return {"ppl_by_domain_before": before, "ppl_by_domain_after": after, "domain_sizes": self.domain_sizes}

    def know_base(self, curve: dict) -> None:
        """Take the unmodified model's perplexities from a pruning curve evaluated on the same sets (decoders)."""
        if self._base is None and hasattr(self.model, "lm_head") and curve.get("base_by_text"):
            self._base = dict(curve["base_by_text"])


def calibration_input(model, cal, sizes: Sizes, n_windows: int, window: int | None = None):
    """What every calibrating step gets as `calibration=`: for a decoder, `n_windows` token windows
    [N, window] of prune_to's DEFAULT calibration (or of the user's text), batched once through the one
    calibration path (analysis.batches.calibration_batches), so the order, the refit, the merge and the gates
    see the same tokens; for an encoder, the calibration sentences."""
    if not hasattr(model, "lm_head"):
        return cal
    import torch

    from headcount.analysis.batches import calibration_batches
    if cal is None:
        try:
            cal = default_of(_fn("surgery", "prune_to"), "calibration", None)
        except MISSING:
            cal = None
    w = min(window or sizes.window, model.config.max_position)
    batches = calibration_batches(model, cal, n_windows=n_windows, window=w)
    return torch.cat([b[0] for b in batches])


def _point(model, fraction: float, order, comp, result: dict, quality) -> dict:
    point = {"fraction": fraction, "order": order, "compensate": comp, "mode": result.get("mode"),
             "heads_removed": result.get("heads_removed"), "heads_before": result.get("heads_before")}
    if hasattr(model, "lm_head"):
        point["ppl"] = quality
    else:
        point["ppl"], (point["cosine"], point["spearman"]) = None, quality
    return point


def pruning_section(model, *, calibration, held: HeldOut, sizes: Sizes, seed: int, scores: dict | None,
                    progress: bool) -> dict:
    """The pruning curve and claim C11, both with the project's DEFAULT order and compensation:
    - C11: headcount.surgery.prune_to(copy, C11_FRACTION) with nothing but the calibration and its size given
      (the default order, mode and compensation are prune_to's own, whatever they become);
    - the curve: pruning_curve at the other fractions with prune_to's default order and compensation, scored
      ONCE (the importance step's scores when they are that order), and a random order with no compensation
      as the baseline (prune_to(order="random", compensate="none"): no scoring, no refit).
    -> PruningCurve JSON + {"default": the C11 point, "default_order", "default_compensate"} + HeldOut.domains'
    keys for the C11 point (the three held-out domains before / after it, or why not)."""
    prune_to = _fn("surgery", "prune_to")
    curve = _fn("surgery", "pruning_curve")
    order = default_of(prune_to, "order", "reconstruction")
    comp = default_of(prune_to, "compensate", "lstsq")
    w = min(sizes.window, model.config.max_position)
    held.sets  # noqa: B018 (the held-out windows, shorter for a short user text: the curve evaluates the same)
    common = dict(calibration=calibration, held_out=held.held, eval_windows=sizes.eval_windows, window=held.window,
                  calibration_windows=sizes.importance_windows, progress=progress)
    if not hasattr(model, "lm_head"):
        common["calibration_windows"] = max(1, sizes.encoder_sentences // 16)
    points = []
    others = [f for f in sizes.pruning_fractions if abs(f - C11_FRACTION) > 1e-9]
    data = {}
    if others and isinstance(order, str):
        given = {order: scores[order]} if scores and order in scores else None
        data = call_with(curve, model, fractions=others, orders=(order,), compensations=(comp,), scores=given,
                         **common).to_json()
        points += data["points"]
        held.know_base(data)
    for f in sizes.random_fractions:  # the baseline: a random order, nothing refit (no scoring, no calibration)
        pruned = attention_copy(model)
        r = call_with(prune_to, pruned, f, order="random", compensate="none", seed=seed, calibration=calibration,
                      progress=progress).to_json()
        points.append(_point(model, f, "random", "none", r, held.first(held.evaluate(pruned))) | {"seed": seed})
        del pruned
    pruned = attention_copy(model)
    result = call_with(prune_to, pruned, C11_FRACTION, calibration=calibration,
                       calibration_windows=common["calibration_windows"], window=w, progress=progress)
    r = result.to_json() if hasattr(result, "to_json") else {}
    q = held.first(held.evaluate(pruned))
    domains = held.domains(pruned, q)  # the three held-out domains before / after this (C11's) point
    del pruned
    point = _point(model, C11_FRACTION, r.get("order") or order, r.get("compensate") or comp, r, q) | {
        "via": "prune_to", "calibration_tokens": r.get("calibration_tokens"),
        "forward_equivalents": r.get("forward_equivalents")}
    points.append(point)
    base = held.first(held.base)
    return {"model": data.get("model", getattr(model, "name", None)), "base_ppl": base if hasattr(model, "lm_head")
            else None, "points": sorted(points, key=lambda p: (str(p["order"]), str(p["compensate"]), p["fraction"])),
            "calibration": data.get("calibration"), "held_out": data.get("held_out"), "default": point,
            "default_order": order, "default_compensate": comp, **domains}


def _steps(model, texts, *, seed: int, sizes: Sizes, sample: str | None, progress: bool,
           done: dict, results_dir=None, timings: dict | None = None, weights: str | None = None) -> list[Step]:
    """The report's steps in order; `done` holds the results so far (pruning reuses importance)."""
    from headcount.report.accounts import accounts, shape_json, shape_of, window_note
    from headcount.report.checks import chapter_checks
    from headcount.report.sample import DEFAULT_SAMPLE, sample_attention
    from headcount.report.trained import EXPERIMENT_NAMES, experiment_section, experiment_source, gates_source

    n_layers = len(model.layers)
    decoder = hasattr(model, "lm_head")
    cal, held = split_texts(texts)
    if not decoder:  # encoders: surgery calibrates / measures on sentences; keep them few
        from headcount.analysis.batches import split_sentences
        cal_s = split_sentences(cal, part="calibration", max_sentences=sizes.encoder_sentences)
        held_s = split_sentences(held, part="held_out", max_sentences=sizes.encoder_sentences)
    else:
        cal_s, held_s = cal, held
    held_out = HeldOut(model, held_s, sizes, timings)
    sentence = sample or DEFAULT_SAMPLE
    faith_layers = _spread(n_layers, sizes.faithfulness_layers)
    w = min(sizes.window, model.config.max_position)
    windows = {}

    def calib(n: int, window: int | None = None):
        if (n, window) not in windows:
            windows[n, window] = calibration_input(model, cal_s, sizes, n, window)
        return windows[n, window]

    try:
        order = default_of(_fn("surgery", "prune_to"), "order", "gradient")
    except MISSING:
        order = "gradient"
    from headcount.analysis.head_importance import METHODS
    method = order if isinstance(order, str) and order in METHODS else "gradient"

    def shape_step():
        s = shape_of(model)
        return {"shape": shape_json(s, window_note(model)), "accounts": accounts(s)}

    def roles_step():
        return call_with(_fn("analysis", "roles"), model, cal, max_tokens=sizes.roles_tokens, window=w,
                         max_sentences=sizes.roles_sentences, seed=seed, progress=progress)

    def faithfulness_step():
        if not decoder:
            raise NotApplicable("faithfulness needs a causal language model (a next-token loss); "
                                f"{getattr(model, 'name', 'this model')} is an encoder")
        return call_with(_fn("analysis", "faithfulness"), model, held, layers=faith_layers,
                         n_examples=sizes.faithfulness_examples, steps=sizes.faithfulness_steps, seed=seed,
                         progress=progress)

    def rank_step():
        return call_with(_fn("analysis", "rank"), model, cal, max_windows=sizes.rank_examples, seed=seed,
                         progress=progress)

    def importance_step():
        fn = _fn("analysis", "importance")
        if decoder:
            return call_with(fn, model, method=method, windows=calib(sizes.importance_windows), max_windows=None,
                             window=w, progress=progress)
        return call_with(fn, model, cal, method=method, window=w, max_windows=sizes.importance_windows,
                         max_sentences=sizes.encoder_sentences, progress=progress)

    def pruning_step():
        scores = None
        if done.get("importance") and done["importance"].get("method") == method:
            scores = {method: _fn("analysis", "HeadScores").from_json(done["importance"])}
        return pruning_section(model, calibration=calib(sizes.importance_windows), held=held_out, sizes=sizes,
                               seed=seed, scores=scores, progress=progress)

    from headcount.report import commands

    # the commands' own results (issue 26): saved for these weights, or their defaults run here (commands.py)
    import functools
    weights_of = (lambda: weights) if weights else functools.cache(lambda: weights_hash(model))  # hashed once
    name = getattr(model, "name", None)
    user_text = texts is not None  # the commands measure the default corpus's domains: a user's text is not theirs

    def command_step(section):
        def run():
            if user_text and section is commands.merge_section:  # the merge on the user's text, at the report's sizes
                steps = {k: v for k, v in (("local_steps", sizes.merge_local_steps),
                                           ("uptrain_steps", sizes.merge_uptrain_steps)) if v is not None}
                return commands.text_merge_section(model, calibration=calib(sizes.merge_windows), held=held_out,
                                                   n_windows=sizes.merge_windows, window=w, progress=progress, **steps)
            if user_text:
                raise NotApplicable("the report's own text: the commands calibrate and measure on the default corpus "
                                    "(run the command with --text FILE for this text)")
            return section(model, results=results_dir, weights=weights_of, progress=progress)
        return run

    def source_of(kind):
        if user_text:
            return {"source": "text", "windows": sizes.merge_windows, "eval": sizes.eval_windows,
                    "steps": [sizes.merge_local_steps, sizes.merge_uptrain_steps]}
        return commands.command_source(results_dir, name, kind, weights_of)

    try:
        _fn("surgery", "train_gates")
        trainable = True
    except MISSING:
        trainable = False

    # a saved gates result counts only for the weights it was measured on (its weights_sha256, when it has one)
    gate_source = gates_source(results_dir, getattr(model, "name", None), weights_of)

    def gates_step():  # the gates bench's saved result for this model when there is one, else a short run here
        from headcount.report.trained import gates_section, saved_gates
        if gate_source["source"] == "saved":
            return saved_gates(results_dir, getattr(model, "name", None), weights_of)
        if not trainable:
            _fn("surgery", "train_gates")  # raises the reason: `unavailable`
        gw = min(sizes.gate_window, w)
        return gates_section(model, calibration=calib(sizes.gate_windows, gw), held=held_out, steps=sizes.gate_steps,
                             n_windows=sizes.gate_windows, window=gw, calibration_windows=sizes.gate_windows,
                             lr=sizes.gate_lr, progress=progress)

    sized = {"seed": seed, "window": w}  # with each step's own sizes below: its cache key
    cal_key = {"calibration": sizes.importance_windows, "eval": sizes.eval_windows,
               "sentences": sizes.encoder_sentences}
    domain_key = {"domains": [sizes.domain_windows, sizes.domain_window]}  # issue 16: code and source too
    steps = [
        Step("shape", {"version": 2}, shape_step),  # 2: q/k norms, post norms, windows, gated GELU, RMSNorm
        Step("checks", {"sentence": sentence, "version": 3}, lambda: chapter_checks(model, sentence)),
        Step("sample", {"sentence": sentence}, lambda: sample_attention(model, sentence)),
        Step("roles", sized | {"tokens": sizes.roles_tokens, "sentences": sizes.roles_sentences}, roles_step),
        Step("faithfulness", sized | {"layers": faith_layers, "examples": sizes.faithfulness_examples,
                                      "steps": sizes.faithfulness_steps},
             faithfulness_step),
        Step("rank", sized | {"examples": sizes.rank_examples}, rank_step),
        Step("importance", sized | {"windows": sizes.importance_windows, "method": method}, importance_step,
             optional=True),
        Step("pruning", sized | cal_key | domain_key | {"fractions": list(sizes.pruning_fractions), "order": method,
                                                        "random": list(sizes.random_fractions), "defaults": 2},
             pruning_step, optional=True),
        Step("prune_command", {"version": 1} | source_of("prune"), command_step(commands.prune_section),
             optional=True),
        Step("kv_merge", {"version": 4} | source_of("merge"), command_step(commands.merge_section), optional=True),
        Step("healing", {"version": 1} | source_of("heal"), command_step(commands.healing_section), optional=True),
        Step("gates", sized | cal_key | gate_source | {"steps": sizes.gate_steps, "windows": sizes.gate_windows,
                                                       "version": 3, "gate_window": sizes.gate_window,
                                                       "lr": sizes.gate_lr, "trained": trainable},
             gates_step, optional=True),
    ]
    for name in EXPERIMENT_NAMES:
        steps.append(Step(f"experiment-{name}", {"seed": seed} | experiment_source(name, results_dir),
                          lambda n=name: experiment_section(n, results=results_dir, seed=seed, progress=progress),
                          optional=True, model_free=True))
    return steps


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
        HeldOut.DOMAIN_TIMING the part of the pruning and kv_merge steps spent on the two extra held-out domains.
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
    got = Collected()
    if results_dir is DEFAULT_RESULTS:
        from headcount.report.trained import results_dir as default_results
        results_dir = default_results()
    steps = _steps(model, texts, seed=seed, sizes=sizes, sample=sample, progress=progress, done=got.results,
                   results_dir=results_dir, timings=timings, weights=None if w_hash == "uncached" else w_hash)
    bar = _progress(len(steps), progress)
    try:
        for step in steps:
            bar.set_description(f"report: {step.name}")
            if only is not None and step.name not in only:
                got.unavailable[step.name] = "not run"
                bar.update(1)
                continue
            if step.model_free:  # the same result whichever model or text the report is on
                key = cache_key(step.name, weights="-", text="-", params=step.params)
            else:
                key = cache_key(step.name, weights=w_hash, text=t_hash,
                                params=step.params | {"model": getattr(model, "name", None)})
            t0 = time.perf_counter()
            try:
                value = cache.get_or_compute(step.name, key,
                                             lambda s=step: json.loads(json.dumps(normalise(_untimed(s.run())))))
            except NotApplicable as err:
                got.unavailable[step.name] = str(err)
            except MISSING as err:
                got.unavailable[step.name] = _reason(step.name, err)
            except ValueError as err:
                if not step.optional:
                    raise
                got.unavailable[step.name] = f"failed on this model: {' '.join(str(err).split())}"
            else:
                got.results[step.name] = value
            if timings is not None:
                timings[step.name] = time.perf_counter() - t0
            bar.update(1)
    finally:
        bar.close()
    return assemble(model_name=str(getattr(model, "name", None) or type(model).__name__),
                    kind="decoder" if hasattr(model, "lm_head") else "encoder",
                    results=got.results, unavailable=got.unavailable,
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


def _reason(name: str, err: BaseException) -> str:
    where = "headcount.surgery" if name in ("pruning", "prune_command", "kv_merge", "healing", "gates") else \
        "headcount.experiments" if name.startswith("experiment-") else "headcount.analysis"
    msg = " ".join(str(err).split())
    return f"{where} does not provide it here ({type(err).__name__}: {msg})" if msg else \
        f"{where} does not provide it here ({type(err).__name__})"


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
    shape_part = results.get("shape") or {}
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
