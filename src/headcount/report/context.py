"""What every report step reads: the run's Context (the model, the texts, the sizes, the held-out meter, the
calibration windows built once per size, the results so far) and Step, one cached unit of report.json.

    ctx = Context.build(model, texts, seed=, sizes=, sample=, progress=, results_dir=, timings=, weights=)
    Step(name, params, run, model_free)     params (with the weights' and the text's hashes) is the cache key

A measure module (report/measures/) builds its Steps from a Context; collect.py runs them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from headcount.analysis.batches import split_sentences
from headcount.analysis.head_importance import METHODS
from headcount.report.cache import weights_hash
from headcount.report.curve import calibration_input, prune_to_default
from headcount.report.meter import ReportMeter
from headcount.report.sample import DEFAULT_SAMPLE


@dataclass
class Step:
    name: str
    params: dict
    run: Callable[["Context"], Any]
    model_free: bool = False  # the result does not depend on the model or the text (the experiments)


def spread(n_layers: int, k: int) -> list[int]:
    """k layers spread evenly over the depth, first and last included."""
    if k >= n_layers:
        return list(range(n_layers))
    if k <= 1:
        return [n_layers // 2]
    return sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)})


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


@dataclass
class Context:
    """What the steps read and share: the model, the texts (cal / held: the split text, None for the default
    corpus; *_s: an encoder's sentences), the sizes, the held-out meter, the calibration windows (built once per
    size), the results so far (pruning reuses importance's scores) and the weights' hash (a function: hashed once)."""
    model: Any
    texts: list[str] | None
    seed: int
    sizes: Any
    sample: str
    progress: bool
    results_dir: Any
    weights: Callable[[], str]
    cal: list[str] | None
    held: list[str] | None
    cal_s: list[str] | None
    meter: ReportMeter
    window: int
    method: str
    done: dict = field(default_factory=dict)
    _windows: dict = field(default_factory=dict)

    @classmethod
    def build(cls, model, texts, *, seed: int, sizes, sample: str | None, progress: bool, results_dir,
              timings: dict | None, weights: str | None) -> "Context":
        cal, held = split_texts(texts)
        cal_s, held_s = cal, held
        if not hasattr(model, "lm_head"):  # encoders: surgery calibrates / measures on sentences; keep them few
            cal_s = split_sentences(cal, part="calibration", max_sentences=sizes.encoder_sentences)
            held_s = split_sentences(held, part="held_out", max_sentences=sizes.encoder_sentences)
        order = prune_to_default("order")
        return cls(model, texts, seed, sizes, sample or DEFAULT_SAMPLE, progress, results_dir,
                   (lambda: weights) if weights else functools.cache(lambda: weights_hash(model)), cal, held, cal_s,
                   ReportMeter(model, held_s, sizes, timings), min(sizes.window, model.config.max_position),
                   order if isinstance(order, str) and order in METHODS else "gradient")

    @property
    def decoder(self) -> bool:
        return hasattr(self.model, "lm_head")

    @property
    def name(self) -> str | None:
        return getattr(self.model, "name", None)

    @property
    def user_text(self) -> bool:
        """A user's text: the commands calibrate and measure on the default corpus, so their results are not its."""
        return self.texts is not None

    @property
    def faithfulness_layers(self) -> list[int]:
        return spread(len(self.model.layers), self.sizes.faithfulness_layers)

    def calibration(self, n: int, window: int | None = None):
        if (n, window) not in self._windows:
            self._windows[n, window] = calibration_input(self.model, self.cal_s, self.sizes, n, window)
        return self._windows[n, window]

    @property
    def sized(self) -> dict:
        """The cache-key parameters of every step over windows of text: the seed and the window."""
        return {"seed": self.seed, "window": self.window}

    @property
    def calibration_key(self) -> dict:
        """The cache-key parameters of a step that calibrates on windows and measures held-out perplexity."""
        s = self.sizes
        return {"calibration": s.importance_windows, "eval": s.eval_windows, "sentences": s.encoder_sentences}

    @property
    def domains_key(self) -> dict:
        """... and measures the two other held-out domains (code, source) too."""
        return {"domains": [self.sizes.domain_windows, self.sizes.domain_window]}

