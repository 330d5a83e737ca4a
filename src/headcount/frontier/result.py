"""A frontier as data: one Row per measured model (the unedited one, each point, each point healed) and the
labels of the rows no other beats. The command only formats these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Row:
    point: str  # the spec as given ("merge:0.75"), or "unedited"
    healed: bool  # True: the point after --heal-steps of distillation from the unedited model
    kv_bytes_per_token: int
    attention_flops_per_token: int | None  # one token's attention FLOPs at the model's context (decoders)
    attention_flops_per_token_4k: int | None  # the same at a context of 4,096 tokens
    context: int  # the model's context (max_position): where attention_flops_per_token is counted
    params: int
    perplexity: dict = field(default_factory=dict)  # {domain: held-out perplexity} (decoder)
    fidelity: dict = field(default_factory=dict)  # {domain: {cosine, spearman}} (encoder)
    pass_at_1: float | None = None
    pass_at_1_ci95: list | None = None  # Wilson's 95% interval [lo, hi]
    paired: dict | None = None  # tasks.stats.paired against the unedited row: wins, losses, difference, ci95, p_value
    problems: dict = field(default_factory=dict)  # {task_id: passed}, what `paired` reads
    seconds: float = 0.0  # spent on this row: the edit (and heal) and its measurements
    edit: dict = field(default_factory=dict)  # what each step did: {"merge:0.75": {"plan": {...}}, ...}
    frontier: bool = False  # no other row beats it on KV bytes and the score
    frontier_flops: bool = False  # no other row beats it on attention FLOPs (model's context) and the score

    @property
    def label(self) -> str:
        return f"{self.point} healed" if self.healed else self.point

    def score(self, by: str) -> float | None:
        """The frontier's score (higher is better): pass@1, or minus the held-out perplexity's geometric mean over
        the domains, or an encoder's mean cosine."""
        if by == "pass_at_1":
            return self.pass_at_1
        if self.perplexity:
            import math
            return -math.exp(sum(math.log(v) for v in self.perplexity.values()) / len(self.perplexity))
        if self.fidelity:
            return sum(f["cosine"] for f in self.fidelity.values()) / len(self.fidelity)
        return None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Row":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Frontier:
    model: str
    settings: dict  # what a rerun must match to read the saved points back
    rows: list[Row]
    score: str  # "pass_at_1" (with --eval) or "perplexity" (held-out, geometric mean over domains)
    task: str | None = None  # --eval's label
    reused: list = field(default_factory=list)  # labels read back from --out instead of measured

    @property
    def frontier(self) -> list[str]:
        return [r.label for r in self.rows if r.frontier]

    @property
    def frontier_flops(self) -> list[str]:
        return [r.label for r in self.rows if r.frontier_flops]

    def kept(self, row: Row) -> float | None:
        """The share of the unedited row's quality `row` keeps: pass@1 / the unedited pass@1, the unedited
        perplexity's geometric mean / the row's, or the row's mean cosine / the unedited one's (1.0: all of it;
        None where the unedited score is 0 or missing)."""
        base, mine = self.rows[0].score(self.score), row.score(self.score)
        if base is None or mine is None or base == 0:
            return None
        return base / mine if self.score != "pass_at_1" and self.rows[0].perplexity else mine / base

    def keeping(self, fraction: float) -> dict:
        """The cheapest edit that keeps at least `fraction` of the unedited quality (by its point estimate; its
        paired comparison says how sure), once by KV bytes and once by attention FLOPs: {"fraction",
        "kv": {label, kv_bytes_per_token, saved, kept} | None, "flops": {label, attention_flops_per_token, saved,
        kept} | None}; None where no point that saves anything keeps that much."""
        base = self.rows[0]

        def cheapest(cost: str):
            options = [(getattr(r, cost), -(self.kept(r) or 0.0), i) for i, r in enumerate(self.rows[1:], 1)
                       if getattr(r, cost) is not None and getattr(r, cost) < getattr(base, cost)
                       and (self.kept(r) or 0.0) >= fraction]
            if not options:
                return None
            r = self.rows[min(options)[2]]
            return {"label": r.label, cost: getattr(r, cost), "saved": 1 - getattr(r, cost) / getattr(base, cost),
                    "kept": self.kept(r)}

        return {"fraction": fraction, "kv": cheapest("kv_bytes_per_token"),
                "flops": cheapest("attention_flops_per_token")}

    def to_json(self, keep: float = 0.9) -> dict:
        return {"model": self.model, "score": self.score, "task": self.task, "settings": dict(self.settings),
                "rows": [r.to_json() for r in self.rows], "frontier": self.frontier,
                "frontier_flops": self.frontier_flops, "reused": list(self.reused),
                "kept": {r.label: self.kept(r) for r in self.rows}, "keeping": self.keeping(keep)}
