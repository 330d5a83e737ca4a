"""The chapter's fifteen claims (C1-C15, listed in DESIGN.md) next to what this model showed: held,
partly, did not hold, or not measured.

    read_claims(report) -> 15 x {"id", "title", "claim", "test", "status", "finding", "number", "source"}

Each reading states its test (the threshold it uses) so a reader can disagree with the threshold and
still use the number, and its source: measured on the model in the report's run, a saved full run of an
experiment (benchmarks/results/), or an experiment's --quick run. A claim that does not hold on the model
is reported as such, with its number. Reads only report.json's sections, never a model.
"""

from __future__ import annotations

import statistics

from headcount.report.trained import GATES_FILES

GATES_FILE = GATES_FILES[0]  # where the gates bench saves its result (the report reads it before training)

ROLE_NAMES = ("previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word", "sink")
ROLES_NEEDED = 3  # C7 holds when at least this many roles have a labelled head
PRUNE_FRACTION = 0.2  # C11: at least this share of heads removed ...
PRUNE_PPL_RISE = 0.10  # ... for at most this relative rise in held-out perplexity
PRUNE_COSINE = 0.95  # (encoders) ... with held-out sentence embeddings at least this close to the original
TAU_WEAK = 0.5  # C13: mean Kendall tau(attention, gradient x input) below this = weak agreement
JSD_FAR = 0.1  # C13: median adversarial JSD at or above this = very different attention, same output

C1_ACCURACY, C1_GAP = 0.95, 0.3  # C1: several heads reach this exact-match accuracy; one head stays this far below
C2_RELATIVE = 1e-9  # C2: fused vs per-head formula, float64, max |difference| / max |output|
C3_OWN_SLICE = 0.5  # C3: a head writing to its own slice would put all its output energy there (1.0)
C9_WIDE, C9_NARROW = 1e-3, 0.01  # C9 (low-rank): error once head_dim >= n below this; head_dim <= n/4 above that
C12_FRACTION, C12_PPL_RISE = 0.5, 0.20  # C12: gates remove >= half of the heads ("most") for <= this rise
SPREAD = 2.0  # C3, C8: a difference counts when it exceeds this many standard deviations over seeds
C8_FLOOR = 0.01  # C8: ... and, for perplexities, at least this share of the best (one seed has no spread)

HELD, PARTLY, NOT_HELD, NOT_MEASURED = "held", "partly", "did not hold", "not measured"
STATUSES = (HELD, PARTLY, NOT_HELD, NOT_MEASURED)
CLAIM_IDS = tuple(f"C{i}" for i in range(1, 16))


def _claim(cid, title, claim, test, status, finding, number=None, source=None) -> dict:
    return {"id": cid, "title": title, "claim": claim, "test": test, "status": status, "finding": finding,
            "number": number, "source": source or "not available in this report"}


def run_source(model: str | None) -> str:
    return f"measured on {model or 'the model'} in this report's run"


def experiment_source(section: dict | None) -> str | None:
    """Where an experiment's numbers came from, in words (None when the section is missing)."""
    if not section:
        return None
    seeds, steps = section.get("seeds"), section.get("steps")
    size = ", ".join(x for x in (f"{seeds} seed{'s' if seeds != 1 else ''}" if seeds else "",
                                 f"{steps} steps" if steps else "") if x)
    if section.get("source") == "saved":
        return (f"the experiment's full run saved in {section.get('path')} ({size}; `{section.get('command')}`), "
                "a small model trained from scratch")
    return (f"the experiment's --quick run ({size}; `{section.get('command')}`), run by this report and cached; "
            "a small model trained from scratch")


def domain_table(section: dict | None) -> list[tuple[str, float, float]]:
    """[(domain, before, after)] of a pruning / merge section's three held-out domains (issue 16), through
    surgery's own domain_rows (the table `headcount prune` / `merge-kv` print); [] when not measured."""
    from headcount.surgery.cli_common import domain_rows

    section = section or {}
    rows = domain_rows(section.get("ppl_by_domain_before"), section.get("ppl_by_domain_after"))
    return [(label.rsplit(": ", 1)[-1], before, after) for label, before, after in rows
            if before is not None and after is not None]


def domain_finding(section: dict | None) -> str:
    """'; on the other held-out domains: code a -> b (+x%), source ...' (nothing when not measured)."""
    parts = [f"{name} {b:.2f} -> {a:.2f} ({a / b - 1:+.1%})" for name, b, a in domain_table(section)
             if name != "prose" and b]
    return "; on the other held-out domains: " + ", ".join(parts) if parts else ""


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


def c9_rank(rank: dict | None, head_dim: int | None, low_rank: dict | None = None, model: str | None = None) -> dict:
    title, claim = "A head's scores have rank at most head_dim", (
        "QK^T of one head has rank <= head_dim, so a head narrower than the sequence cannot express every "
        "n x n pattern (Bhojanapalli et al. 2020).")
    test = "no head's numerical rank exceeds min(head_dim, n) at any length; the share at the bound is shown"
    summary = (rank or {}).get("summary") or []
    exp = _low_rank(low_rank)
    if exp is not None:
        test += (f"; and in the low-rank experiment one head's best fit of full-rank n x n patterns errs by > "
                 f"{C9_NARROW} (total variation) for head_dim <= n/4 and by < {C9_WIDE} once head_dim >= n")
    if not summary:
        if exp is None:
            return _claim("C9", title, claim, test, NOT_MEASURED, "rank results are not available in this report")
        ok, finding, number = exp  # the bound itself is decided on the model: without its ranks, not measured
        return _claim("C9", title, claim, test, NOT_MEASURED,
                      "the model's ranks are not available in this report; the low-rank experiment alone: " + finding
                      + (" (consistent with the bound)" if ok else " (NOT consistent with the bound)"), number,
                      experiment_source(low_rank))
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
    source = run_source(model)
    if exp is not None:
        ok, exp_finding, _ = exp
        finding += ". Low-rank experiment: " + exp_finding
        source += "; low-rank: " + experiment_source(low_rank)
        if not ok and status == HELD:
            status = PARTLY
    return _claim("C9", title, claim, test, status, finding, longest.get("max_rank"), source)


def _low_rank(section: dict | None) -> tuple[bool, str, float] | None:
    """(the experiment shows the bound's consequence, a sentence, the narrowest head's error) or None."""
    result = (section or {}).get("result") or {}
    rows = result.get("results") or []
    n = (result.get("config") or {}).get("n")
    one = sorted((r for r in rows if r.get("setting", "one head") == "one head"), key=lambda r: r["head_dim"])
    if not one or not n:
        return None
    narrow = [r for r in one if r["head_dim"] <= n // 4]
    wide = [r for r in one if r["head_dim"] >= n]
    ok = bool(narrow) and bool(wide) and all(r["error"] > C9_NARROW for r in narrow) and \
        all(r["error"] < C9_WIDE for r in wide)
    errs = ", ".join(f"head_dim {r['head_dim']}: {r['error']:.3g}" for r in one)
    finding = f"fitting full-rank patterns of n = {n} positions with one head, error (total variation) {errs}"
    other = [r for r in rows if r.get("setting", "one head") != "one head"]
    if len(other) >= 2:
        finding += "; at n_heads = " + ", then ".join(f"{r['n_heads']} with head_dim {r['head_dim']}: {r['error']:.3g}"
                                                    for r in other)
    return ok, finding, one[0]["error"]


def quality(before: float | None, after: float | None, cosine: float | None = None,
            max_rise: float = float("inf")) -> tuple[bool, str, float] | None:
    """An edit's held-out quality, stated one way by every claim (C11, C12, C15): (within the limit, the words,
    the number). Decoders: perplexity before -> after, the number its relative rise, within when <= max_rise;
    encoders: the mean cosine of held-out sentence embeddings to the unmodified model's, within when
    >= PRUNE_COSINE. None when neither was measured."""
    if before and after is not None:
        rise = after / before - 1
        return rise <= max_rise + 1e-12, f"held-out perplexity {before:.2f} -> {after:.2f} ({rise:+.1%})", rise
    if cosine is not None:
        return cosine >= PRUNE_COSINE, f"held-out sentence embeddings at mean cosine {cosine:.3f}", cosine
    return None


def _limit(decoder: bool, max_rise: float) -> str:
    return (f"held-out perplexity up by <= {max_rise:.0%}" if decoder else
            f"held-out sentence embeddings at mean cosine >= {PRUNE_COSINE} to the unmodified model's")


def command_source(section: dict, model: str | None = None) -> str:
    """Where a command section's numbers came from, in words: the command's saved result for these weights, or
    its defaults run by this report (report/commands.py)."""
    cmd = section.get("command")
    if section.get("source") == "saved":
        sha = str(section.get("weights_sha256") or "")
        return (f"saved result of `{cmd}` ({section.get('path')}), measured on these weights (sha256 {sha[:12]}...); "
                f"`python benchmarks/command_results.py --model {model or 'MODEL'}` regenerates it")
    return (f"run by this report: `{cmd}`'s defaults (the functions the command calls, nothing overridden) on "
            f"{model or 'the model'}, measured as the command measures it")


def _sizes_words(section: dict) -> str:
    sizes = section.get("domain_sizes") or {}
    n, w = (sizes.get("prose") or [None, None])[:2]
    return f" ({n} held-out windows of {w} tokens per domain, as the command measures)" if n else ""


def _c11_command(title: str, claim: str, command: dict, model: str | None) -> dict | None:
    """C11 from what `headcount prune --fraction 0.2` gives (saved or run with its defaults); None without a measure."""
    decoder = command.get("ppl_before") is not None
    q = quality(command.get("ppl_before"), command.get("ppl_after"), command.get("cosine"), PRUNE_PPL_RISE)
    if q is None:
        return None
    fraction = command.get("fraction") or PRUNE_FRACTION
    test = (f"{fraction:.0%} of the heads removed by `headcount prune --fraction {fraction:g}` with its defaults, "
            f"{_limit(decoder, PRUNE_PPL_RISE)}" + (" on held-out prose; the other held-out domains are shown"
                                                   if decoder else ""))
    ok, words, number = q
    status = HELD if ok else NOT_HELD
    finding = (f"`{command.get('command')}`: {command.get('heads_removed')} of {command.get('heads_before', '?')} heads "
               f"removed (order {command.get('order')}, {_comp(command)}); {words}{_sizes_words(command)}"
               + domain_finding(command))
    return _claim("C11", title, claim, test, status, finding, number, command_source(command, model))


def c11_pruning(pruning: dict | None, command: dict | None = None, model: str | None = None) -> dict:
    title, claim = "Many heads can be removed", (
        "A large share of heads can be pruned at inference without a marked drop: 20% (translation) to 40% "
        "(BERT) in Michel et al. 2019; 38 of 48 encoder heads in Voita et al. 2019.")
    if command:  # what the command gives (issue 26): it decides
        found = _c11_command(title, claim, command, model)
        if found is not None:
            return found
    pruning = pruning or {}
    base, default = pruning.get("base_ppl"), pruning.get("default")
    if default:  # the project's defaults at exactly PRUNE_FRACTION: that point decides
        test = (f"{PRUNE_FRACTION:.0%} of the heads removed by prune_to with the project's default order and "
                f"compensation, {_limit(bool(base and default.get('ppl') is not None), PRUNE_PPL_RISE)}")
        q = quality(base, default.get("ppl"), default.get("cosine"), PRUNE_PPL_RISE)
        if q is None:
            return _claim("C11", title, claim, test, NOT_MEASURED, "the default pruning point has no quality measure")
        ok, words, number = q
        status = HELD if default["fraction"] >= PRUNE_FRACTION - 1e-9 and ok else NOT_HELD
        finding = (f"headcount.surgery.prune_to(model, {default['fraction']:g}) with its defaults: order "
                   f"{default.get('order')}, {_comp(default)}: {default.get('heads_removed')} of "
                   f"{default.get('heads_before', '?')} heads removed; {words}" + domain_finding(pruning))
        return _claim("C11", title, claim, test, status, finding, number)
    # a report without the default point (older report.json): the largest fraction of the curve within the limit
    test = f">= {PRUNE_FRACTION:.0%} of heads removed with {_limit(bool(base), PRUNE_PPL_RISE)}"
    scored = [(p, q) for p in pruning.get("points") or []
              if (q := quality(base, p.get("ppl"), p.get("cosine"), PRUNE_PPL_RISE)) is not None]
    if not scored:
        return _claim("C11", title, claim, test, NOT_MEASURED, "the pruning curve is not available in this report")
    better = -1 if base else 1  # of two points at one fraction, the lower perplexity / the higher cosine
    best = max((pq for pq in scored if pq[1][0]), key=lambda pq: (pq[0]["fraction"], better * pq[1][2]),
               default=None)
    if best is None:
        first, (_, words, _) = min(scored, key=lambda pq: pq[0]["fraction"])
        return _claim("C11", title, claim, test, NOT_HELD, f"no tested fraction stays within the limit; the "
                      f"smallest, {first['fraction']:.0%}, already gives {words}", 0.0)
    p, (_, words, _) = best
    status = HELD if p["fraction"] >= PRUNE_FRACTION - 1e-9 else NOT_HELD
    finding = (f"removing {p['fraction']:.0%} of heads ({p.get('heads_removed')} heads, order {p.get('order')}, "
               f"{_comp(p)}): {words}")
    return _claim("C11", title, claim, test, status, finding, p["fraction"])


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


def c15_gqa(accounts: dict | None, merge: dict | None, merge_missing: str | None = None,
            model: str | None = None) -> dict:
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
    q = quality((merge or {}).get("ppl_before"), (merge or {}).get("ppl_after"))
    if q is not None and merge.get("command"):  # what `headcount merge-kv --kv-heads 1` gives (issue 26)
        _, words, number = q
        finding += (f". `{merge['command']}` ({merge_how(merge)}) takes the K/V heads from {merge.get('heads_before')} "
                    f"to {merge.get('heads_after')} over all layers and gives {words}{_sizes_words(merge)}: the memory "
                    "is saved at a cost in quality" + domain_finding(merge))
        status = HELD if exact else NOT_HELD
    elif q is not None:  # the report's own text (or an older report.json): the library's merge at the report's sizes
        _, words, number = q
        how = f"method {merge['method']}, no training" if merge.get("method") else "no training"
        if merge.get("source") == "text":
            how = f"merge_kv's defaults, {merge_how(merge)}, calibrated on the report's own text"
        finding += (f". Merging this model's K/V heads {merge.get('heads_before')} -> {merge.get('heads_after')} "
                    f"({how}) gives {words}: the memory is saved at a cost in quality" + domain_finding(merge))
        status = HELD if exact else NOT_HELD
    else:
        finding += (f". The quality side (a K/V merge) is not measured ({merge_missing.rstrip('.')})"
                    if merge_missing else ". The quality side (a K/V merge) is not available in this report")
        status = PARTLY if exact else NOT_HELD
    source = (f"the accounts (headcount.cost); the merge: {command_source(merge, model)}" if q is not None
              and merge.get("command") else None)
    return _claim("C15", title, claim, test, status, finding, number, source)


def merge_how(merge: dict) -> str:
    """The merge's settings in words: 'method aware, 60 local steps per layer, a 20-step uptrain distilled from the
    unmerged model'."""
    opts = merge.get("options") or {}
    up = merge.get("uptrain") or {}
    bits = [f"method {merge.get('method') or 'aware'}"]
    if opts.get("local_steps"):
        bits.append(f"{opts['local_steps']} local reconstruction steps per layer")
    if up.get("steps"):
        bits.append(f"a {up['steps']}-step uptrain distilled from the unmerged model")
    elif merge.get("method") == "mean" or opts:
        bits.append("no training")
    return ", ".join(bits)



# --------------------------------------------------------------------- trained from scratch: C1, C3, C8
def _rows(section: dict | None) -> list[dict]:
    return ((section or {}).get("result") or {}).get("results") or []


def c1_multi_relation(section: dict | None) -> dict:
    title, claim = "One head, one weighted average", (
        "One head gives one weighted average per position; n heads give n independent averages, each written to "
        "its own slice of the output. A query that needs values from two positions needs two heads.")
    test = (f"on the two-relation task at equal attention parameters, the best model with >= 2 heads reaches "
            f"exact-match accuracy >= {C1_ACCURACY} and the one-head model stays at least {C1_GAP} below it")
    rows = {r["n_heads"]: r for r in _rows(section)}
    others = [r for n, r in rows.items() if n > 1]
    if 1 not in rows or not others:
        return _claim("C1", title, claim, test, NOT_MEASURED, "the multi-relation experiment is not available")
    one, best = rows[1], max(others, key=lambda r: r["accuracy"])
    gap = best["accuracy"] - one["accuracy"]
    status = HELD if best["accuracy"] >= C1_ACCURACY and gap >= C1_GAP else \
        (PARTLY if best["accuracy"] >= C1_ACCURACY and gap > 0 else NOT_HELD)
    seeds = one.get("accuracy_seeds") or []
    finding = (f"one head: accuracy {one['accuracy']:.3f}"
               + (f" (per seed {', '.join(f'{a:.2f}' for a in seeds)})" if len(seeds) > 1 else "")
               + f"; {best['n_heads']} heads: {best['accuracy']:.3f}; all with {one.get('attention_params', '?'):,} "
               "attention parameters" if isinstance(one.get("attention_params"), int) else
               f"one head: accuracy {one['accuracy']:.3f}; {best['n_heads']} heads: {best['accuracy']:.3f}")
    oh = (((section or {}).get("result") or {}).get("details") or {}).get("one_head")
    if oh and oh.get("mass_on_marked"):
        finding += (f". The one head (first seed) puts {' + '.join(f'{m:.2f}' for m in oh['mass_on_marked'])} of its attention "
                    f"on the two marked positions; its output sits at distance {oh['distance_to_average']:.2f} from "
                    f"their average (0 = the average, 1 = one value)")
    return _claim("C1", title, claim, test, status, finding, gap, experiment_source(section))


def c3_write_address(section: dict | None, geometry: dict | None, model: str | None = None) -> dict:
    title, claim = "W_O is each head's write address", (
        "The i-th block of rows of W_O decides where head i writes in the residual stream; without W_O head i "
        "could only ever write to slice i.")
    test = (f"a small model trained without W_O (o_proj frozen to the identity: head i confined to slice i) ends "
            f"with a held-out loss more than {SPREAD:g} standard deviations above the same model with W_O; and a "
            f"real model's heads put less than {C3_OWN_SLICE:.0%} of their output energy in their own slice "
            "(confined: 100%)")
    rows = {r.get("variant"): r for r in _rows(section)}
    with_o = next((r for k, r in rows.items() if k and "no o_proj" not in k), None)
    without = next((r for k, r in rows.items() if k and "no o_proj" in k), None)
    real = (((section or {}).get("result") or {}).get("details") or {}).get("real_models") or {}
    geo, geo_name = (geometry, model) if geometry else next(iter(real.items()), (None, None))[::-1]
    if with_o is None and geo is None:
        return _claim("C3", title, claim, test, NOT_MEASURED, "the write-address experiment is not available")
    bits, ok = [], []
    number = None
    if with_o is not None and without is not None:
        number = without["loss"] - with_o["loss"]
        spread = max(with_o.get("loss_std") or 0.0, without.get("loss_std") or 0.0)
        ok.append(number > SPREAD * spread and number > 0)
        bits.append(f"trained from scratch, held-out loss with W_O {with_o['loss']:.4f} ± {with_o.get('loss_std', 0):.4f}, "
                    f"without {without['loss']:.4f} ± {without.get('loss_std', 0):.4f} nats/byte "
                    f"(difference {number:+.4f})")
    if geo is not None:
        own = geo.get("own_slice_energy")
        ok.append(own is not None and own < C3_OWN_SLICE)
        bits.append(f"{geo_name}'s heads put {own:.3f} of their output energy in their own slice (even spread: "
                    f"{geo.get('slice_share', float('nan')):.3f}; confined: 1) and reach {geo.get('reach', float('nan')):.2f} "
                    f"of d_model; mean pairwise overlap of their write subspaces {geo.get('mean_overlap', float('nan')):.3f}")
    status = HELD if len(ok) == 2 and all(ok) else (PARTLY if any(ok) else NOT_HELD)
    sources = []
    if with_o is not None:
        sources.append(experiment_source(section))
    if geometry:
        sources.append(f"the write geometry {run_source(model)}")
    return _claim("C3", title, claim, test, status, "; ".join(bits), number, "; ".join(sources))


def c8_heads_sweep(section: dict | None) -> dict:
    title, claim = "Head count at fixed width: a broad optimum", (
        "At fixed d_model, more heads means narrower heads; quality has a broad optimum and only the extremes lose "
        "(Vaswani et al. 2017, Table 3 A: 1 head 5.29 PPL, 8-16 heads 4.91-4.92, 32 heads 5.01).")
    test = (f"every head count between the extremes within {SPREAD:g} standard deviations over seeds (at least "
            f"{C8_FLOOR:.0%} of the best) of the best held-out perplexity (broad), and both extremes (fewest, most "
            "heads) further than that from the best (only extremes lose)")
    rows = sorted(_rows(section), key=lambda r: r["n_heads"])
    if len(rows) < 3:
        return _claim("C8", title, claim, test, NOT_MEASURED, "the heads-sweep experiment is not available")
    best = min(rows, key=lambda r: r["ppl_mean"])

    def near(r):
        spread = SPREAD * max(best.get("ppl_std") or 0, r.get("ppl_std") or 0)
        return r["ppl_mean"] - best["ppl_mean"] <= max(spread, C8_FLOOR * best["ppl_mean"])

    broad = all(near(r) for r in rows[1:-1])
    losing = [r for r in (rows[0], rows[-1]) if r is not best and not near(r)]
    status = (HELD if len(losing) == 2 else PARTLY) if broad else NOT_HELD
    worst = max(rows, key=lambda r: r["ppl_mean"])
    number = worst["ppl_mean"] / best["ppl_mean"] - 1
    finding = ("held-out perplexity per byte by n_heads (head_dim): "
               + ", ".join(f"{r['n_heads']} ({r['head_dim']}) {r['ppl_mean']:.3f} ± {r.get('ppl_std') or 0:.3f}"
                           for r in rows)
               + f". Best {best['n_heads']} head(s); near it: "
               + ", ".join(str(r["n_heads"]) for r in rows if near(r))
               + f"; extremes that lose: {', '.join(str(r['n_heads']) for r in losing) or 'none'}"
               + f"; the worst is {number:+.1%} from the best")
    return _claim("C8", title, claim, test, status, finding, number, experiment_source(section))


# ----------------------------------------------------------------------------------- C12: trained gates
def c12_gates(gates: dict | None, model: str | None = None) -> dict:
    title, claim = "Trained gates remove most heads", (
        "Stochastic hard-concrete gates with an L0 penalty, trained on the task, close most heads: 38 of 48 encoder "
        "heads for -0.15 BLEU (Voita et al. 2019).")
    test = (f"hard-concrete gates trained to remove >= {C12_FRACTION:.0%} of the heads reach that target, and the "
            f"model without those heads keeps held-out perplexity within +{C12_PPL_RISE:.0%} (encoders: embeddings "
            f"at mean cosine >= {PRUNE_COSINE})")
    if not gates:
        return _claim("C12", title, claim, test, NOT_MEASURED, "trained gates are not available in this report")
    if gates.get("source") == "saved":
        return _c12_saved(title, claim, test, gates)
    before, removed = gates.get("heads_before"), gates.get("heads_removed")
    share = removed / before if before and removed is not None else None
    reached = gates.get("reached")
    how = (f"gates and {model or 'the model'}'s {gates.get('params') or 'attention'} weights trained together"
           if gates.get("joint") else f"gate training on a frozen {model or 'model'}")
    bits = [f"{gates.get('steps')} steps of {how} (distillation from the "
            f"unmodified model{', ' + gates['objective'] if gates.get('objective') else ''}), target "
            f"{gates.get('fraction', 0):.0%} of the heads removed"]
    if gates.get("n_gates") is not None:
        bits.append(f"{gates.get('n_closed')} of {gates['n_gates']} gates closed; {removed} heads removed "
                    f"({gates.get('n_removed_ranked') or 0} of them still open, ranked out)")
    if reached is False:
        bits.append("the L0 target was NOT reached in the steps given")
    q = quality(gates.get("ppl_before"), gates.get("ppl_after"), gates.get("cosine"), C12_PPL_RISE)
    within, number = (q[0], q[2]) if q else (False, None)
    if q:
        bits.append(q[1] + (f", compensation {gates.get('compensate')}" if gates.get("compensate") else ""))
    enough = share is not None and share >= C12_FRACTION - 1e-9
    status = HELD if enough and reached is not False and within else NOT_HELD
    return _claim("C12", title, claim, test, status, "; ".join(bits), number,
                  run_source(model) + " (headcount.surgery.train_gates, a short run, cached: the gates bench has no "
                  f"saved result for this model in benchmarks/results/{GATES_FILE}; `headcount bench surgery --part "
                  f"gates --save-json benchmarks/results/{GATES_FILE}` trains for minutes and the report then reads it)")


def _c12_saved(title: str, claim: str, test: str, gates: dict) -> dict:
    pts = [(p, q) for p in gates.get("points") or [] if p.get("heads_before") and p.get("heads_removed") is not None
           and (q := quality(p.get("base_ppl"), p.get("ppl"), p.get("cosine"), C12_PPL_RISE)) is not None]
    if not pts:
        return _claim("C12", title, claim, test, NOT_MEASURED, f"{gates.get('path')} holds no usable point")

    def share(pq):
        return pq[0]["heads_removed"] / pq[0]["heads_before"]

    enough = [pq for pq in pts if share(pq) >= C12_FRACTION - 1e-9]
    ok = [pq for pq in enough if pq[1][0]]
    best, (_, words, number) = max(ok or enough or pts, key=share)
    moved = "every weight of the model" if best.get("params") == "all" else \
        f"the model's {best.get('params') or 'attention'} weights"
    how = (f"gates trained with {moved} (Voita's setup) for "
           f"{best.get('steps') or gates.get('steps')} steps, the closed heads then removed:"
           if gates.get("joint") else f"gates trained {best.get('steps') or gates.get('steps')} steps on the frozen "
           "model then lstsq removed")
    finding = (f"{best.get('model') or 'the model'}: {how} "
               f"{best['heads_removed']} of {best['heads_before']} heads; {words}"
               + (f" (other targets: " + ", ".join(f"{p['heads_removed']} removed" for p, _ in pts if p is not best)
                  + ")" if len(pts) > 1 else ""))
    quick = " --quick" if gates.get("quick") else ""
    which = " (its l0 joint points: `headcount prune --method l0 --joint`)" if gates.get("joint") else ""
    return _claim("C12", title, claim, test, HELD if ok else NOT_HELD, finding, number,
                  f"the gates bench's saved{quick} result in {gates.get('path')}{which} (`headcount bench surgery "
                  f"--part gates{quick}`), preferred to a short run on the report's model")


# --------------------------------------------------------- measured checks: C2, C4, C5, C6, C10, C14
def c2_fused(check: dict | None, model: str | None = None) -> dict:
    title, claim = "Fused projection = the per-head formula", (
        "One fused projection [T, d_model] x [d_model, n_heads d_head], a view to [T, n_heads, d_head] (no data "
        "moved), a transpose to [n_heads, T, d_head], attention, the way back and W_O compute exactly "
        "Concat(head_1..head_n) W_O with n_heads separate matrices.")
    test = (f"on the model's first layer, max |fused - per-head formula| <= {C2_RELATIVE:g} x max |output| in float64 "
            "(headcount.reference, a loop over heads with an explicit Concat)")
    if not check:
        return _claim("C2", title, claim, test, NOT_MEASURED, "the reference check is not available in this report")
    rel = check["relative_diff"]
    finding = (f"layer {check['layer']} of {model or 'the model'} on {check['tokens']} tokens ({check['n_heads']} heads, "
               f"{check['n_kv_heads']} KV heads, head_dim {check['head_dim']}): max |difference| "
               f"{check['max_abs_diff']:.3g} for outputs up to {check['max_abs_output']:.3g} (relative {rel:.3g}); "
               f"view moved no data: {'yes' if check.get('view_moves_no_data') else 'NO'}; the transposed Q is "
               f"{'contiguous' if check.get('transposed_q_contiguous') else 'a non-contiguous view'}; rotary: "
               f"{check.get('rotary', 'left out')}")
    status = HELD if rel <= C2_RELATIVE else NOT_HELD
    return _claim("C2", title, claim, test, status, finding, rel, run_source(model))


def c4_params(check: dict | None, model: str | None = None) -> dict:
    title, claim = "Parameters 4d^2, whatever the head count", (
        "An attention layer has 4 d^2 parameters (W_Q, W_K, W_V, W_O) with d_model = n_heads x d_head: the head "
        "count does not change it.")
    test = ("sum(numel) of MultiHeadAttention built at the model's d_model with several head counts equals the "
            "formula and 4 d^2 each time, and the model's own layer equals the formula for its shape")
    if not check:
        return _claim("C4", title, claim, test, NOT_MEASURED, "the parameter check is not available in this report")
    mha, m, d2 = check["mha"], check["model"], check["four_d2"]
    ok = all(r["measured"] == r["formula"] == d2 for r in mha) and m["measured"] == m["formula"]
    finding = (f"d_model {check['d_model']}: " + ", ".join(f"{r['n_heads']} heads {r['measured']:,}" for r in mha)
               + f" (4d^2 = {d2:,}); {model or 'the model'}'s layer 0 ({m['n_heads']} heads, {m['n_kv_heads']} KV heads, "
               f"head_dim {m['head_dim']}) {m['measured']:,} counted vs {m['formula']:,} by formula")
    if m["n_kv_heads"] != m["n_heads"]:
        finding += " (fewer K/V heads make W_K and W_V smaller: 2 d^2 + 2 d n_kv d_head)"
    return _claim("C4", title, claim, test, HELD if ok else NOT_HELD, finding, d2, run_source(model))


def c5_flops(check: dict | None, model: str | None = None) -> dict:
    title, claim = "Score FLOPs 4 n^2 d, whatever the head count", (
        "Scores and the weighted read cost n_heads x 4 n^2 d_head = 4 n^2 d FLOPs, independent of the head count; "
        "causal masking halves it to 2 n^2 d.")
    test = ("FlopCounterMode's count of Q K^T + A V on the eager path equals 4 n^2 d at several head counts and the "
            "formula for the model's shape")
    if not check:
        return _claim("C5", title, claim, test, NOT_MEASURED, "the FLOP check is not available in this report")
    rows, n = check["rows"], check["seq"]
    mha = [r for r in rows if r["label"] != "this model"]
    ok = all(r["measured"] == r["formula"] for r in rows) and all(r["measured"] == check["four_n2_d"] for r in mha)
    own = next((r for r in rows if r["label"] == "this model"), None)
    finding = (f"n = {n}, d = {check['d_model']}: " + ", ".join(f"{r['n_heads']} heads {r['measured']:,}" for r in mha)
               + f" (4 n^2 d = {check['four_n2_d']:,}; causal by formula {check['two_n2_d']:,}: the counter never halves)")
    if own:
        finding += f"; {model or 'the model'}'s layer {own['measured']:,} counted vs {own['formula']:,} by formula"
    return _claim("C5", title, claim, test, HELD if ok else NOT_HELD, finding, check["four_n2_d"], run_source(model))


def c6_memory(check: dict | None, model: str | None = None) -> dict:
    title, claim = "Score memory grows with the head count", (
        "An implementation that materialises the scores keeps n_heads x n^2 numbers per layer: at d = 4096, "
        "n = 4096, fp16, 8 / 32 / 128 heads take 0.25 / 1 / 4 GiB, same parameters and FLOPs.")
    test = ("the accounts give 0.25 / 1 / 4 GiB for the chapter's example, and the eager path's peak memory measured in "
            "its own process matches 2 x n_heads x n^2 x 4 bytes (scores and softmax, fp32) within the tolerance at two "
            "head counts")
    if not check:
        return _claim("C6", title, claim, test, NOT_MEASURED, "the memory check is not available in this report")
    chapter = check["chapter"]
    formula_ok = all(abs(r["gib"] - r["chapter_gib"]) < 1e-12 for r in chapter)
    meas = check.get("measured") or []
    tol = check.get("tolerance", 0.1)
    within = [abs(r["peak_bytes"] - r["formula"]) <= tol * r["formula"] for r in meas]
    finding = ("accounts at d 4096, n 4096, fp16: " + ", ".join(f"{r['n_heads']} heads {r['gib']:g} GiB" for r in chapter))
    number = None
    if meas:
        finding += "; measured eager peak: " + ", ".join(
            f"{r['n_heads']} heads (n {r['seq']}) {r['peak_bytes'] / 2**20:.1f} MiB vs {r['formula'] / 2**20:.1f} MiB"
            for r in meas)
        if len(meas) >= 2 and meas[0]["peak_bytes"]:
            number = meas[-1]["peak_bytes"] / meas[0]["peak_bytes"]
            finding += (f" ({number:.2f}x for {meas[-1]['n_heads'] / meas[0]['n_heads']:g}x the heads); a fused kernel "
                        "keeps none of it (see headcount cost --measure)")
    status = (HELD if meas and all(within) else PARTLY) if formula_ok else NOT_HELD
    if meas and not all(within):
        status = NOT_HELD
    return _claim("C6", title, claim, test, status, finding, number,
                  "the accounts (headcount.cost) and peak memory measured in this report's run")


def c10_shapes(check: dict | None, model: str | None = None) -> dict:
    title, claim = "Practice fixes head_dim and sets n_heads = d_model / head_dim", (
        "GPT-3 Small 768/64 = 12 heads, GPT-3 175B 12288/128 = 96, Llama 3 8B 4096/128 = 32; some models set head_dim "
        "on its own, so n_heads x head_dim != d_model and W_O maps back.")
    test = ("the presets give the chapter's head counts with n_heads = d_model / head_dim, a preset with a decoupled "
            "head_dim exists, and the model's shape is read from its own config")
    if not check:
        return _claim("C10", title, claim, test, NOT_MEASURED, "the shapes are not available in this report")
    presets, dec, m = check["presets"], check["decoupled"], check["model"]
    ok = all(p["n_heads"] == p["chapter_n_heads"] == p["d_model"] // p["head_dim"] for p in presets) and \
        dec["n_heads"] * dec["head_dim"] != dec["d_model"]
    finding = (", ".join(f"{p['preset']} {p['d_model']}/{p['head_dim']} = {p['n_heads']} heads" for p in presets)
               + f"; decoupled: {dec['preset']} {dec['n_heads']} x {dec['head_dim']} = {dec['n_heads'] * dec['head_dim']} "
               f"!= d_model {dec['d_model']}; {model or 'this model'}: {m['n_heads']} heads x {m['head_dim']} = "
               f"{m['n_heads'] * m['head_dim']} {'=' if m['n_heads'] * m['head_dim'] == m['d_model'] else '!='} d_model "
               f"{m['d_model']}, {m['n_kv_heads']} KV heads")
    return _claim("C10", title, claim, test, HELD if ok else NOT_HELD, finding, m["n_heads"],
                  "the presets (headcount.cost) and the model's config, read in this report's run")


def c14_kv(check: dict | None, model: str | None = None, accounts: dict | None = None) -> dict:
    title, claim = "KV cache per token = 2 x n_kv x head_dim x layers x bytes", (
        "Each token keeps one K and one V vector per KV head per layer: 2 x n_kv_heads x head_dim x layers x bytes; "
        "Llama 3 8B going from 32 to 8 KV heads cuts it to 1/4.")
    test = "KVCache.nbytes summed over the model's layers equals the formula and the product by hand, to the byte"
    if not check:
        return _claim("C14", title, claim, test, NOT_MEASURED, "the KV cache check is not available in this report")
    ok = check["measured"] == check["formula"] == check["by_hand"]
    finding = (f"{model or 'the model'}, {check['dtype']}: KVCache.nbytes {check['measured']:,} bytes per token; formula "
               f"{check['formula']:,}; by hand 2 x {check['n_kv_heads']} x {check['head_dim']} x {check['n_layers']} x "
               f"{check['bytes']} = {check['by_hand']:,}")
    win = (accounts or {}).get("window")
    mine = next((r for r in (accounts or {}).get("rows") or [] if r.get("is_model")), {})
    if win and mine.get("kv_bytes_per_token_past_window") is not None:
        finding += (f" while the context is within the {win['size']:,}-token sliding window; past it the "
                    f"{win['local_layers']} local layers stop growing and only the {win['global_layers']} global "
                    f"layers do: {mine['kv_bytes_per_token_past_window']:,} bytes per token")
    return _claim("C14", title, claim, test, HELD if ok else NOT_HELD, finding, check["measured"], run_source(model))


def read_claims(report: dict) -> list[dict]:
    """All fifteen claims, C1 to C15, from report.json's sections."""
    shape = report.get("shape") or {}
    model = report.get("model")
    checks = report.get("checks") or {}
    exps = report.get("experiments") or {}
    measured = {"C7": c7_roles(report.get("roles")),
                "C11": c11_pruning(report.get("pruning"), report.get("prune_command"), model),
                "C13": c13_faithfulness(report.get("faithfulness")),
                "C15": c15_gqa(report.get("accounts"), report.get("kv_merge"),
                               (report.get("unavailable") or {}).get("kv_merge"), model)}
    for c in measured.values():
        if c["status"] != NOT_MEASURED and c["source"] == _claim("", "", "", "", "", "")["source"]:
            c["source"] = run_source(model) + (" (with the project's default pruning order and compensation)"
                                               if c["id"] == "C11" else "")
    claims = [
        c1_multi_relation(exps.get("multi-relation")),
        c2_fused(checks.get("c2"), model),
        c3_write_address(exps.get("write-address"), checks.get("c3_geometry"), model),
        c4_params(checks.get("c4"), model),
        c5_flops(checks.get("c5"), model),
        c6_memory(checks.get("c6"), model),
        measured["C7"],
        c8_heads_sweep(exps.get("heads-sweep")),
        c9_rank(report.get("rank"), shape.get("head_dim"), exps.get("low-rank"), model),
        c10_shapes(checks.get("c10"), model),
        measured["C11"],
        c12_gates(report.get("gates"), model),
        measured["C13"],
        c14_kv(checks.get("c14"), model, report.get("accounts")),
        measured["C15"],
    ]
    assert [c["id"] for c in claims] == list(CLAIM_IDS)
    return claims
