"""One edit pipeline for prune, prune --method l0, merge-kv, heal and the report.

    report = run_edit(model, lambda m: prune_to(m, 0.2), meter=QualityMeter(), heal=healer)
    report.quality["before_edit"], report.quality["after_edit"], report.quality["after_heal"]   Quality
    report.to_json()   the edit commands' --json, one schema for every edit (SCHEMA_KEYS, below)

Every stage is measured by the same QualityMeter (same held-out tokens, same tasks), so a new measure added
to the meter reaches every command and the report at once. to_json() is what every edit command prints with
--json: the same top-level keys for prune, merge-kv, heal and any edit to come (SCHEMA_KEYS), the edit's own
result under "edit", the healing's under "heal"; a command's older keys (`extra`, Edit.legacy_keys) are added
beside them, never in their place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from headcount.surgery.quality import Quality, QualityMeter

STAGES = ("before_edit", "after_edit", "after_heal")
ACCOUNTS = ("heads", "kv_heads", "params", "kv_bytes_per_token")
# every edit's --json, top level: the accounts before / after, the quality (legacy_quality's keys, held_out per
# stage, quality per stage, tasks), the weights' hashes, the cost, the edit's and the healing's own results, where
# the model went and the command that produced it
SCHEMA_KEYS = (*(f"{k}_{when}" for when in ("before", "after") for k in ACCOUNTS),
               "ppl_before", "ppl_after", "ppl_by_domain_before", "ppl_by_domain_after", "ppl_by_domain_healed",
               "fidelity_after", "held_out", "quality", "tasks", "weights_sha256", "edited_weights_sha256",
               "seconds", "forward_equivalents", "edit", "heal", "out", "command")


def accounts(model) -> dict:
    """What the edit changes in the model's shape: head counts, parameters, KV cache bytes per token."""
    from headcount.surgery.pruning.removal import count_heads, kv_bytes_per_token, n_params

    heads, kv_heads = count_heads(model)
    return {"heads": heads, "kv_heads": kv_heads, "params": n_params(model),
            "kv_bytes_per_token": kv_bytes_per_token(model)}


@dataclass
class EditReport:
    """One edit, measured: quality at each stage, the accounts before and after, the weights' hashes."""

    quality: dict  # {stage: Quality}, stages in STAGES order ("after_heal" only when healed)
    accounts_before: dict
    accounts_after: dict
    weights_sha256: str  # the unedited weights: what a saved result is keyed by
    edited_weights_sha256: str  # after the edit, before any healing
    edit: dict | None = None  # the edit's own result (PruneResult / MergeResult .to_json())
    healing: dict | None = None  # HealResult.to_json() when healed
    seconds: float = 0.0
    command: str = ""
    extra: dict = field(default_factory=dict)  # a command's older keys, beside the schema's (Edit.legacy_keys)
    out: str | None = None  # where the edited model was saved
    heads_counted: str = "query"  # what heads_before / heads_after count: "query" heads, or "kv" heads (merge-kv)

    @property
    def decoder(self) -> bool:
        return bool(self.quality["before_edit"].perplexity)

    def held_out(self) -> dict:
        """{stage: {domain: perplexity}} (decoder) or {stage: {domain: {cosine, spearman}}} (encoder)."""
        return {s: (q.perplexity or q.fidelity) for s, q in self.quality.items()}

    def tasks(self) -> dict:
        """{task label: {stage: pass@1, "pass_at_1_ci95": {stage: [lo, hi]}, "paired": {stage: {...}}}}: the --eval
        JSON block; the intervals and the paired comparisons against before_edit where each problem's verdict was
        kept (surgery.task_scores.stage_statistics)."""
        from headcount.surgery.task_scores import stage_statistics

        out: dict = {}
        for stage, q in self.quality.items():
            for label, value in q.tasks.items():
                out.setdefault(label, {})[stage] = value
        for label, block in out.items():
            block.update(stage_statistics({stage: q.task_verdicts[label] for stage, q in self.quality.items()
                                           if label in q.task_verdicts}))
        return out

    def legacy_quality(self) -> dict:
        """The quality keys the edit commands' JSON carries: ppl_before / ppl_after (the first domain),
        ppl_by_domain_* (the three domains of the default corpus, else None), fidelity_after (an encoder),
        ppl_by_domain_healed."""
        before, after = self.quality["before_edit"], self.quality["after_edit"]
        if not self.decoder:
            cos, rho = after.headline
            return {"ppl_before": None, "ppl_after": None, "fidelity_after": {"cosine": cos, "spearman": rho},
                    "ppl_by_domain_before": None, "ppl_by_domain_after": None, "ppl_by_domain_healed": None}
        by_domain = len(before.perplexity) > 1
        healed = self.quality.get("after_heal")
        return {"ppl_before": before.headline, "ppl_after": after.headline,
                "ppl_by_domain_before": dict(before.perplexity) if by_domain else None,
                "ppl_by_domain_after": dict(after.perplexity) if by_domain else None,
                "ppl_by_domain_healed": dict(healed.perplexity) if healed is not None else None,
                "fidelity_after": None}

    def forward_equivalents(self) -> float | None:
        """The work, in forward passes over the calibration: the edit's own, or the healing's when the model
        arrived edited (`headcount heal`)."""
        for block in (self.edit, self.healing):
            if isinstance(block, dict) and block.get("forward_equivalents") is not None:
                return round(block["forward_equivalents"], 2)
        return None

    def to_json(self) -> dict:
        """The edit commands' --json: SCHEMA_KEYS, in that order, then the command's older keys (extra)."""
        data = {f"{k}_{when}": accounts[k] for when, accounts in (("before", self.accounts_before),
                                                                   ("after", self.accounts_after)) for k in ACCOUNTS}
        if self.heads_counted == "kv":  # merge-kv's heads_*: the KV heads, what the merge changes
            data["heads_before"], data["heads_after"] = data["kv_heads_before"], data["kv_heads_after"]
        data |= self.legacy_quality()
        data |= {"held_out": self.held_out(), "quality": {s: q.to_json() for s, q in self.quality.items()},
                 "tasks": self.tasks(), "weights_sha256": self.weights_sha256,
                 "edited_weights_sha256": self.edited_weights_sha256, "seconds": round(self.seconds, 1),
                 "forward_equivalents": self.forward_equivalents(), "edit": self.edit, "heal": self.healing,
                 "out": self.out, "command": self.command}
        return data | {k: v for k, v in self.extra.items() if k not in data}

    @classmethod
    def from_json(cls, data: dict) -> "EditReport":
        """Back from to_json (a saved result): quality, accounts and hashes; the commands' extra keys dropped."""
        quality = {s: Quality.from_json(q) for s, q in data["quality"].items()}
        return cls(quality, {k: data[f"{k}_before"] for k in ACCOUNTS}, {k: data[f"{k}_after"] for k in ACCOUNTS},
                   data["weights_sha256"], data["edited_weights_sha256"], edit=data.get("edit"),
                   healing=data.get("heal"), seconds=data.get("seconds", 0.0), command=data.get("command") or "",
                   out=data.get("out"))


def run_edit(model, edit, *, meter: QualityMeter, heal=None, unedited=None, before: Quality | None = None,
             check_dtype=None, what: str = "the edited model's held-out quality") -> EditReport:
    """Measure, edit, measure, heal, measure.

    model: edited in place. edit: callable(model) -> the edit's result (anything with to_json(), or None); or
    None when `model` arrives edited (`headcount heal`), with `unedited` the model before the edit.
    heal: callable(model, before: Quality, after: Quality) -> HealResult-like dict (with "held_out":
    {"after_heal": {domain: perplexity}}) or None for no healing; its after-heal figures are reused, not
    measured twice. before: the unedited model's Quality already measured (prune --joint measures before its
    gates train the model). check_dtype: the model's dtype, named when a perplexity comes out NaN / inf.
    """
    from headcount.models.fingerprint import weights_hash

    start = time.perf_counter()
    source = unedited if edit is None else model
    if source is None:
        raise ValueError("run_edit: edit=None means the model arrives edited; pass unedited= (the model before)")
    weights = weights_hash(source)
    accounts_before = accounts(source)
    quality = {"before_edit": before if before is not None else meter.measure(source)}
    result = edit(model) if edit is not None else None
    quality["after_edit"] = meter.measure(model)
    quality["after_edit"].check_finite(what, check_dtype)
    edited = weights_hash(model)
    healing = None
    if heal is not None:
        healing = heal(model, quality["before_edit"], quality["after_edit"])
        if healing is not None:
            figures = ((healing.get("held_out") or {}).get("after_heal")) if isinstance(healing, dict) else None
            quality["after_heal"] = meter.measure(model, known=figures)
    return EditReport(quality, accounts_before, accounts(model), weights, edited,
                      edit=result.to_json() if hasattr(result, "to_json") else result, healing=healing,
                      seconds=time.perf_counter() - start)
