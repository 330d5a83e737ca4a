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

import copy
import inspect
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from headcount.report.cache import ResultCache, cache_key, text_hash, weights_hash

DIGITS = 6  # significant digits kept for every float in report.json
FORMAT = 1  # report.json's format version



class NotApplicable(NotImplementedError):
    """A section that does not apply to this model (e.g. faithfulness on an encoder)."""


MISSING = (ImportError, AttributeError, NotImplementedError)


@dataclass(frozen=True)
class Sizes:
    """How much text each analysis sees: sized so `make demo` stays under 8 minutes on 2 cores."""

    roles_tokens: int = 2048  # tokens of windows for previous/duplicate/positional/sink
    roles_sentences: int = 64  # parsed sentences for syntactic / rare_word
    faithfulness_layers: int = 3  # layers (spread over the depth) for the adversarial search
    faithfulness_examples: int = 2
    rank_examples: int = 2
    importance_windows: int = 4
    pruning_fractions: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)
    eval_windows: int = 4  # held-out windows for every perplexity (pruning curve, K/V merge)
    merge_windows: int = 4  # calibration windows for the K/V merge
    window: int = 256
    encoder_sentences: int = 64  # calibration / held-out sentences for an encoder's pruning and merge


FULL = Sizes()
QUICK = Sizes(roles_tokens=512, roles_sentences=16, faithfulness_layers=2, faithfulness_examples=2,
              rank_examples=1, importance_windows=2, pruning_fractions=(0.2, 0.4), eval_windows=2, merge_windows=2,
              window=128, encoder_sentences=24)


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


def call_with(fn: Callable, *args, **kwargs):
    """Call fn with the keyword arguments its signature accepts (the others are dropped)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


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
    optional: bool = False  # importance / pruning / kv_merge: only in report.json when present


@dataclass
class Collected:
    results: dict = field(default_factory=dict)
    unavailable: dict = field(default_factory=dict)


def _fn(package: str, name: str):
    """headcount.<package>.<name> through the package's public (lazy) exports; raises ImportError or
    AttributeError while the function is not there yet."""
    import importlib
    import types
    obj = getattr(importlib.import_module(f"headcount.{package}"), name)
    if isinstance(obj, types.ModuleType):  # a submodule named like its function shadowed the export
        obj = getattr(obj, name)
    if not callable(obj):
        raise AttributeError(f"headcount.{package}.{name} is not a function")
    return obj


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


def _ppl(model, held: list[str] | None, sizes: Sizes) -> float | None:
    if not hasattr(model, "lm_head"):
        return None  # an encoder has no perplexity
    from headcount.analysis.batches import resolve_texts
    from headcount.models.evaluation import perplexity
    held = resolve_texts(held, part="held_out")
    return perplexity(model, held, sizes.window, max_tokens=sizes.eval_windows * sizes.window)


def kv_merge_section(model, target: int, *, calibration, held: list[str] | None, sizes: Sizes,
                     progress: bool) -> dict:
    """Merge a copy of `model`'s K/V heads down to `target` per layer and measure what it costs on held-out
    text: {heads_before, heads_after, params_before, params_after, kv_bytes_per_token_before/after,
    ppl_before, ppl_after, method, merge}."""
    merge_kv = _fn("surgery", "merge_kv")
    copy_ = copy.deepcopy(model)
    before = {"heads_before": model.layers[0].attn.n_kv_heads, "params_before": _n_params(model),
              "kv_bytes_per_token_before": sum(l.attn.new_cache(1, 1).nbytes for l in model.layers),
              "ppl_before": _ppl(model, held, sizes)}
    # an encoder has no perplexity to show the merge's cost: the quick mean-pooled merge is enough there
    method = "aware" if hasattr(model, "lm_head") else "mean"
    result = call_with(merge_kv, copy_, target, method=method, calibration=calibration,
                       n_windows=sizes.merge_windows, window=sizes.window, progress=progress)
    data = result.to_json() if hasattr(result, "to_json") else {}
    after = {"heads_after": copy_.layers[0].attn.n_kv_heads, "params_after": _n_params(copy_),
             "kv_bytes_per_token_after": sum(l.attn.new_cache(1, 1).nbytes for l in copy_.layers),
             "ppl_after": _ppl(copy_, held, sizes)}
    out = {**before, **after, "method": data.get("method"), "eval_tokens": sizes.eval_windows * sizes.window}
    out["merge"] = {k: v for k, v in data.items() if k not in ("layers",)}
    return out


def _steps(model, texts, *, seed: int, sizes: Sizes, sample: str | None, progress: bool,
           done: dict) -> list[Step]:
    """The report's steps in order; `done` holds the results so far (pruning reuses importance)."""
    from headcount.report.accounts import _variants, accounts, shape_json, shape_of
    from headcount.report.sample import DEFAULT_SAMPLE, sample_attention

    n_layers = len(model.layers)
    cal, held = split_texts(texts)
    if not hasattr(model, "lm_head"):  # encoders: surgery calibrates / measures on sentences; keep them few
        from headcount.analysis.batches import split_sentences
        cal_s = split_sentences(cal, part="calibration", max_sentences=sizes.encoder_sentences)
        held_s = split_sentences(held, part="held_out", max_sentences=sizes.encoder_sentences)
    else:
        cal_s, held_s = cal, held
    sentence = sample or DEFAULT_SAMPLE
    faith_layers = _spread(n_layers, sizes.faithfulness_layers)
    w = min(sizes.window, model.config.max_position)

    def shape_step():
        s = shape_of(model)
        return {"shape": shape_json(s), "accounts": accounts(s)}

    def roles_step():
        return call_with(_fn("analysis", "roles"), model, cal, max_tokens=sizes.roles_tokens, window=w,
                         max_sentences=sizes.roles_sentences, seed=seed, progress=progress)

    def faithfulness_step():
        if not hasattr(model, "lm_head"):
            raise NotApplicable("faithfulness needs a causal language model (a next-token loss); "
                                f"{getattr(model, 'name', 'this model')} is an encoder")
        return call_with(_fn("analysis", "faithfulness"), model, held,
                         layers=faith_layers, n_examples=sizes.faithfulness_examples, seed=seed, progress=progress)

    def rank_step():
        return call_with(_fn("analysis", "rank"), model, cal, max_windows=sizes.rank_examples, seed=seed,
                         progress=progress)

    def importance_step():
        return call_with(_fn("analysis", "importance"), model, cal, method="gradient", window=w,
                         max_windows=sizes.importance_windows, progress=progress)

    def pruning_step():
        fn = _fn("surgery", "pruning_curve")
        scores = None
        if done.get("importance"):
            scores = {"gradient": _fn("analysis", "HeadScores").from_json(done["importance"])}
        return fn(model, fractions=list(sizes.pruning_fractions), orders=("gradient", "random"),
                  compensations=("none", "lstsq"), seeds=(seed,), calibration=cal_s, held_out=held_s,
                  eval_windows=sizes.eval_windows, window=w, calibration_windows=sizes.merge_windows, scores=scores,
                  progress=progress)

    attn = model.layers[0].attn
    targets = [kv for _, kv in _variants(attn.n_heads, attn.n_kv_heads) if kv < attn.n_kv_heads]

    def merge_step():
        if not targets:
            raise NotApplicable("the model already has one KV head (MQA): nothing to merge")
        return kv_merge_section(model, targets[0], calibration=cal_s, held=held_s, sizes=sizes, progress=progress)

    sized = {"seed": seed, "window": w}  # with each step's own sizes below: its cache key
    return [
        Step("shape", {}, shape_step),
        Step("sample", {"sentence": sentence}, lambda: sample_attention(model, sentence)),
        Step("roles", sized | {"tokens": sizes.roles_tokens, "sentences": sizes.roles_sentences}, roles_step),
        Step("faithfulness", sized | {"layers": faith_layers, "examples": sizes.faithfulness_examples},
             faithfulness_step),
        Step("rank", sized | {"examples": sizes.rank_examples}, rank_step),
        Step("importance", sized | {"windows": sizes.importance_windows, "method": "gradient"}, importance_step,
             optional=True),
        Step("pruning", sized | {"fractions": list(sizes.pruning_fractions), "windows": sizes.eval_windows,
                                 "calibration": sizes.merge_windows, "sentences": sizes.encoder_sentences},
             pruning_step, optional=True),
        Step("kv_merge", sized | {"target": targets[:1], "windows": sizes.merge_windows, "method": 2,
                                  "eval": sizes.eval_windows, "sentences": sizes.encoder_sentences}, merge_step,
             optional=True),
    ]


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="report", unit="step", file=sys.stderr, disable=not enabled, leave=True)


def collect(model, texts: str | Sequence[str] | None = None, *, seed: int = 0, quick: bool = False,
            sample: str | None = None, cache: ResultCache | None = None, progress: bool = True,
            only: Sequence[str] | None = None, sizes: Sizes | None = None, timings: dict | None = None) -> dict:
    """Every section of report.json for `model` (see the module docstring).

    texts: None = the calibration part of the default corpus; a string or list of strings otherwise.
    only: run just these steps (the others are marked unavailable: "not run"); sizes: override FULL / QUICK.
    timings: a dict to receive each step's wall-clock seconds (kept out of report.json: it varies).
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
    steps = _steps(model, texts, seed=seed, sizes=sizes, sample=sample, progress=progress, done=got.results)
    bar = _progress(len(steps), progress)
    try:
        for step in steps:
            bar.set_description(f"report: {step.name}")
            if only is not None and step.name not in only:
                got.unavailable[step.name] = "not run"
                bar.update(1)
                continue
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
    where = "headcount.surgery" if name in ("pruning", "kv_merge") else "headcount.analysis"
    msg = " ".join(str(err).split())
    return f"{where} does not provide it here ({type(err).__name__}: {msg})" if msg else \
        f"{where} does not provide it here ({type(err).__name__})"


def assemble(*, model_name: str, kind: str, results: dict, unavailable: dict | None = None,
             params: dict | None = None) -> dict:
    """report.json from the steps' JSON results (what the HTML builder reads; testable without a model).

    results: {"shape": {"shape", "accounts"}, "sample", "roles", "faithfulness", "rank",
              and optionally "importance", "pruning", "kv_merge"}.
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
    for key in ("importance", "pruning", "kv_merge"):
        if results.get(key) is not None:
            report[key] = results[key]
    for key in ("shape", "sample", "roles", "faithfulness", "rank"):
        if report.get(key) is None and key not in unavailable:
            unavailable[key] = "not computed"
    report["unavailable"] = unavailable
    report["claims"] = read_claims(report)
    return normalise(report)
