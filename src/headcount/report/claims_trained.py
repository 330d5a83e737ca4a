"""The claims read from the experiments trained from scratch (trained.py's sections): C1 multi-relation, C3 write
address (with the model's own write geometry), C8 heads sweep, and the low-rank experiment C9 reads beside the
model's ranks. Each reader takes its typed section (sections.Experiment; its JSON is read into it)."""

from __future__ import annotations

from typing import NamedTuple

from headcount.report.sections import (Experiment, HeadsSweepRow, LowRankRow, MultiRelationRow, OneHead,
                                       WriteAddressRow, WriteGeometry)
from headcount.report.verdicts import (HELD, NOT_HELD, NOT_MEASURED, PARTLY, claim, experiment_source,
                                       run_source)

C1_ACCURACY, C1_GAP = 0.95, 0.3  # C1: several heads reach this exact-match accuracy; one head stays this far below
C3_OWN_SLICE = 0.5  # C3: a head writing to its own slice would put all its output energy there (1.0)
C9_WIDE, C9_NARROW = 1e-3, 0.01  # C9 (low-rank): error once head_dim >= n below this; head_dim <= n/4 above that
SPREAD = 2.0  # C3, C8: a difference counts when it exceeds this many standard deviations over seeds
C8_FLOOR = 0.01  # C8: ... and, for perplexities, at least this share of the best (one seed has no spread)


def _read(section) -> Experiment | None:
    return None if section is None else Experiment.from_json(section)


class LowRank(NamedTuple):
    ok: bool  # the experiment shows the bound's consequence
    finding: str
    number: float  # the narrowest head's error


def low_rank_reading(section: Experiment | dict | None) -> LowRank | None:
    """The low-rank experiment in words, or None without it."""
    section = _read(section)
    if section is None:
        return None
    rows = section.rows(LowRankRow)
    n = section.result.config.get("n")
    one = sorted((r for r in rows if r.setting == "one head"), key=lambda r: r.head_dim)
    if not one or not n:
        return None
    narrow = [r for r in one if r.head_dim <= n // 4]
    wide = [r for r in one if r.head_dim >= n]
    ok = bool(narrow) and bool(wide) and all(r.error > C9_NARROW for r in narrow) and \
        all(r.error < C9_WIDE for r in wide)
    errs = ", ".join(f"head_dim {r.head_dim}: {r.error:.3g}" for r in one)
    finding = f"fitting full-rank patterns of n = {n} positions with one head, error (total variation) {errs}"
    other = [r for r in rows if r.setting != "one head"]
    if len(other) >= 2:
        finding += "; at n_heads = " + ", then ".join(f"{r.n_heads} with head_dim {r.head_dim}: {r.error:.3g}"
                                                    for r in other)
    return LowRank(ok, finding, one[0].error)


def c1_multi_relation(section: Experiment | dict | None) -> dict:
    title, text = "One head, one weighted average", (
        "One head gives one weighted average per position; n heads give n independent averages, each written to "
        "its own slice of the output. A query that needs values from two positions needs two heads.")
    test = (f"on the two-relation task at equal attention parameters, the best model with >= 2 heads reaches "
            f"exact-match accuracy >= {C1_ACCURACY} and the one-head model stays at least {C1_GAP} below it")
    section = _read(section)
    rows = {r.n_heads: r for r in section.rows(MultiRelationRow)} if section is not None else {}
    others = [r for n, r in rows.items() if n > 1]
    if 1 not in rows or not others:
        return claim("C1", title, text, test, NOT_MEASURED, "the multi-relation experiment is not available")
    one, best = rows[1], max(others, key=lambda r: r.accuracy)
    gap = best.accuracy - one.accuracy
    status = HELD if best.accuracy >= C1_ACCURACY and gap >= C1_GAP else \
        (PARTLY if best.accuracy >= C1_ACCURACY and gap > 0 else NOT_HELD)
    seeds = one.accuracy_seeds
    finding = (f"one head: accuracy {one.accuracy:.3f}"
               + (f" (per seed {', '.join(f'{a:.2f}' for a in seeds)})" if len(seeds) > 1 else "")
               + f"; {best.n_heads} heads: {best.accuracy:.3f}; all with {one.attention_params:,} "
               "attention parameters" if isinstance(one.attention_params, int) else
               f"one head: accuracy {one.accuracy:.3f}; {best.n_heads} heads: {best.accuracy:.3f}")
    if "one_head" in section.result.details:
        oh = OneHead.from_json(section.result.details["one_head"], "multi-relation: details.one_head")
        if oh.mass_on_marked:
            finding += (f". The one head (first seed) puts {' + '.join(f'{m:.2f}' for m in oh.mass_on_marked)} of "
                        f"its attention on the two marked positions; its output sits at distance "
                        f"{oh.distance_to_average:.2f} from their average (0 = the average, 1 = one value)")
    return claim("C1", title, text, test, status, finding, gap, experiment_source(section))


def c3_write_address(section: Experiment | dict | None, geometry: WriteGeometry | None,
                     model: str | None = None) -> dict:
    title, text = "W_O is each head's write address", (
        "The i-th block of rows of W_O decides where head i writes in the residual stream; without W_O head i "
        "could only ever write to slice i.")
    test = (f"a small model trained without W_O (o_proj frozen to the identity: head i confined to slice i) ends "
            f"with a held-out loss more than {SPREAD:g} standard deviations above the same model with W_O; and a "
            f"real model's heads put less than {C3_OWN_SLICE:.0%} of their output energy in their own slice "
            "(confined: 100%)")
    section = _read(section)
    rows = {r.variant: r for r in section.rows(WriteAddressRow)} if section is not None else {}
    with_o = next((r for k, r in rows.items() if k and "no o_proj" not in k), None)
    without = next((r for k, r in rows.items() if k and "no o_proj" in k), None)
    geo, geo_name = geometry, model
    if geo is None and section is not None:  # the experiment's real-model geometry, when it measured one
        real = section.result.details.get("real_models", {})
        geo_name, found = next(iter(real.items()), (None, None))
        geo = None if found is None else WriteGeometry.from_json(found, f"write-address: {geo_name}")
    if with_o is None and geo is None:
        return claim("C3", title, text, test, NOT_MEASURED, "the write-address experiment is not available")
    bits, ok = [], []
    number = None
    if with_o is not None and without is not None:
        number = without.loss - with_o.loss
        spread = max(with_o.loss_std or 0.0, without.loss_std or 0.0)
        ok.append(number > SPREAD * spread and number > 0)
        bits.append(f"trained from scratch, held-out loss with W_O {with_o.loss:.4f} ± {with_o.loss_std or 0:.4f}, "
                    f"without {without.loss:.4f} ± {without.loss_std or 0:.4f} nats/byte "
                    f"(difference {number:+.4f})")
    if geo is not None:
        own = geo.own_slice_energy
        ok.append(own is not None and own < C3_OWN_SLICE)
        bits.append(f"{geo_name}'s heads put {own:.3f} of their output energy in their own slice (even spread: "
                    f"{geo.slice_share:.3f}; confined: 1) and reach {geo.reach:.2f} of d_model; mean pairwise "
                    f"overlap of their write subspaces {geo.mean_overlap:.3f}")
    status = HELD if len(ok) == 2 and all(ok) else (PARTLY if any(ok) else NOT_HELD)
    sources = []
    if with_o is not None:
        sources.append(experiment_source(section))
    if geometry is not None:
        sources.append(f"the write geometry {run_source(model)}")
    return claim("C3", title, text, test, status, "; ".join(bits), number, "; ".join(sources))


def c8_heads_sweep(section: Experiment | dict | None) -> dict:
    title, text = "Head count at fixed width: a broad optimum", (
        "At fixed d_model, more heads means narrower heads; quality has a broad optimum and only the extremes lose "
        "(Vaswani et al. 2017, Table 3 A: 1 head 5.29 PPL, 8-16 heads 4.91-4.92, 32 heads 5.01).")
    test = (f"every head count between the extremes within {SPREAD:g} standard deviations over seeds (at least "
            f"{C8_FLOOR:.0%} of the best) of the best held-out perplexity (broad), and both extremes (fewest, most "
            "heads) further than that from the best (only extremes lose)")
    section = _read(section)
    rows = sorted(section.rows(HeadsSweepRow), key=lambda r: r.n_heads) if section is not None else []
    if len(rows) < 3:
        return claim("C8", title, text, test, NOT_MEASURED, "the heads-sweep experiment is not available")
    best = min(rows, key=lambda r: r.ppl_mean)

    def near(r):
        spread = SPREAD * max(best.ppl_std or 0, r.ppl_std or 0)
        return r.ppl_mean - best.ppl_mean <= max(spread, C8_FLOOR * best.ppl_mean)

    broad = all(near(r) for r in rows[1:-1])
    losing = [r for r in (rows[0], rows[-1]) if r is not best and not near(r)]
    status = (HELD if len(losing) == 2 else PARTLY) if broad else NOT_HELD
    worst = max(rows, key=lambda r: r.ppl_mean)
    number = worst.ppl_mean / best.ppl_mean - 1
    finding = ("held-out perplexity per byte by n_heads (head_dim): "
               + ", ".join(f"{r.n_heads} ({r.head_dim}) {r.ppl_mean:.3f} ± {r.ppl_std or 0:.3f}" for r in rows)
               + f". Best {best.n_heads} head(s); near it: "
               + ", ".join(str(r.n_heads) for r in rows if near(r))
               + f"; extremes that lose: {', '.join(str(r.n_heads) for r in losing) or 'none'}"
               + f"; the worst is {number:+.1%} from the best")
    return claim("C8", title, text, test, status, finding, number, experiment_source(section))
