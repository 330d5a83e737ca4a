"""The frontier's runner: the unedited model measured once, then each point an edit of a fresh copy of it,
measured the same way (and healed and measured again with heal_steps), every finished point kept under `out`.

    frontier = run_frontier("smollm2", parse_points(["prune:0.2", "merge:0.75"]), out=Path("runs/f"))

With `out`, the directory holds frontier.json (the settings a rerun must match), unedited/result.json,
points/<point>/result.json (written last, atomically: a point without it is not finished) and
points/<point>/model (headcount.surgery.save: the point's final model, healed when healed), and
sensitivity/<by>[-drops][-<prefix>].json: merge_plan's sensitivity table of the model a merge starts from, measured once
and reused by every merge budget (it is the expensive part of a plan). A rerun with the same settings reads
every finished point back; an interrupted run resumes at the first unfinished one.

What the rows hold: KV bytes per token (KVCache.nbytes, the weights' dtype), attention FLOPs of one token at the
model's context and at 4,096 (cost/edited.py's accounts of the edited shape: each layer's own head counts, a
dropped layer none), parameters, held-out perplexity per domain (surgery.quality.QualityMeter; an encoder's
fidelity), and with a task: greedy pass@1, Wilson's 95% interval and the paired comparison against the
unedited model's verdicts (tasks.stats). Choices (prune's order, merge's plan, drop's order) read the
calibration part of the corpus only.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from pathlib import Path

from headcount.frontier.result import Frontier, Row
from headcount.frontier.spec import UNEDITED, Point, Step

FLOPS_CONTEXT = 4096
MANIFEST = "frontier.json"


# ------------------------------------------------------------------------------------------ accounts
def _heads(model) -> list[tuple[int, int]]:
    """(n_heads, n_kv_heads) per layer; (0, 0) for a layer whose attention was dropped."""
    out = []
    for layer in model.layers:
        attn = getattr(layer, "attn", None)
        n = getattr(attn, "n_heads", 0) if attn is not None else 0
        out.append((n, attn.n_kv_heads) if n else (0, 0))
    return out


def kv_bytes_per_token(model) -> int:
    """KV cache bytes one token costs (KVCache.nbytes of each layer that has attention)."""
    return sum(layer.attn.new_cache(1, 1).nbytes for layer, (n, _) in zip(model.layers, _heads(model)) if n)


def attention_flops_per_token(model, seq: int) -> int | None:
    """The attention FLOPs of one token at context `seq` (cost.edited's decode step: projections, scores, output)
    summed over the layers that have attention; None for an encoder."""
    if not hasattr(model, "lm_head"):
        return None
    from headcount.cost.edited import EditedShape, decoder_config_shape, layer_rows

    heads = _heads(model)
    base = decoder_config_shape(model.config.to_dict())
    rows = layer_rows(EditedShape(base, tuple(heads)), batch=1, seq=seq, dtype="fp32")
    return sum(r["decode_attention_flops"] for r in rows)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------ checks
def check_points(model, points: list[Point]) -> None:
    """What needs the model: a merge budget it cannot reach (below one K/V head in every layer), checked on the
    unedited model for a merge that comes first. ValueError naming --point."""
    from headcount.surgery.merging.planner import check_budget

    for point in points:
        first = point.steps[0]
        if first.edit in ("merge", "kv"):
            check_budget(model, first.amount, flag=f"--point {point.text}", drops=first.edit == "kv")
        if any(s.edit in ("drop", "kv") for s in point.steps) and not hasattr(model, "lm_head"):
            raise ValueError(f"--point {point.text}: {point.steps[-1].edit} removes attention sublayers of a decoder; "
                             f"{getattr(model, 'name', None) or 'this model'} is an encoder")


def check_out(out: Path | None, settings: dict, force: bool) -> bool:
    """Before anything is loaded or written: True when `out` holds a frontier with these settings (its points are
    read back), False when there is nothing to read. Another model or other settings: ValueError unless force."""
    if out is None or not out.exists():
        return False
    if not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory")
    manifest = out / MANIFEST
    if not manifest.is_file():
        if any(out.iterdir()) and not force:
            raise ValueError(f"--out: {out} holds something other than a frontier; give another --out, or --force "
                             "to replace it")
        return False
    try:
        saved = json.loads(manifest.read_text())["settings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--out: {manifest} is not readable ({type(e).__name__}); --force replaces it") from None
    theirs = {k: v for k, v in saved.items() if k != "weights_sha256"}
    for key, value in settings.items():  # a setting added since that frontier was written, at its empty default
        if key not in theirs and value in ({}, None):
            theirs[key] = value
    if theirs != settings:
        if force:
            return False
        diff = ", ".join(f"{k} {theirs.get(k)!r} (now {settings.get(k)!r})" for k in sorted(set(theirs) | set(settings))
                         if theirs.get(k) != settings.get(k))
        raise ValueError(f"--out: {out} holds a frontier of {theirs.get('model')!r} with other settings: {diff}; "
                         "give another --out, the same arguments to resume it, or --force to replace it")
    return True


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a reader sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _read_rows(path: Path) -> list[Row] | None:
    try:
        return [Row.from_json(r) for r in json.loads(path.read_text())["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unfinished or unreadable: measured again


# ------------------------------------------------------------------------------------------ the runner
class _Runner:
    def __init__(self, unedited, *, meter, spec, heal_steps, calibration_windows, eval_windows, sensitivity,
                 merge_options, out, progress, bar, calibration=None, held_out=None, prune_options=None,
                 heal_calibration="mixed", cache=False):
        self.unedited, self.meter, self.spec, self.heal_steps = unedited, meter, spec, heal_steps
        self.calibration_windows, self.eval_windows = calibration_windows, eval_windows
        self.sensitivity, self.merge_options, self.out, self.progress, self.bar = (
            sensitivity, dict(merge_options or {}), out, progress, bar)
        self.calibration, self.held_out, self.prune_options = calibration, held_out, dict(prune_options or {})
        self.heal_calibration, self.cache = heal_calibration, cache
        self.tables: dict[str, object] = {}
        self.base_row: Row | None = None

    def stage(self, point: str, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(f"{point}: {what}")

    # -------------------------------------------------------------- measuring
    def measure(self, model, point: str, healed: bool, start: float, edit: dict, known=None) -> Row:
        """One row; `start`: when this row's work (its edit or heal) began, for its seconds."""
        self.stage(point, "measuring held-out" + (" (healed)" if healed else ""))
        quality = self.meter.measure(model, known=known, tasks=False)
        quality.check_finite(f"the held-out quality of {point}{' healed' if healed else ''}")
        row = Row(point, healed, kv_bytes_per_token(model), attention_flops_per_token(model, model.config.max_position),
                  attention_flops_per_token(model, FLOPS_CONTEXT), int(model.config.max_position), n_params(model),
                  dict(quality.perplexity), {d: dict(f) for d, f in quality.fidelity.items()}, edit=edit)
        if self.spec is not None:
            self.stage(point, f"{self.spec.label}" + (" (healed)" if healed else ""))
            self.task(model, row)
        row.seconds = round(time.perf_counter() - start, 1)
        return row

    def task(self, model, row: Row) -> None:
        from headcount.tasks.stats import paired, wilson_interval

        row.problems = dict(self.meter.task_scores(model).verdicts[self.spec.label])  # eval's defaults
        passed = sum(row.problems.values())
        row.pass_at_1 = passed / len(row.problems)
        row.pass_at_1_ci95 = [round(x, 6) for x in wilson_interval(passed, len(row.problems))]
        if self.base_row is not None:
            row.paired = paired(row.problems, self.base_row.problems).to_json()

    # -------------------------------------------------------------- editing
    def table(self, model, prefix: str, drops: bool = False):
        """merge_plan's sensitivity table of `model` (reached by the steps in `prefix`), measured once; drops: with
        each layer's cost of dropping its attention (a kv:B point)."""
        from headcount.surgery.merging.planner import MergePlan, merge_plan, resolve_by
        from headcount.surgery.merging.sensitivity_cache import cache_root as sensitivity_root

        by = resolve_by(model, self.sensitivity)
        key = by + ("-drops" if drops else "") + (f"-{prefix}" if prefix else "")
        if key in self.tables:
            return self.tables[key]
        path = None if self.out is None else self.out / "sensitivity" / f"{key}.json"
        if path is not None and path.is_file():
            try:
                plan = MergePlan.from_json(json.loads(path.read_text()))
                self.tables[key] = plan
                return plan
            except (ValueError, KeyError, TypeError):
                pass  # measured again
        chat = by == "kl" and self.calibration is None  # kl's default: the model's own chat answers
        plan = merge_plan(model, 1.0, by=by, calibration=None if chat else self._calibration(),
                          progress=self.progress, cache=sensitivity_root() if self.cache else None, drops=drops)
        if path is not None:
            _write_json(path, plan.to_json())
        self.tables[key] = plan
        return plan

    def _calibration(self):
        """merge_plan's calibration: the given one, or (None) prose and code-like text as merge_kv's default."""
        return "mixed" if self.calibration is None else self.calibration

    def step(self, model, step: Step, prefix: str, point: str) -> dict:
        self.stage(point, step.text)
        if step.edit == "prune":
            from headcount.surgery import prune_to

            result = prune_to(model, float(step.amount), calibration=self.calibration,
                              calibration_windows=self.calibration_windows, **self.prune_options)
            return {"heads_removed": result.heads_before - result.heads_after,
                    "kv_bytes_per_token_after": result.kv_bytes_per_token_after}
        if step.edit in ("merge", "kv"):
            from headcount.surgery import merge_plan
            from headcount.surgery.merging.planner import apply_plan, check_budget

            drops = step.edit == "kv"
            check_budget(model, step.amount, flag=f"--point {point}", drops=drops)
            table = self.table(model, prefix, drops)
            plan = merge_plan(model, step.amount, sensitivity_from=table, drops=drops)
            if plan.kv_heads:
                self.stage(point, f"{step.text} ({len(plan.merged)} merged, {len(plan.dropped)} dropped)")
                apply_plan(model, plan, n_windows=self.calibration_windows, calibration=self.calibration,
                           progress=self.progress, **self.merge_options)
            return {"plan": {str(k): v for k, v in plan.kv_heads.items()},
                    "kv_bytes_per_token_before": plan.kv_bytes_per_token_before,
                    "kv_bytes_per_token_after": plan.kv_bytes_per_token_after,
                    "predicted_loss_increase": plan.predicted_loss_increase, "by": plan.by,
                    **({"dropped": plan.dropped} if drops else {})}
        from headcount.surgery.dropping import drop_attention

        result = drop_attention(model, fraction=float(step.amount), calibration=self.calibration)
        return {"layers": list(getattr(result, "layers", []) or [])}

    def point(self, point: Point) -> list[Row]:
        start = time.perf_counter()
        model = copy.deepcopy(self.unedited)
        edit, prefix = {}, ""
        for step in point.steps:
            edit[step.text] = self.step(model, step, prefix, point.text)
            prefix = f"{prefix}+{step.text}" if prefix else step.text
        rows = [self.measure(model, point.text, False, start, edit)]
        if self.heal_steps:
            from headcount.surgery.healing.cli import healer
            from headcount.surgery.quality import Quality

            heal_start = time.perf_counter()
            self.stage(point.text, f"healing {self.heal_steps} steps")
            base, after = self.base_row, rows[0]
            block = healer(self.unedited, self.heal_steps, progress=self.progress, eval_windows=self.eval_windows,
                           calibration=self.calibration, held_out=self.held_out, name=self.heal_calibration,
                           cache=self.cache)(
                model, Quality(base.perplexity, base.fidelity), Quality(after.perplexity, after.fidelity))
            known = (block.get("held_out") or {}).get("after_heal")
            rows.append(self.measure(model, point.text, True, heal_start,
                                     {**edit, "heal": {k: block.get(k) for k in
                                                       ("steps", "tokens", "params", "seconds", "calibration")}},
                                     known=known))
        if self.out is not None:
            self.stage(point.text, "saving")
            from headcount.surgery import save

            where = self.out / "points" / point.slug
            save(model, where / "model", force=True)
            _write_json(where / "result.json", {"point": point.text, "rows": [r.to_json() for r in rows]})
        return rows


def mark(rows: list[Row], score: str) -> None:
    """Set each row's frontier flags: KV bytes against the score, and attention FLOPs against the score."""
    from headcount.frontier.pareto import on_frontier

    scores = [r.score(score) for r in rows]
    for r, flag in zip(rows, on_frontier([r.kv_bytes_per_token for r in rows], scores)):
        r.frontier = flag
    for r, flag in zip(rows, on_frontier([r.attention_flops_per_token for r in rows], scores)):
        r.frontier_flops = flag


def settings_of(model_name: str, *, heal_steps: int, spec, eval_windows: int, calibration_windows: int,
                sensitivity: str, dtype: str, merge_options: dict | None, prune_options: dict | None = None,
                source: str = "default corpus", heal_calibration: str = "mixed") -> dict:
    """What a saved frontier must match to be read back (the points may differ: a rerun adds or reads them)."""
    return {"model": str(model_name), "heal_steps": int(heal_steps), "eval": None if spec is None else spec.label,
            "eval_windows": int(eval_windows), "calibration_windows": int(calibration_windows),
            "sensitivity": sensitivity, "dtype": dtype, "merge_options": dict(sorted((merge_options or {}).items())),
            "prune_options": dict(sorted((prune_options or {}).items())),
            "text": source, **({"heal_calibration": heal_calibration} if heal_calibration != "mixed" else {})}


def run_frontier(model_name, points: list[Point], *, model=None, heal_steps: int = 0, spec=None,
                 out: Path | None = None, force: bool = False, eval_windows: int = 4, calibration_windows: int = 8,
                 sensitivity: str = "auto",
                 dtype: str = "fp32", device: str = "cpu", merge_options: dict | None = None,
                 prune_options: dict | None = None, calibration=None,
                 held_out=None, source: str = "default corpus", progress: bool = True, task_cache=None,
                 heal_calibration: str = "mixed") -> Frontier:
    """Measure the unedited model and every point (see the module doc); `model`: an already loaded model named
    `model_name` (tests), else loaded here. spec: a surgery.task_scores.TaskSpec (--eval) or None.
    merge_options / prune_options: merge_kv / prune_to keywords beside their defaults (`headcount prune`'s and
    `headcount merge-kv`'s; tests keep them cheap: local_steps, uptrain_steps, order).
    calibration: what prune, merge and drop choose on (None: each edit's default on the default corpus; texts or
    token windows). held_out: surgery.quality.QualityMeter's held_out (None: the default corpus's three domains).
    source: what calibration and held_out came from, recorded in the settings (--text's file). task_cache: where
    the task's verdicts are kept by weights (tasks/verdict_cache.py; the command's $HEADCOUNT_CACHE/tasks), so an
    unedited model judged by an edit command or another frontier is read back; None: always measured.
    heal_calibration: what the healed rows distil on without `calibration` (heal_steps.healer's name: mixed, or
    teacher-answers for a chat model judged by its answers); with a task_cache (the command's) the teacher's text
    is cached too ($HEADCOUNT_CACHE/teacher), written once for every healed point and every later run, and so is
    a merge point's sensitivity table ($HEADCOUNT_CACHE/merge-sensitivity, shared with `merge-kv --budget`)."""
    from headcount.arguments import positive_int

    from headcount.surgery.merging.planner import check_by

    check_by(sensitivity, "sensitivity")
    positive_int("eval_windows", eval_windows)
    positive_int("calibration_windows", calibration_windows)
    if heal_steps < 0:
        raise ValueError(f"--heal-steps: expected a number of steps >= 0, got {heal_steps}")
    out = None if out is None else Path(out)
    settings = settings_of(model_name, heal_steps=heal_steps, spec=spec, eval_windows=eval_windows,
                           calibration_windows=calibration_windows, sensitivity=sensitivity, dtype=dtype,
                           merge_options=merge_options, prune_options=prune_options, source=source,
                           heal_calibration=heal_calibration)
    resume = check_out(out, settings, force)
    if model is None:
        from headcount.models.options import load_model
        model = load_model(model_name, dtype, device)
    model.eval()
    if spec is not None:
        from headcount.surgery.cli_common import check_eval_model
        check_eval_model([spec], model)
    if heal_steps:
        from headcount.models.chat import has_chat_template
        from headcount.surgery.healing.calibrations import ASKING, check_calibration
        from headcount.surgery.healing.cli import teacher_for
        teacher_for(model, heal_steps, dtype)  # its checks (a decoder, a trainable dtype); the teacher is `model`
        check_calibration("--heal-calibration", heal_calibration)
        if heal_calibration in ASKING and not has_chat_template(model):
            raise ValueError(f"--heal-calibration: {heal_calibration} asks the unedited model through its chat "
                             f"template; {model_name} has none (use mixed or teacher)")
    check_points(model, points)
    from headcount.models.fingerprint import weights_hash

    weights = weights_hash(model)
    if resume:
        saved = json.loads((out / MANIFEST).read_text())["settings"].get("weights_sha256")
        if saved != weights and not force:
            raise ValueError(f"--out: {out} holds a frontier of other weights named {model_name!r} (sha256 "
                             f"{str(saved)[:12]} against {weights[:12]}); --force replaces it")
        resume = saved == weights
    if out is not None:  # every check passed: from here on the directory is written
        if out.exists() and not resume:
            shutil.rmtree(out)
        _write_json(out / MANIFEST, {"settings": {**settings, "weights_sha256": weights}})

    from tqdm.auto import tqdm

    from headcount.surgery.quality import QualityMeter

    meter = QualityMeter(held_out, eval_windows=eval_windows, window=512, tasks=[spec] if spec is not None else (),
                         task_cache=task_cache)
    rows: list[Row] = []
    reused: list[str] = []
    with tqdm(total=len(points) + 1, desc="frontier", disable=None if progress else True) as bar:
        runner = _Runner(model, meter=meter, spec=spec, heal_steps=heal_steps, calibration_windows=calibration_windows,
                         eval_windows=eval_windows, sensitivity=sensitivity, merge_options=merge_options, out=out,
                         progress=progress, bar=bar, calibration=calibration, held_out=held_out,
                         prune_options=prune_options, heal_calibration=heal_calibration,
                         cache=task_cache is not None)
        path = None if out is None else out / "unedited" / "result.json"
        saved = _read_rows(path) if resume else None
        if saved:
            runner.base_row = saved[0]
            reused.append(UNEDITED)
        else:
            runner.base_row = runner.measure(model, UNEDITED, False, time.perf_counter(), {})
            if path is not None:
                _write_json(path, {"point": UNEDITED, "rows": [runner.base_row.to_json()]})
        rows.append(runner.base_row)
        bar.update(1)
        for point in points:
            saved = _read_rows(out / "points" / point.slug / "result.json") if resume else None
            if saved and saved[0].point == point.text:
                rows += saved
                reused.append(point.text)
            else:
                rows += runner.point(point)
            bar.update(1)
    score = "pass_at_1" if spec is not None else "perplexity"
    mark(rows, score)
    return Frontier(str(model_name), settings, rows, score, None if spec is None else spec.label, reused)
