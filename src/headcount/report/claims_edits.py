"""The claims read from edits of the model: C11 (heads pruned: `headcount prune`'s result, else prune_to's default
point of the report's curve), C12 (trained gates: the gates bench's saved result or a short run) and C15 (fewer K/V
heads: the accounts, and the K/V merge's cost). Each reader takes its typed section (sections.py)."""

from __future__ import annotations

from headcount.report.sections import Accounts, Edit, Gates, Pruning
from headcount.report.trained import GATES_FILES
from headcount.report.verdicts import (HELD, NOT_HELD, NOT_MEASURED, PARTLY, PRUNE_COSINE, claim, command_source,
                                       compensation_words, domain_finding, limit_words, merge_how, quality, run_source,
                                       sizes_words)

GATES_FILE = GATES_FILES[0]  # where the gates bench saves its result (the report reads it before training)
PRUNE_FRACTION = 0.2  # C11: at least this share of heads removed ...
PRUNE_PPL_RISE = 0.10  # ... for at most this relative rise in held-out perplexity
C12_FRACTION, C12_PPL_RISE = 0.5, 0.20  # C12: gates remove >= half of the heads ("most") for <= this rise


def _read(kind, section):
    return None if section is None else kind.from_json(section)


def _c11_command(title: str, text: str, command: Edit, model: str | None) -> dict | None:
    """C11 from what `headcount prune --fraction 0.2` gives (saved or run with its defaults); None without a measure."""
    decoder = command.ppl_before is not None
    q = quality(command.ppl_before, command.ppl_after, command.cosine, PRUNE_PPL_RISE)
    if q is None:
        return None
    fraction = command.fraction or PRUNE_FRACTION
    test = (f"{fraction:.0%} of the heads removed by `headcount prune --fraction {fraction:g}` with its defaults, "
            f"{limit_words(decoder, PRUNE_PPL_RISE)}" + (" on held-out prose; the other held-out domains are shown"
                                                        if decoder else ""))
    ok, words, number = q
    heads_before = "?" if command.heads_before is None else command.heads_before
    finding = (f"`{command.command}`: {command.heads_removed} of {heads_before} heads removed (order {command.order}, "
               f"{compensation_words(command)}); {words}{sizes_words(command)}" + domain_finding(command))
    return claim("C11", title, text, test, HELD if ok else NOT_HELD, finding, number, command_source(command, model))


def c11_pruning(pruning: Pruning | dict | None, command: Edit | dict | None = None, model: str | None = None) -> dict:
    title, text = "Many heads can be removed", (
        "A large share of heads can be pruned at inference without a marked drop: 20% (translation) to 40% "
        "(BERT) in Michel et al. 2019; 38 of 48 encoder heads in Voita et al. 2019.")
    pruning, command = _read(Pruning, pruning), _read(Edit, command)
    if command is not None:  # what the command gives decides: the report says what users get
        found = _c11_command(title, text, command, model)
        if found is not None:
            return found
    if pruning is None:
        test = f">= {PRUNE_FRACTION:.0%} of heads removed with {limit_words(True, PRUNE_PPL_RISE)}"
        return claim("C11", title, text, test, NOT_MEASURED, "the pruning curve is not available in this report")
    # prune_to's defaults at exactly PRUNE_FRACTION: that point decides
    base, default = pruning.base_ppl, pruning.default
    test = (f"{PRUNE_FRACTION:.0%} of the heads removed by prune_to with the project's default order and "
            f"compensation, {limit_words(bool(base and default.ppl is not None), PRUNE_PPL_RISE)}")
    q = quality(base, default.ppl, default.cosine, PRUNE_PPL_RISE)
    if q is None:
        return claim("C11", title, text, test, NOT_MEASURED, "the default pruning point has no quality measure")
    ok, words, number = q
    status = HELD if default.fraction >= PRUNE_FRACTION - 1e-9 and ok else NOT_HELD
    heads_before = "?" if default.heads_before is None else default.heads_before
    finding = (f"headcount.surgery.prune_to(model, {default.fraction:g}) with its defaults: order "
               f"{default.order}, {compensation_words(default)}: {default.heads_removed} of {heads_before} heads "
               f"removed; {words}" + domain_finding(pruning))
    return claim("C11", title, text, test, status, finding, number)


def c15_gqa(accounts: Accounts | dict | None, merge: Edit | dict | None, merge_missing: str | None = None,
            model: str | None = None) -> dict:
    title, text = "Fewer K/V heads, smaller KV cache", (
        "Query heads and K/V heads may differ (MHA, GQA, MQA): the KV cache per token is "
        "2 x n_kv_heads x head_dim x layers x bytes, so fewer K/V heads cut it proportionally, at some cost "
        "in quality.")
    test = "the KV cache per token falls as n_kv_heads / n_heads; the merge's perplexity cost is shown"
    accounts, merge = _read(Accounts, accounts), _read(Edit, merge)
    if accounts is None or not accounts.rows:
        return claim("C15", title, text, test, NOT_MEASURED, "the accounts are not available in this report")
    rows = accounts.rows
    mha = next(r for r in rows if r.label == "MHA")
    n_heads = mha.n_kv_heads
    exact = all(r.kv_bytes_per_token * n_heads == mha.kv_bytes_per_token * r.n_kv_heads for r in rows)
    bits = [f"{r.label} ({r.n_kv_heads} KV head{'s' if r.n_kv_heads > 1 else ''}) {r.kv_bytes_per_token:,} bytes/token"
            f" ({r.kv_bytes_per_token / mha.kv_bytes_per_token:.0%})" for r in rows]
    finding = "KV cache per token in " + accounts.dtype + ": " + ", ".join(bits)
    number = None
    q = None if merge is None else quality(merge.ppl_before, merge.ppl_after)
    if q is not None and merge.source != "text":  # what `headcount merge-kv --kv-heads 1` gives
        _, words, number = q
        finding += (f". `{merge.command}` ({merge_how(merge)}) takes the K/V heads from {merge.heads_before} "
                    f"to {merge.heads_after} over all layers and gives {words}{sizes_words(merge)}: the memory "
                    "is saved at a cost in quality" + domain_finding(merge))
        status = HELD if exact else NOT_HELD
    elif q is not None:  # the report's own text: merge_kv's defaults on it
        _, words, number = q
        finding += (f". Merging this model's K/V heads {merge.heads_before} -> {merge.heads_after} "
                    f"(merge_kv's defaults, {merge_how(merge)}, calibrated on the report's own text) gives {words}: "
                    "the memory is saved at a cost in quality" + domain_finding(merge))
        status = HELD if exact else NOT_HELD
    else:
        finding += (f". The quality side (a K/V merge) is not measured ({merge_missing.rstrip('.')})"
                    if merge_missing else ". The quality side (a K/V merge) is not available in this report")
        status = PARTLY if exact else NOT_HELD
    source = (f"the accounts (headcount.cost); the merge: {command_source(merge, model)}"
              if q is not None and merge.source != "text" else None)
    return claim("C15", title, text, test, status, finding, number, source)


def c12_gates(gates: Gates | dict | None, model: str | None = None) -> dict:
    title, text = "Trained gates remove most heads", (
        "Stochastic hard-concrete gates with an L0 penalty, trained on the task, close most heads: 38 of 48 encoder "
        "heads for -0.15 BLEU (Voita et al. 2019).")
    test = (f"hard-concrete gates trained to remove >= {C12_FRACTION:.0%} of the heads reach that target, and the "
            f"model without those heads keeps held-out perplexity within +{C12_PPL_RISE:.0%} (encoders: embeddings "
            f"at mean cosine >= {PRUNE_COSINE})")
    gates = _read(Gates, gates)
    if gates is None:
        return claim("C12", title, text, test, NOT_MEASURED, "trained gates are not available in this report")
    if gates.source == "saved":
        return _c12_saved(title, text, test, gates)
    before, removed = gates.heads_before, gates.heads_removed
    share = removed / before if before and removed is not None else None
    how = (f"gates and {model or 'the model'}'s {gates.params or 'attention'} weights trained together"
           if gates.joint else f"gate training on a frozen {model or 'model'}")
    bits = [f"{gates.steps} steps of {how} (distillation from the "
            f"unmodified model{', ' + gates.objective if gates.objective else ''}), target "
            f"{gates.fraction:.0%} of the heads removed"]
    if gates.n_gates is not None:
        bits.append(f"{gates.n_closed} of {gates.n_gates} gates closed; {removed} heads removed "
                    f"({gates.n_removed_ranked or 0} of them still open, ranked out)")
    if gates.reached is False:
        bits.append("the L0 target was NOT reached in the steps given")
    q = quality(gates.ppl_before, gates.ppl_after, gates.cosine, C12_PPL_RISE)
    within, number = (q[0], q[2]) if q else (False, None)
    if q:
        bits.append(q[1] + (f", compensation {gates.compensate}" if gates.compensate else ""))
    enough = share is not None and share >= C12_FRACTION - 1e-9
    status = HELD if enough and gates.reached is not False and within else NOT_HELD
    return claim("C12", title, text, test, status, "; ".join(bits), number,
                 run_source(model) + " (headcount.surgery.train_gates, a short run, cached: the gates bench has no "
                 f"saved result for this model in benchmarks/results/{GATES_FILE}; `headcount bench surgery --part "
                 f"gates --save-json benchmarks/results/{GATES_FILE}` trains for minutes and the report then reads it)")


def _c12_saved(title: str, text: str, test: str, gates: Gates) -> dict:
    pts = [(p, q) for p in gates.points if p.heads_before
           and (q := quality(p.base_ppl, p.ppl, p.cosine, C12_PPL_RISE)) is not None]
    if not pts:
        return claim("C12", title, text, test, NOT_MEASURED, f"{gates.path} holds no usable point")

    def share(pq):
        return pq[0].heads_removed / pq[0].heads_before

    enough = [pq for pq in pts if share(pq) >= C12_FRACTION - 1e-9]
    ok = [pq for pq in enough if pq[1][0]]
    best, (_, words, number) = max(ok or enough or pts, key=share)
    moved = "every weight of the model" if best.params == "all" else \
        f"the model's {best.params or 'attention'} weights"
    steps = best.steps or gates.steps
    how = (f"gates trained with {moved} (Voita's setup) for {steps} steps, the closed heads then removed:"
           if gates.joint else f"gates trained {steps} steps on the frozen model then lstsq removed")
    finding = (f"{best.model or 'the model'}: {how} {best.heads_removed} of {best.heads_before} heads; {words}"
               + (" (other targets: " + ", ".join(f"{p.heads_removed} removed" for p, _ in pts if p is not best)
                  + ")" if len(pts) > 1 else ""))
    quick = " --quick" if gates.quick else ""
    which = " (its l0 joint points: `headcount prune --method l0 --joint`)" if gates.joint else ""
    return claim("C12", title, text, test, HELD if ok else NOT_HELD, finding, number,
                 f"the gates bench's saved{quick} result in {gates.path}{which} (`headcount bench surgery "
                 f"--part gates{quick}`), preferred to a short run on the report's model")
