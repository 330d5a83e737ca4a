"""The K/V-merging measurements: `run(quick=False) -> dict`, `render(result, console)`.

Called by `headcount bench surgery --part merge`. Every choice (fits, groupings, plans, uptraining) uses
calibration text; every number is measured on held-out text: the held-out part of the default corpus
(prose) and of headcount.data.code_corpus() (docstrings and comments of torch / numpy: another domain).

smollm2 (base: 3 KV heads of 64 in 30 layers):
  - every layer MQA: mean-pooling (GQA paper) vs aware in closed form, aware + local reconstruction
    (LOCAL_STEPS Adam steps per merged layer on its own output; no labels, nothing else moves), and
    that + uptrain (distilled from the unmerged model, at most UPTRAIN_SECONDS of wall clock);
  - one third of the KV cache gone: every layer 3 -> 2 (uneven groups), closed form and + local, and
    merge_plan(2/3);
  - the curve of KV bytes per token vs perplexity as merge_plan takes more of the cache (closed form),
    with and without uptraining (a shorter uptrain per point).
minilm (12 heads, MHA): 12 -> 6, 4, 3, 2, 1 KV heads, mean vs aware, embedding fidelity on held-out
sentences (mean cosine of the mean-pooled embeddings to the unmodified model's; Spearman of the
pairwise similarities).
quick=True: small windows, every layer MQA and minilm 12 -> 4 only (under a minute on an idle machine).
"""

from __future__ import annotations

import copy
import time

import torch

UPTRAIN_SECONDS = 15 * 60  # the MQA uptrain's bound on 2 cores: a merge with its uptrain stays a CPU job
CURVE_UPTRAIN_SECONDS = 3 * 60
BUDGETS = (2 / 3, 0.9, 0.5)  # the one-third point first
LOCAL_STEPS = 100  # merge_kv(local_steps=): block-wise reconstruction of each merged layer
MINILM_KV = (6, 4, 3, 2, 1)


def _settings(quick: bool) -> dict:
    if quick:
        return {"window": 256, "calibration_windows": 2, "eval_windows": 1, "sentences": 64,
                "uptrain_seconds": 5, "curve_uptrain_seconds": 0, "budgets": (), "minilm_kv": (4,), "local_steps": 4}
    return {"window": 512, "calibration_windows": 16, "eval_windows": 4, "sentences": 256,
            "uptrain_seconds": UPTRAIN_SECONDS, "curve_uptrain_seconds": CURVE_UPTRAIN_SECONDS,
            "budgets": BUDGETS, "minilm_kv": MINILM_KV, "local_steps": LOCAL_STEPS}


def _held_out(model, s: dict) -> dict:
    from headcount.analysis.batches import token_windows
    from headcount.data import code_corpus

    return {"prose": token_windows(model, None, window=s["window"], max_windows=s["eval_windows"], part="held_out"),
            "code": token_windows(model, code_corpus().texts("held_out"), window=s["window"],
                                  max_windows=s["eval_windows"], part="held_out")}


def _ppl(model, sets: dict) -> dict:
    from headcount.models.evaluation import evaluate_perplexity
    return {name: evaluate_perplexity(model, ids.reshape(-1).tolist(), ids.shape[1], batch_size=4).perplexity
            for name, ids in sets.items()}


def _log(msg: str) -> None:
    import sys
    print(f"bench merge: {msg}", file=sys.stderr, flush=True)


def _smollm2(s: dict) -> dict:
    from headcount.analysis.batches import token_windows
    from headcount.models import load
    from headcount.surgery.merging.kv_merge import kv_bytes_per_token, merge_kv
    from headcount.surgery.merging.planner import merge_plan
    from headcount.surgery.merging.uptraining import uptrain

    base_model = load("smollm2")
    sets = _held_out(base_model, s)
    calibration = token_windows(base_model, None, window=s["window"], max_windows=s["calibration_windows"])
    base = _ppl(base_model, sets)
    bytes0 = kv_bytes_per_token(base_model)
    out = {"base": base, "kv_bytes_per_token": bytes0, "rows": [], "curve": [],
           "settings": {k: v for k, v in s.items() if k != "budgets"}}
    _log(f"smollm2 base {base}")

    def row(name, model, seconds, **extra):
        entry = {"name": name, "kv_bytes_per_token": kv_bytes_per_token(model), **_ppl(model, sets),
                 "seconds": round(seconds, 1), **extra}
        entry["kv_fraction"] = entry["kv_bytes_per_token"] / bytes0
        out["rows"].append(entry)
        _log(str(entry))
        return entry

    def uptrained(model, seconds):
        return uptrain(model, 10_000, lr=1e-4, calibration=None, window=s["window"] // 2, teacher=base_model,
                       max_seconds=seconds, progress=False, max_windows=None)

    # every layer MQA
    model = copy.deepcopy(base_model)
    t = time.perf_counter()
    merge_kv(model, 1, method="mean", progress=False)
    row("every layer MQA, mean-pooling", model, time.perf_counter() - t)
    aware = {"calibration": calibration, "window": s["window"], "progress": False}
    model = copy.deepcopy(base_model)
    t = time.perf_counter()
    merge_kv(model, 1, local_steps=0, uptrain_steps=0, **aware)
    row("every layer MQA, aware (closed form)", model, time.perf_counter() - t)
    model = copy.deepcopy(base_model)
    t = time.perf_counter()
    merge_kv(model, 1, uptrain_steps=0, local_steps=s["local_steps"], **aware)
    row(f"every layer MQA, aware + local reconstruction ({s['local_steps']} steps / layer)", model,
        time.perf_counter() - t)
    mqa = model

    def uptrain_mqa():
        t = time.perf_counter()
        info = uptrained(mqa, s["uptrain_seconds"])
        row("every layer MQA, aware + local + uptrain", mqa, time.perf_counter() - t, uptrain_steps=info.steps,
            uptrain_tokens=info.tokens, uptrain_loss=[round(info.loss_first, 4), round(info.loss_last, 4)],
            uptrain_probe=[round(info.probe_before, 4), round(info.probe_after, 4)])

    if not s["budgets"]:
        if s["uptrain_seconds"]:
            uptrain_mqa()
        return out
    # one third of the cache: every layer 3 -> 2 (uneven groups)
    for local in (0, s["local_steps"]):
        model = copy.deepcopy(base_model)
        t = time.perf_counter()
        merge_kv(model, 2, uptrain_steps=0, local_steps=local, **aware)
        row("every layer 3 -> 2 KV heads, aware " + (f"+ local reconstruction ({local} steps / layer)" if local
                                                       else "(closed form)"), model, time.perf_counter() - t)
        del model
    # the plan curve
    t = time.perf_counter()
    plan = merge_plan(base_model, 1.0, window=s["window"], progress=False)
    sens_seconds = time.perf_counter() - t
    out["sensitivity"] = {"seconds": round(sens_seconds, 1), "table": plan.to_json()["sensitivity"]}
    if s["uptrain_seconds"]:
        uptrain_mqa()
    for budget in s["budgets"]:
        plan = merge_plan(base_model, budget, sensitivity_from=plan)
        model = copy.deepcopy(base_model)
        t = time.perf_counter()
        merge_kv(model, plan, local_steps=0, uptrain_steps=0, calibration=calibration, window=s["window"], progress=False)
        point = {"budget": round(budget, 4), "kv_bytes_per_token": kv_bytes_per_token(model),
                 "kv_heads": {str(k): v for k, v in plan.kv_heads.items()}, **_ppl(model, sets),
                 "predicted_loss_increase": plan.predicted_loss_increase,
                 "seconds": round(time.perf_counter() - t, 1)}
        if s["curve_uptrain_seconds"]:
            info = uptrained(model, s["curve_uptrain_seconds"])
            point["uptrained"] = {**_ppl(model, sets), "steps": info.steps}
        out["curve"].append(point)
        _log(str(point))
        del model
        if abs(budget - 2 / 3) < 1e-9:  # the one-third target: the same plan with local reconstruction
            model = copy.deepcopy(base_model)
            t = time.perf_counter()
            merge_kv(model, plan, uptrain_steps=0, local_steps=s["local_steps"], **aware)
            row(f"merge_plan(2/3), aware + local reconstruction ({s['local_steps']} steps / layer)", model,
                time.perf_counter() - t, kv_heads={str(k): v for k, v in plan.kv_heads.items()})
            del model
    return out


def _minilm(s: dict) -> dict:
    from headcount.analysis.batches import split_sentences
    from headcount.models import load
    from headcount.surgery.pruning.curve import fidelity
    from headcount.surgery.merging.kv_merge import merge_kv

    base_model = load("minilm")
    held = split_sentences(None, part="held_out", max_sentences=s["sentences"])
    reference = base_model.embed_sentences(held)
    rows = []
    for n in s["minilm_kv"]:
        for method in ("mean", "aware"):
            model = copy.deepcopy(base_model)
            merge_kv(model, n, local_steps=0, uptrain_steps=0, method=method, progress=False)
            cos, rho = fidelity(model, reference, held)
            rows.append({"n_kv_heads": n, "method": method, "cosine": cos, "spearman": rho})
            _log(str(rows[-1]))
    return {"sentences": len(held), "rows": rows}


def run(quick: bool = False, parts=("smollm2", "minilm"), **settings) -> dict:
    """Every K/V-merging number (see the module docstring); settings override _settings()."""
    start = time.perf_counter()
    s = {**_settings(quick), **settings}
    torch.manual_seed(0)
    result = {"quick": quick}
    if "smollm2" in parts:
        result["smollm2"] = _smollm2(s)
    if "minilm" in parts:
        result["minilm"] = _minilm(s)
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def render(result: dict, console=None) -> None:
    """Rich tables of run()'s result."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    sm = result.get("smollm2")
    if sm:
        base = sm["base"]
        table = Table(title=f"smollm2 K/V merging, held-out perplexity (base prose {base['prose']:.2f}, "
                            f"code {base['code']:.2f}; {sm['kv_bytes_per_token']:,} KV bytes / token)")
        for col in ("", "KV bytes / token", "KV kept", "prose ppl", "vs base", "code ppl", "vs base", "seconds"):
            table.add_column(col, justify="left" if not col else "right")
        for r in sm["rows"]:
            table.add_row(r["name"], f"{r['kv_bytes_per_token']:,}", f"{r['kv_fraction']:.0%}", f"{r['prose']:.2f}",
                          f"{r['prose'] / base['prose'] - 1:+.1%}", f"{r['code']:.2f}",
                          f"{r['code'] / base['code'] - 1:+.1%}", f"{r['seconds']:.0f}")
        console.print(table)
        if sm["curve"]:
            table = Table(title="merge_plan curve: KV bytes per token vs held-out perplexity")
            for col in ("budget", "KV bytes / token", "layers merged", "prose", "code", "prose uptrained",
                        "code uptrained"):
                table.add_column(col, justify="right")
            for p in sm["curve"]:
                up = p.get("uptrained") or {}
                table.add_row(f"{p['budget']:.2f}", f"{p['kv_bytes_per_token']:,}", str(len(p["kv_heads"])),
                              f"{p['prose']:.2f}", f"{p['code']:.2f}",
                              f"{up['prose']:.2f}" if up else "-", f"{up['code']:.2f}" if up else "-")
            console.print(table)
    mini = result.get("minilm")
    if mini:
        table = Table(title=f"minilm K/V merging (12 heads), embedding fidelity on {mini['sentences']} held-out "
                            "sentences")
        for col in ("KV heads", "method", "mean cosine", "Spearman"):
            table.add_column(col, justify="right")
        for r in mini["rows"]:
            table.add_row(str(r["n_kv_heads"]), r["method"], f"{r['cosine']:.4f}", f"{r['spearman']:.4f}")
        console.print(table)
    console.print(f"({result.get('seconds', 0):.0f} s{', quick' if result.get('quick') else ''})")
