"""The report's held-out measure: surgery's one QualityMeter at the report's sizes, the unmodified model measured
once per report run, whichever step asks first.

    meter = ReportMeter(model, held, sizes, timings)
    meter.quality(model) -> surgery.quality.Quality     meter.headline(model) -> ppl | (cosine, spearman)
    meter.base -> the unmodified model's Quality        meter.domains(before, after) -> the sections' domain keys

Decoder on the default corpus: prose on sizes.eval_windows windows of the report's window (the headline), code and
standard-library source on sizes.domain_windows windows of sizes.domain_window tokens (QualityMeter's sizes=), the
three domains of headcount.data.held_out_domains. A user's text: its held-out part, one set ("text"), its window
shortened to the text when the text is short. Encoders: embedding fidelity on the held-out sentences, against the
unmodified model's embeddings.
"""

from __future__ import annotations

import math
import time

from headcount.surgery.quality import Quality, QualityMeter

SENTENCES_PER_WINDOW = 16  # QualityMeter measures an encoder on 16 sentences per eval window


class ReportMeter:
    TIMING = "of which held-out quality"  # collect(timings=): the seconds the steps spent measuring held-out quality

    def __init__(self, model, held, sizes, timings: dict | None = None):
        """held: the held-out texts (None: the default corpus; an encoder's: its held-out sentences)."""
        self.model, self.held, self.sizes, self.timings = model, held, sizes, timings
        self.decoder = hasattr(model, "lm_head")
        self.window = min(sizes.window, model.config.max_position)
        if self.decoder and held is not None:  # a short user text: one shorter window
            from headcount.analysis.batches import resolve_texts
            from headcount.models.evaluation import token_stream
            self.window = max(2, min(self.window, len(token_stream(model, resolve_texts(held, "held_out")))))
        windows = sizes.eval_windows
        if not self.decoder:  # every one of the (at most encoder_sentences) held-out sentences
            windows = math.ceil(sizes.encoder_sentences / SENTENCES_PER_WINDOW)
        domain = (sizes.domain_windows, sizes.domain_window)
        self.meter = QualityMeter(held, eval_windows=windows, window=self.window, domains=self.domains_apply,
                                  sizes={"code": domain, "source": domain} if self.domains_apply else None)
        self._base: Quality | None = None

    @property
    def domains_apply(self) -> bool:
        """The three held-out domains are measured for a decoder on the default corpus (as surgery's commands do)."""
        return self.decoder and self.held is None

    def quality(self, model, known: dict | None = None) -> Quality:
        if not self.decoder:
            self.meter.references(self.model)  # the unmodified model's embeddings, whichever model comes first
        t0 = time.perf_counter()
        found = self.meter.measure(model, known)
        if self.timings is not None:
            self.timings[self.TIMING] = self.timings.get(self.TIMING, 0.0) + time.perf_counter() - t0
        return found

    def headline(self, model):
        """The one number: prose (or the text's) perplexity, or an encoder's (cosine, spearman)."""
        return self.quality(model).headline

    @property
    def base(self) -> Quality:
        if self._base is None:
            self._base = self.quality(self.model)
        return self._base

    def know_base(self, curve: dict) -> None:
        """The unmodified model's headline perplexity from a pruning curve evaluated on the same windows (decoders):
        the base measure then covers only the other domains."""
        if self._base is None and self.decoder and curve.get("base_by_text"):
            self._base = self.quality(self.model, known=dict(curve["base_by_text"]))

    @property
    def domain_sizes(self) -> dict:
        """{domain: [windows, tokens per window]} of the three domains' measures."""
        w = min(self.sizes.domain_window, self.model.config.max_position)
        return {"prose": [self.sizes.eval_windows, self.window], "code": [self.sizes.domain_windows, w],
                "source": [self.sizes.domain_windows, w]}

    def domains(self, after: Quality) -> dict:
        """What a section adds for the three held-out domains: {"ppl_by_domain_before", "ppl_by_domain_after",
        "domain_sizes"} (the names surgery's commands use in their --json), or {"domains_note": why not}."""
        if not self.domains_apply:
            why = ("an encoder's held-out quality is embedding fidelity on prose sentences" if not self.decoder
                   else "the report's own text: its held-out part is the one held-out set")
            return {"domains_note": why}
        return {"ppl_by_domain_before": dict(self.base.perplexity), "ppl_by_domain_after": dict(after.perplexity),
                "domain_sizes": self.domain_sizes}
