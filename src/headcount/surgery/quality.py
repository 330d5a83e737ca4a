"""Quality: what every edit is judged by, measured in one place.

    meter = QualityMeter(eval_windows=4, tasks=parse_eval(["humaneval:20"]))
    q = meter.measure(model)        # Quality(perplexity={"prose": 9.1, "code": 7.2, "source": 5.3},
                                    #         tasks={"humaneval:20": 0.65})
    Quality.from_json(q.to_json()) == q         # q.task_verdicts: {"humaneval:20": {"HumanEval/0": True, ...}}

A decoder is measured by perplexity on held-out windows of each domain: on the default corpus the three of
headcount.data.held_out_domains (prose: the default corpus's held-out part; code: torch / numpy docstrings;
source: standard-library Python, which nothing calibrates on), on a user's text its held-out part ("text"),
and any `extra` domains beside them. An encoder is measured by embedding fidelity (mean cosine to the unedited
model's embedding, Spearman of all pairwise similarities) on held-out sentences; the unedited embeddings are
taken from the first model the meter measures, so measure the unedited model first. Tasks (--eval) are
greedy pass@1 in the format eval's auto picks (the makers' where headcount.tasks.formats has the model),
each problem's verdict kept for the paired comparisons between stages.

The held-out sets are tokenized once per meter, so every stage of an edit (before, after, healed) is measured
on the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.arguments import positive_int
from headcount.surgery.held_out import EVAL_WINDOWS


@dataclass(frozen=True)
class Quality:
    perplexity: dict = field(default_factory=dict)  # decoder: {domain: held-out perplexity}
    fidelity: dict = field(default_factory=dict)  # encoder: {domain: {"cosine": c, "spearman": s}}
    tasks: dict = field(default_factory=dict)  # {task label: pass@1 in [0, 1]}
    # {task label: {task_id: passed}}: each problem's verdict, what paired comparisons between stages read
    task_verdicts: dict = field(default_factory=dict)

    @property
    def headline(self):
        """The first domain's perplexity (decoder) or (cosine, spearman) (encoder): the one-number summary the
        commands print as `ppl_before` / `ppl_after`."""
        if self.perplexity:
            return next(iter(self.perplexity.values()))
        if self.fidelity:
            f = next(iter(self.fidelity.values()))
            return f["cosine"], f["spearman"]
        return None

    def ratios(self, before: "Quality") -> dict:
        """{domain: perplexity / before's} on the domains both measured (a decoder's edit cost at a glance)."""
        return {d: v / before.perplexity[d] for d, v in self.perplexity.items() if before.perplexity.get(d)}

    def check_finite(self, what: str, dtype=None) -> None:
        """A NaN or infinite perplexity means the edit broke the model (or the dtype overflowed): say so."""
        from headcount.models.options import check_finite

        values = list(self.perplexity.values()) + [x for f in self.fidelity.values() for x in f.values()]
        for value in values:
            check_finite(value, what, dtype)

    def to_json(self) -> dict:
        out = {"perplexity": dict(self.perplexity), "fidelity": {d: dict(f) for d, f in self.fidelity.items()},
               "tasks": dict(self.tasks)}
        if self.task_verdicts:
            out["task_verdicts"] = {label: dict(v) for label, v in self.task_verdicts.items()}
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Quality":
        """Back from to_json; a result saved before per-problem verdicts were kept reads with none."""
        if not isinstance(data, dict) or not set(data) <= {"perplexity", "fidelity", "tasks", "task_verdicts"}:
            raise ValueError("Quality.from_json: expected a dict with perplexity, fidelity, tasks (and task_verdicts), "
                             f"got {data!r:.200}")
        verdicts = data.get("task_verdicts") or {}
        if not isinstance(verdicts, dict) or not all(
                isinstance(v, dict) and all(isinstance(p, bool) for p in v.values()) for v in verdicts.values()):
            raise ValueError(f"Quality.from_json: task_verdicts should be {{label: {{task_id: true|false}}}}, got "
                             f"{verdicts!r:.200}")
        return cls(dict(data.get("perplexity") or {}), {d: dict(f) for d, f in (data.get("fidelity") or {}).items()},
                   dict(data.get("tasks") or {}), {label: dict(v) for label, v in verdicts.items()})


class TaskScores(dict):
    """{task label: pass@1}, with .verdicts {task label: {task_id: passed}} beside it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verdicts: dict = {}


def _is_decoder(model) -> bool:
    return hasattr(model, "lm_head")


class QualityMeter:
    """One way of measuring Quality, applied to every stage of an edit.

    held_out: None (the default corpus: a decoder's three held-out domains, an encoder's held-out sentences), a
    list of texts (a user's held-out part, the domain "text") or {domain: texts}. extra: {domain: texts}
    measured beside them (heal --text's "text" beside the three). eval_windows: windows of `window` tokens per
    domain (encoders: 16 sentences per window). sizes: {domain: (windows, window)} for domains measured on other
    sizes (the report's code / source). tasks: surgery.task_scores.TaskSpec list (--eval), greedy pass@1 with
    `batch_size` rows (None: eval's default) and `max_new_tokens` (None: the prompt format's budget). log: called with a line after each task.
    progress: progress(label) -> a progress(done, passed, total) callback for one task's run (tasks.progress).
    references: an encoder's unedited embeddings {domain: [N, d]} when the unedited model is not the first one
    measured. task_cache: a folder where each task's verdicts are kept, keyed by the model's weights hash, the
    problems, the prompt format and the settings (tasks/verdict_cache.py): the same model judged again (the unedited
    model of a second edit command) is read back instead of generated again. None: always measured.
    """

    def __init__(self, held_out=None, *, eval_windows: int = EVAL_WINDOWS, window: int = 512, extra: dict | None = None,
                 sizes: dict | None = None, domains: bool = True, tasks=(), batch_size: int | None = None,
                 max_new_tokens: int | None = None, log=None, references: dict | None = None, progress=None,
                 task_cache=None):
        positive_int("eval_windows", eval_windows)
        positive_int("window", window, 2)
        if extra is not None and (not isinstance(extra, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(t, str) for t in v)
                for k, v in extra.items())):
            raise ValueError(f"extra: expected {{domain name: non-empty list of texts}}, got {type(extra).__name__}")
        self.held_out, self.eval_windows, self.window = held_out, eval_windows, window
        self.extra, self.sizes, self.domains = dict(extra or {}), dict(sizes or {}), domains
        self.tasks, self.batch_size, self.max_new_tokens, self.log = list(tasks), batch_size, max_new_tokens, log
        self._sets: dict | None = None
        self._references: dict | None = references
        self.progress = progress
        self.task_cache = task_cache

    # ------------------------------------------------------------------ held-out sets, built once
    def _texts(self, model) -> dict:
        """{domain: texts (None: the default corpus's held-out part)} this meter measures."""
        if isinstance(self.held_out, dict):
            texts = dict(self.held_out)
        elif self.held_out is not None:
            texts = {"text": self.held_out}
        elif _is_decoder(model) and self.domains:
            from headcount.data import held_out_domains
            texts = {"prose": None, **{k: v for k, v in held_out_domains().items() if k != "prose"}}
        else:
            texts = {"prose": None}
        return {**texts, **self.extra}

    def sets(self, model) -> dict:
        """{domain: LongTensor windows (decoder) | sentences (encoder)}, tokenized on the first call."""
        if self._sets is None:
            from headcount.surgery.held_out import held_out_sets

            out = {}
            for name, texts in self._texts(model).items():
                windows, window = self.sizes.get(name, (self.eval_windows, self.window))
                window = min(window, model.config.max_position)
                out |= held_out_sets(model, {name: texts}, windows, window, sentences=16 * windows)
            self._sets = out
        return self._sets

    def references(self, model) -> dict | None:
        """An encoder's unedited embeddings: from the first model measured."""
        if _is_decoder(model):
            return None
        if self._references is None:
            from headcount.surgery.held_out import embed
            self._references = {name: embed(model, s) for name, s in self.sets(model).items()}
        return self._references

    # ------------------------------------------------------------------ measuring
    def held_out_quality(self, model, known: dict | None = None) -> Quality:
        """Perplexity (decoder) or fidelity (encoder) on every domain; `known`: {domain: perplexity} already
        measured on this meter's sets (heal's own after-heal figures), used as they are."""
        from headcount.surgery.held_out import evaluate

        sets = self.sets(model)
        if _is_decoder(model):
            known = {d: v for d, v in (known or {}).items() if d in sets}
            todo = {d: s for d, s in sets.items() if d not in known}
            found = {**known, **evaluate(model, todo)}
            return Quality(perplexity={d: found[d] for d in sets})
        found = evaluate(model, sets, self.references(model))
        return Quality(fidelity={d: {"cosine": c, "spearman": s} for d, (c, s) in found.items()})

    def task_scores(self, model) -> "TaskScores":
        """{task label: greedy pass@1} for this meter's tasks, each problem's verdict in .verdicts."""
        from headcount.tasks.harness import BATCH_SIZE, Settings, evaluate

        out = TaskScores()
        settings = Settings(batch_size=self.batch_size or BATCH_SIZE, max_new_tokens=self.max_new_tokens)
        for spec in self.tasks:
            def run(spec=spec):
                result = evaluate(model, spec.task, problems=list(spec.problems), settings=settings,
                                  progress=self.progress(spec.label) if self.progress is not None else None)
                from headcount.tasks.verdict_cache import TaskRun
                return TaskRun.of(result)

            if self.task_cache is not None:
                from headcount.tasks.verdict_cache import cached_task_run
                done, where = cached_task_run(self.task_cache, model, spec.problems, settings, run)
            else:
                done, where = run(), None
            out[spec.label] = done.pass_at_1
            out.verdicts[spec.label] = dict(done.verdicts)
            if self.log is not None:
                lo, hi = done.ci95 or (done.pass_at_1, done.pass_at_1)
                how = f"read back from {where}" if where is not None else f"{done.seconds:.0f} s"
                self.log(f"{spec.label}: pass@1 {done.pass_at_1:.3f} [95% CI {lo:.3f}-{hi:.3f}] "
                         f"({sum(done.verdicts.values())}/{len(done.verdicts)}, {done.prompt_format} format, {how})")
        return out

    def measure(self, model, known: dict | None = None, *, tasks: bool = True) -> Quality:
        """Quality of `model`: held-out perplexity or fidelity, and (tasks=True) pass@1 on the tasks."""
        quality = self.held_out_quality(model, known)
        if tasks and self.tasks:
            scores = self.task_scores(model)
            return Quality(quality.perplexity, quality.fidelity, dict(scores), dict(getattr(scores, "verdicts", {})))
        return quality

