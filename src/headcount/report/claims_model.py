"""The claims read from what the report measured on the model itself: the chapter checks (C2, C4, C5, C6, C10,
C14), the roles (C7), the ranks (C9, with the low-rank experiment beside them) and faithfulness (C13). Each
reader takes its typed section (sections.py; its JSON is read into it) and gives the claim's JSON."""

from __future__ import annotations

import statistics

from headcount.report.claims_trained import C9_NARROW, C9_WIDE, low_rank_reading
from headcount.report.sections import (Accounts, FlopCheck, FusedCheck, Faithfulness, Experiment, KVCheck,
                                       MemoryCheck, ParamCheck, Rank, Role, ShapeCheck)
from headcount.report.verdicts import (HELD, NOT_HELD, NOT_MEASURED, PARTLY, ROLE_NAMES, claim, experiment_source,
                                       head_name, role_score, run_source)

ROLES_NEEDED = 3  # C7 holds when at least this many roles have a labelled head
TAU_WEAK = 0.5  # C13: mean Kendall tau(attention, gradient x input) below this = weak agreement
JSD_FAR = 0.1  # C13: median adversarial JSD at or above this = very different attention, same output
C2_RELATIVE = 1e-9  # C2: fused vs per-head formula, float64, max |difference| / max |output|


def _read(kind, section):
    return None if section is None else kind.from_json(section)


def c7_roles(roles: dict | None) -> dict:
    title, text = "Heads specialise", ("Trained heads take on roles: positional, syntactic, rare-word "
                                       "(Voita et al. 2019), previous-token, induction.")
    test = f"at least {ROLES_NEEDED} of the {len(ROLE_NAMES)} roles have a head past the role's threshold"
    if not roles:
        return claim("C7", title, text, test, NOT_MEASURED, "role scores are not available in this report")
    roles = {r: Role.from_json(v, f"roles.{r}") for r, v in roles.items()}
    found = {r: roles[r].heads for r in ROLE_NAMES if r in roles}
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
    return claim("C7", title, text, test, status, finding, len(with_heads))


def c9_rank(rank: Rank | dict | None, head_dim: int | None, low_rank: Experiment | dict | None = None,
            model: str | None = None) -> dict:
    title, text = "A head's scores have rank at most head_dim", (
        "QK^T of one head has rank <= head_dim, so a head narrower than the sequence cannot express every "
        "n x n pattern (Bhojanapalli et al. 2020).")
    test = "no head's numerical rank exceeds min(head_dim, n) at any length; the share at the bound is shown"
    rank, low_rank = _read(Rank, rank), _read(Experiment, low_rank)
    summary = rank.summary if rank is not None else []
    exp = low_rank_reading(low_rank)
    if exp is not None:
        test += (f"; and in the low-rank experiment one head's best fit of full-rank n x n patterns errs by > "
                 f"{C9_NARROW} (total variation) for head_dim <= n/4 and by < {C9_WIDE} once head_dim >= n")
    if not summary:
        if exp is None:
            return claim("C9", title, text, test, NOT_MEASURED, "rank results are not available in this report")
        # the bound itself is decided on the model: without its ranks, not measured
        return claim("C9", title, text, test, NOT_MEASURED,
                     "the model's ranks are not available in this report; the low-rank experiment alone: "
                     + exp.finding + (" (consistent with the bound)" if exp.ok else " (NOT consistent with the bound)"),
                     exp.number, experiment_source(low_rank))
    over = [s for s in summary if s.max_rank is not None and s.max_rank > s.bound]
    longest = max(summary, key=lambda s: s.length)
    bits = [f"n={s.length}: mean rank {s.mean_rank:.1f} of bound {s.bound} (max {s.max_rank}"
            + (f", {100 * s.share_at_bound:.0f}% at the bound)" if s.share_at_bound is not None else ")")
            for s in sorted(summary, key=lambda s: s.length)]
    finding = "; ".join(bits)
    if head_dim and longest.length > head_dim:
        finding += f". Past n = head_dim = {head_dim} the rank stops growing with n"
    if rank.tolerance is not None:
        finding += f" (tolerance {rank.tolerance})"
    status = NOT_HELD if over else HELD
    source = run_source(model)
    if exp is not None:
        finding += ". Low-rank experiment: " + exp.finding
        source += "; low-rank: " + experiment_source(low_rank)
        if not exp.ok and status == HELD:
            status = PARTLY
    return claim("C9", title, text, test, status, finding, longest.max_rank, source)


def c13_faithfulness(faith: Faithfulness | dict | None) -> dict:
    title, text = "Attention is not explanation", (
        "Attention weights often disagree with gradient importance, and very different attention can give "
        "the same prediction (Jain and Wallace 2019).")
    test = (f"mean Kendall tau(attention, gradient x input) < {TAU_WEAK}, and median adversarial JSD >= {JSD_FAR} "
            "with the output held within epsilon")
    faith = _read(Faithfulness, faith)
    heads = faith.heads if faith is not None else []
    if not heads:
        return claim("C13", title, text, test, NOT_MEASURED, "faithfulness results are not available in this report")
    taus = [h.tau_gradient for h in heads if h.tau_gradient is not None]
    loos = [h.tau_loo for h in heads if h.tau_loo is not None]
    jsds = [h.jsd for h in heads if h.jsd is not None]
    tvs = [h.tv for h in heads if h.tv is not None]
    eps = faith.epsilon
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
    return claim("C13", title, text, test, status, finding, statistics.fmean(taus) if taus else None)


# --------------------------------------------------------- measured checks: C2, C4, C5, C6, C10, C14
def c2_fused(check: FusedCheck | None, model: str | None = None) -> dict:
    title, text = "Fused projection = the per-head formula", (
        "One fused projection [T, d_model] x [d_model, n_heads d_head], a view to [T, n_heads, d_head] (no data "
        "moved), a transpose to [n_heads, T, d_head], attention, the way back and W_O compute exactly "
        "Concat(head_1..head_n) W_O with n_heads separate matrices.")
    test = (f"on the model's first layer, max |fused - per-head formula| <= {C2_RELATIVE:g} x max |output| in float64 "
            "(headcount.reference, a loop over heads with an explicit Concat)")
    if check is None:
        return claim("C2", title, text, test, NOT_MEASURED, "the reference check is not available in this report")
    rel = check.relative_diff
    finding = (f"layer {check.layer} of {model or 'the model'} on {check.tokens} tokens ({check.n_heads} heads, "
               f"{check.n_kv_heads} KV heads, head_dim {check.head_dim}): max |difference| "
               f"{check.max_abs_diff:.3g} for outputs up to {check.max_abs_output:.3g} (relative {rel:.3g}); "
               f"view moved no data: {'yes' if check.view_moves_no_data else 'NO'}; the transposed Q is "
               f"{'contiguous' if check.transposed_q_contiguous else 'a non-contiguous view'}; rotary: "
               f"{check.rotary}")
    return claim("C2", title, text, test, HELD if rel <= C2_RELATIVE else NOT_HELD, finding, rel, run_source(model))


def c4_params(check: ParamCheck | None, model: str | None = None) -> dict:
    title, text = "Parameters 4d^2, whatever the head count", (
        "An attention layer has 4 d^2 parameters (W_Q, W_K, W_V, W_O) with d_model = n_heads x d_head: the head "
        "count does not change it.")
    test = ("sum(numel) of MultiHeadAttention built at the model's d_model with several head counts equals the "
            "formula and 4 d^2 each time, and the model's own layer equals the formula for its shape")
    if check is None:
        return claim("C4", title, text, test, NOT_MEASURED, "the parameter check is not available in this report")
    m, d2 = check.model, check.four_d2
    ok = all(r.measured == r.formula == d2 for r in check.mha) and m.measured == m.formula
    finding = (f"d_model {check.d_model}: " + ", ".join(f"{r.n_heads} heads {r.measured:,}" for r in check.mha)
               + f" (4d^2 = {d2:,}); {model or 'the model'}'s layer 0 ({m.n_heads} heads, {m.n_kv_heads} KV heads, "
               f"head_dim {m.head_dim}) {m.measured:,} counted vs {m.formula:,} by formula")
    if m.n_kv_heads != m.n_heads:
        finding += " (fewer K/V heads make W_K and W_V smaller: 2 d^2 + 2 d n_kv d_head)"
    return claim("C4", title, text, test, HELD if ok else NOT_HELD, finding, d2, run_source(model))


def c5_flops(check: FlopCheck | None, model: str | None = None) -> dict:
    title, text = "Score FLOPs 4 n^2 d, whatever the head count", (
        "Scores and the weighted read cost n_heads x 4 n^2 d_head = 4 n^2 d FLOPs, independent of the head count; "
        "causal masking halves it to 2 n^2 d.")
    test = ("FlopCounterMode's count of Q K^T + A V on the eager path equals 4 n^2 d at several head counts and the "
            "formula for the model's shape")
    if check is None:
        return claim("C5", title, text, test, NOT_MEASURED, "the FLOP check is not available in this report")
    rows, n = check.rows, check.seq
    mha = [r for r in rows if r.label != "this model"]
    ok = all(r.measured == r.formula for r in rows) and all(r.measured == check.four_n2_d for r in mha)
    own = next((r for r in rows if r.label == "this model"), None)
    finding = (f"n = {n}, d = {check.d_model}: " + ", ".join(f"{r.n_heads} heads {r.measured:,}" for r in mha)
               + f" (4 n^2 d = {check.four_n2_d:,}; causal by formula {check.two_n2_d:,}: the counter never halves)")
    if own:
        finding += f"; {model or 'the model'}'s layer {own.measured:,} counted vs {own.formula:,} by formula"
    return claim("C5", title, text, test, HELD if ok else NOT_HELD, finding, check.four_n2_d, run_source(model))


def c6_memory(check: MemoryCheck | None, model: str | None = None) -> dict:
    title, text = "Score memory grows with the head count", (
        "An implementation that materialises the scores keeps n_heads x n^2 numbers per layer: at d = 4096, "
        "n = 4096, fp16, 8 / 32 / 128 heads take 0.25 / 1 / 4 GiB, same parameters and FLOPs.")
    test = ("the accounts give 0.25 / 1 / 4 GiB for the chapter's example, and the eager path's peak memory measured in "
            "its own process matches 2 x n_heads x n^2 x 4 bytes (scores and softmax, fp32) within the tolerance at two "
            "head counts")
    if check is None:
        return claim("C6", title, text, test, NOT_MEASURED, "the memory check is not available in this report")
    formula_ok = all(abs(r.gib - r.chapter_gib) < 1e-12 for r in check.chapter)
    meas = check.measured
    within = [abs(r.peak_bytes - r.formula) <= check.tolerance * r.formula for r in meas]
    finding = "accounts at d 4096, n 4096, fp16: " + ", ".join(f"{r.n_heads} heads {r.gib:g} GiB" for r in check.chapter)
    number = None
    if meas:
        finding += "; measured eager peak: " + ", ".join(
            f"{r.n_heads} heads (n {r.seq}) {r.peak_bytes / 2**20:.1f} MiB vs {r.formula / 2**20:.1f} MiB" for r in meas)
        if len(meas) >= 2 and meas[0].peak_bytes:
            number = meas[-1].peak_bytes / meas[0].peak_bytes
            finding += (f" ({number:.2f}x for {meas[-1].n_heads / meas[0].n_heads:g}x the heads); a fused kernel "
                        "keeps none of it (see headcount cost --measure)")
    status = (HELD if meas and all(within) else PARTLY) if formula_ok else NOT_HELD
    if meas and not all(within):
        status = NOT_HELD
    return claim("C6", title, text, test, status, finding, number,
                 "the accounts (headcount.cost) and peak memory measured in this report's run")


def c10_shapes(check: ShapeCheck | None, model: str | None = None) -> dict:
    title, text = "Practice fixes head_dim and sets n_heads = d_model / head_dim", (
        "GPT-3 Small 768/64 = 12 heads, GPT-3 175B 12288/128 = 96, Llama 3 8B 4096/128 = 32; some models set head_dim "
        "on its own, so n_heads x head_dim != d_model and W_O maps back.")
    test = ("the presets give the chapter's head counts with n_heads = d_model / head_dim, a preset with a decoupled "
            "head_dim exists, and the model's shape is read from its own config")
    if check is None:
        return claim("C10", title, text, test, NOT_MEASURED, "the shapes are not available in this report")
    presets, dec, m = check.presets, check.decoupled, check.model
    ok = all(p.n_heads == p.chapter_n_heads == p.d_model // p.head_dim for p in presets) and \
        dec.n_heads * dec.head_dim != dec.d_model
    finding = (", ".join(f"{p.preset} {p.d_model}/{p.head_dim} = {p.n_heads} heads" for p in presets)
               + f"; decoupled: {dec.preset} {dec.n_heads} x {dec.head_dim} = {dec.n_heads * dec.head_dim} "
               f"!= d_model {dec.d_model}; {model or 'this model'}: {m.n_heads} heads x {m.head_dim} = "
               f"{m.n_heads * m.head_dim} {'=' if m.n_heads * m.head_dim == m.d_model else '!='} d_model "
               f"{m.d_model}, {m.n_kv_heads} KV heads")
    return claim("C10", title, text, test, HELD if ok else NOT_HELD, finding, m.n_heads,
                 "the presets (headcount.cost) and the model's config, read in this report's run")


def c14_kv(check: KVCheck | None, model: str | None = None, accounts: Accounts | None = None) -> dict:
    title, text = "KV cache per token = 2 x n_kv x head_dim x layers x bytes", (
        "Each token keeps one K and one V vector per KV head per layer: 2 x n_kv_heads x head_dim x layers x bytes; "
        "Llama 3 8B going from 32 to 8 KV heads cuts it to 1/4.")
    test = "KVCache.nbytes summed over the model's layers equals the formula and the product by hand, to the byte"
    if check is None:
        return claim("C14", title, text, test, NOT_MEASURED, "the KV cache check is not available in this report")
    ok = check.measured == check.formula == check.by_hand
    finding = (f"{model or 'the model'}, {check.dtype}: KVCache.nbytes {check.measured:,} bytes per token; formula "
               f"{check.formula:,}; by hand 2 x {check.n_kv_heads} x {check.head_dim} x {check.n_layers} x "
               f"{check.bytes} = {check.by_hand:,}")
    win = accounts.window if accounts is not None else None
    mine = next((r for r in accounts.rows if r.is_model), None) if accounts is not None else None
    if win and mine is not None and mine.kv_bytes_per_token_past_window is not None:
        finding += (f" while the context is within the {win.size:,}-token sliding window; past it the "
                    f"{win.local_layers} local layers stop growing and only the {win.global_layers} global "
                    f"layers do: {mine.kv_bytes_per_token_past_window:,} bytes per token")
    return claim("C14", title, text, test, HELD if ok else NOT_HELD, finding, check.measured, run_source(model))
