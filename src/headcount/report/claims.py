"""The chapter's claims next to what this model showed: held, partly, did not hold, or not measured.

    read_claims(report) -> [{"id", "title", "claim", "test", "status", "finding", "number"}]

Each reading states its test (the threshold it uses) so a reader can disagree with the threshold
and still use the number. Reads only report.json's sections, never a model.
"""

from __future__ import annotations

import statistics

ROLE_NAMES = ("previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word", "sink")
ROLES_NEEDED = 3  # C7 holds when at least this many roles have a labelled head
PRUNE_FRACTION = 0.2  # C11: at least this share of heads removed ...
PRUNE_PPL_RISE = 0.10  # ... for at most this relative rise in held-out perplexity
PRUNE_COSINE = 0.95  # (encoders) ... with held-out sentence embeddings at least this close to the original
TAU_WEAK = 0.5  # C13: mean Kendall tau(attention, gradient x input) below this = weak agreement
JSD_FAR = 0.1  # C13: median adversarial JSD at or above this = very different attention, same output

HELD, PARTLY, NOT_HELD, NOT_MEASURED = "held", "partly", "did not hold", "not measured"


def _claim(cid, title, claim, test, status, finding, number=None) -> dict:
    return {"id": cid, "title": title, "claim": claim, "test": test, "status": status, "finding": finding,
            "number": number}


def head_name(entry) -> str:
    """[layer, head(, extra)] -> 'L16 H0 (+1)'."""
    s = f"L{entry[0]} H{entry[1]}"
    if len(entry) > 2 and entry[2] is not None:
        extra = entry[2]
        s += f" ({extra:+d})" if isinstance(extra, int) else f" ({extra})"
    return s


def role_score(role: dict, entry) -> float | None:
    try:
        return float(role["scores"][entry[0]][entry[1]])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def c7_roles(roles: dict | None) -> dict:
    title, claim = "Heads specialise", ("Trained heads take on roles: positional, syntactic, rare-word "
                                        "(Voita et al. 2019), previous-token, induction.")
    test = f"at least {ROLES_NEEDED} of the {len(ROLE_NAMES)} roles have a head past the role's threshold"
    if not roles:
        return _claim("C7", title, claim, test, NOT_MEASURED, "role scores are not available in this report")
    found = {r: roles[r].get("heads") or [] for r in ROLE_NAMES if isinstance(roles.get(r), dict)}
    with_heads = [r for r, h in found.items() if h]
    labelled = {tuple(e[:2]) for h in found.values() for e in h}
    parts = []
    for r in with_heads:
        top = found[r][0]
        score = role_score(roles[r], top)
        parts.append(f"{r.replace('_', '-')} {len(found[r])} (top {head_name(top)}"
                     + (f", {score:.2f})" if score is not None else ")"))
    status = HELD if len(with_heads) >= ROLES_NEEDED else (PARTLY if with_heads else NOT_HELD)
    finding = (f"{len(with_heads)} of {len(found)} roles have labelled heads, {len(labelled)} heads in all: "
               + "; ".join(parts)) if with_heads else "no head passed any role's threshold"
    return _claim("C7", title, claim, test, status, finding, len(with_heads))


def c9_rank(rank: dict | None, head_dim: int | None) -> dict:
    title, claim = "A head's scores have rank at most head_dim", (
        "QK^T of one head has rank <= head_dim, so a head narrower than the sequence cannot express every "
        "n x n pattern (Bhojanapalli et al. 2020).")
    test = "no head's numerical rank exceeds min(head_dim, n) at any length; the share at the bound is shown"
    summary = (rank or {}).get("summary") or []
    if not summary:
        return _claim("C9", title, claim, test, NOT_MEASURED, "rank results are not available in this report")
    over = [s for s in summary if s.get("max_rank") is not None and s["max_rank"] > s["bound"]]
    longest = max(summary, key=lambda s: s["length"])
    tol = rank.get("tolerance")
    bits = [f"n={s['length']}: mean rank {s['mean_rank']:.1f} of bound {s['bound']} (max {s['max_rank']}"
            + (f", {100 * s['share_at_bound']:.0f}% at the bound)" if s.get("share_at_bound") is not None else ")")
            for s in sorted(summary, key=lambda s: s["length"])]
    finding = "; ".join(bits)
    if head_dim and longest["length"] > head_dim:
        finding += f". Past n = head_dim = {head_dim} the rank stops growing with n"
    if tol is not None:
        finding += f" (tolerance {tol})"
    status = NOT_HELD if over else HELD
    return _claim("C9", title, claim, test, status, finding, longest.get("max_rank"))


def c11_pruning(pruning: dict | None) -> dict:
    title, claim = "Many heads can be removed", (
        "A large share of heads can be pruned at inference without a marked drop: 20% (translation) to 40% "
        "(BERT) in Michel et al. 2019; 38 of 48 encoder heads in Voita et al. 2019.")
    test = f">= {PRUNE_FRACTION:.0%} of heads removed with held-out perplexity up by <= {PRUNE_PPL_RISE:.0%}"
    points = (pruning or {}).get("points") or []
    base = (pruning or {}).get("base_ppl")
    if points and not base and any(p.get("cosine") is not None for p in points):
        return _c11_encoder(title, claim, points)
    if not points or not base:
        return _claim("C11", title, claim, test, NOT_MEASURED, "the pruning curve is not available in this report")
    ok = [p for p in points if p.get("ppl") is not None and p["ppl"] <= base * (1 + PRUNE_PPL_RISE)]
    best = max(ok, key=lambda p: (p["fraction"], -p["ppl"])) if ok else None
    status = HELD if best is not None and best["fraction"] >= PRUNE_FRACTION - 1e-9 else NOT_HELD
    if best is not None:
        rise = best["ppl"] / base - 1
        finding = (f"removing {best['fraction']:.0%} of heads ({best.get('heads_removed')} heads, order "
                   f"{best.get('order')}, {_comp(best)}) moves held-out perplexity {base:.2f} -> {best['ppl']:.2f} "
                   f"({rise:+.1%})")
        number = best["fraction"]
    else:
        first = min((p for p in points if p.get("ppl") is not None), key=lambda p: p["fraction"], default=None)
        finding = "no tested fraction stays within the limit"
        if first is not None:
            finding += (f"; the smallest, {first['fraction']:.0%}, already moves perplexity {base:.2f} -> "
                        f"{first['ppl']:.2f} ({first['ppl'] / base - 1:+.1%})")
        number = 0.0
    return _claim("C11", title, claim, test, status, finding, number)


def _c11_encoder(title: str, claim: str, points: list[dict]) -> dict:
    test = (f">= {PRUNE_FRACTION:.0%} of heads removed with held-out sentence embeddings at mean cosine "
            f">= {PRUNE_COSINE} to the unpruned model's")
    ok = [p for p in points if p.get("cosine") is not None and p["cosine"] >= PRUNE_COSINE]
    best = max(ok, key=lambda p: (p["fraction"], p["cosine"])) if ok else None
    status = HELD if best is not None and best["fraction"] >= PRUNE_FRACTION - 1e-9 else NOT_HELD
    if best is None:
        return _claim("C11", title, claim, test, status, "no tested fraction keeps the embeddings that close", 0.0)
    finding = (f"removing {best['fraction']:.0%} of heads ({best.get('heads_removed')} heads, order "
               f"{best.get('order')}, {_comp(best)}) keeps held-out sentence embeddings at mean cosine "
               f"{best['cosine']:.3f}")
    return _claim("C11", title, claim, test, status, finding, best["fraction"])


def _comp(p: dict) -> str:
    c = p.get("compensate")
    mode = p.get("mode")
    s = "with compensation" if c and c not in ("none", False) else "no compensation"
    if isinstance(c, str) and c not in ("none",):
        s = f"compensation {c}"
    return s + (f", {mode}" if mode else "")


def c13_faithfulness(faith: dict | None) -> dict:
    title, claim = "Attention is not explanation", (
        "Attention weights often disagree with gradient importance, and very different attention can give "
        "the same prediction (Jain and Wallace 2019).")
    test = (f"mean Kendall tau(attention, gradient x input) < {TAU_WEAK}, and median adversarial JSD >= {JSD_FAR} "
            "with the output held within epsilon")
    heads = (faith or {}).get("heads") or []
    if not heads:
        return _claim("C13", title, claim, test, NOT_MEASURED, "faithfulness results are not available in this report")
    taus = [h["tau_gradient"] for h in heads if h.get("tau_gradient") is not None]
    loos = [h["tau_loo"] for h in heads if h.get("tau_loo") is not None]
    jsds = [h["jsd"] for h in heads if h.get("jsd") is not None]
    tvs = [h["tv"] for h in heads if h.get("tv") is not None]
    eps = faith.get("epsilon")
    weak = bool(taus) and statistics.fmean(taus) < TAU_WEAK
    far = bool(jsds) and statistics.median(jsds) >= JSD_FAR
    bits = []
    if taus:
        bits.append(f"mean Kendall tau with gradient x input {statistics.fmean(taus):.2f}"
                    + (f", with leave-one-out {statistics.fmean(loos):.2f}" if loos else ""))
    if jsds:
        bits.append(f"adversarial attention reaches median JSD {statistics.median(jsds):.2f} (max {max(jsds):.2f})"
                    + (f" with the output moved by TV <= {max(tvs):.3g}" if tvs else "")
                    + (f" (epsilon {eps})" if eps is not None else ""))
    status = HELD if weak and far else (PARTLY if weak or far else NOT_HELD)
    finding = f"over {len(heads)} heads: " + "; ".join(bits)
    return _claim("C13", title, claim, test, status, finding, statistics.fmean(taus) if taus else None)


def c15_gqa(accounts: dict | None, merge: dict | None) -> dict:
    title, claim = "Fewer K/V heads, smaller KV cache", (
        "Query heads and K/V heads may differ (MHA, GQA, MQA): the KV cache per token is "
        "2 x n_kv_heads x head_dim x layers x bytes, so fewer K/V heads cut it proportionally, at some cost "
        "in quality.")
    test = "the KV cache per token falls as n_kv_heads / n_heads; the merge's perplexity cost is shown"
    rows = (accounts or {}).get("rows") or []
    if not rows:
        return _claim("C15", title, claim, test, NOT_MEASURED, "the accounts are not available in this report")
    mha = next(r for r in rows if r["label"] == "MHA")
    n_heads = mha["n_kv_heads"]
    exact = all(r["kv_bytes_per_token"] * n_heads == mha["kv_bytes_per_token"] * r["n_kv_heads"] for r in rows)
    bits = [f"{r['label']} ({r['n_kv_heads']} KV head{'s' if r['n_kv_heads'] > 1 else ''}) {r['kv_bytes_per_token']:,} bytes/token"
            f" ({r['kv_bytes_per_token'] / mha['kv_bytes_per_token']:.0%})" for r in rows]
    finding = "KV cache per token in " + accounts.get("dtype", "") + ": " + ", ".join(bits)
    number = None
    if merge and merge.get("ppl_before") and merge.get("ppl_after") is not None:
        rise = merge["ppl_after"] / merge["ppl_before"] - 1
        number = rise
        how = f"method {merge['method']}, no training" if merge.get("method") else "no training"
        finding += (f". Merging this model's K/V heads {merge.get('heads_before')} -> {merge.get('heads_after')} "
                    f"({how}) moves held-out perplexity {merge['ppl_before']:.2f} -> "
                    f"{merge['ppl_after']:.2f} ({rise:+.1%}): the memory is saved at a cost in quality")
        status = HELD if exact else NOT_HELD
    else:
        finding += ". The quality side (a K/V merge) is not available in this report"
        status = PARTLY if exact else NOT_HELD
    return _claim("C15", title, claim, test, status, finding, number)


def read_claims(report: dict) -> list[dict]:
    shape = report.get("shape") or {}
    return [
        c7_roles(report.get("roles")),
        c9_rank(report.get("rank"), shape.get("head_dim")),
        c11_pruning(report.get("pruning")),
        c13_faithfulness(report.get("faithfulness")),
        c15_gqa(report.get("accounts"), report.get("kv_merge")),
    ]
