"""The plain-English reading (claims.py) and the five-line summary, on hand-built sections whose
answers are known: all fifteen claims in report.json with their number, test and source, and each one
reported as failed when the synthetic report breaks it."""

import pytest

from headcount.cost import ModelShape, kv_cache
from headcount.report.accounts import _variants, accounts
from headcount.report.measures.roles import strongest_roles
from headcount.report.claims import CLAIM_IDS, c7_roles, c9_rank, c11_pruning, c13_faithfulness, c15_gqa, read_claims
from headcount.report.collect import normalise
from headcount.report.example import example_experiments, example_report
from headcount.report.summary import summary_lines

ROLES = ("previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word", "sink")


def _roles(labelled: dict) -> dict:
    out = {}
    for r in ROLES:
        scores = [[0.1, 0.1], [0.1, 0.1]]
        for entry in labelled.get(r, []):
            scores[entry[0]][entry[1]] = entry[-1]
        out[r] = {"scores": scores, "threshold": 0.5, "heads": [list(e[:-1]) for e in labelled.get(r, [])]}
    return out


def test_c7_needs_three_roles():
    assert c7_roles(_roles({"induction": [(1, 0, 0.9)], "sink": [(0, 1, 0.8)]}))["status"] == "partly"
    held = c7_roles(_roles({"induction": [(1, 0, 0.9)], "sink": [(0, 1, 0.8)], "previous_token": [(0, 0, 0.7)]}))
    assert held["status"] == "held" and held["number"] == 3
    assert "induction 1 (top L1 H0, 0.90)" in held["finding"]
    assert c7_roles(_roles({}))["status"] == "did not hold"
    assert c7_roles(None)["status"] == "not measured"


def test_strongest_role_prefers_the_largest_ratio_and_the_sink_last():
    roles = _roles({"induction": [(1, 0, 0.9)], "previous_token": [(1, 0, 0.6)], "sink": [(1, 0, 1.0), (0, 1, 0.8)]})
    best, hover = strongest_roles(roles)
    assert best == [[None, "sink"], ["induction", None]]
    assert "induction: 0.900 (thr 0.5) \u2714" in hover[1][0]


def _rank(max_rank_at_128):
    return {"tolerance": 1e-5, "summary": [
        {"length": 32, "bound": 32, "mean_rank": 31.0, "min_rank": 30, "max_rank": 32, "share_at_bound": 0.5},
        {"length": 128, "bound": 64, "mean_rank": 60.0, "min_rank": 50, "max_rank": max_rank_at_128,
         "share_at_bound": 0.4}]}


def test_c9_fails_when_any_rank_passes_the_bound():
    assert c9_rank(_rank(64), 64)["status"] == "held"
    assert c9_rank(_rank(65), 64)["status"] == "did not hold"
    assert "stops growing" in c9_rank(_rank(64), 64)["finding"]


def test_c11_reads_prune_tos_default_point():
    pts = [{"fraction": f, "order": "gradient", "compensate": "none", "mode": "query", "heads_removed": 1, "ppl": p}
           for f, p in ((0.1, 10.2), (0.2, 10.9), (0.3, 11.5))]
    c = c11_pruning({"base_ppl": 10.0, "points": pts, "default": pts[1]})
    assert c["status"] == "held" and abs(c["number"] - (10.9 / 10.0 - 1)) < 1e-12
    c = c11_pruning({"base_ppl": 10.0, "points": pts, "default": dict(pts[1], ppl=11.2)})
    assert c["status"] == "did not hold" and abs(c["number"] - (11.2 / 10.0 - 1)) < 1e-12
    enc = c11_pruning({"base_ppl": None, "points": pts, "default": dict(pts[1], ppl=None, cosine=0.97)})
    assert enc["status"] == "held" and "cosine 0.970" in enc["finding"]
    with pytest.raises(ValueError, match="report.json Pruning: expected the key 'default'"):
        c11_pruning({"base_ppl": 10.0, "points": pts})  # a curve without prune_to's point is not this format's


def test_c13_needs_weak_agreement_and_far_adversaries():
    heads = [{"layer": 0, "head": h, "tau_gradient": t, "tau_loo": 0.1, "tau_uniform": 0.0, "jsd": j, "tv": 0.009}
             for h, (t, j) in enumerate(((0.1, 0.3), (0.2, 0.4), (0.3, 0.05)))]
    assert c13_faithfulness({"epsilon": 0.01, "heads": heads})["status"] == "held"
    strong = [dict(h, tau_gradient=0.9) for h in heads]
    assert c13_faithfulness({"epsilon": 0.01, "heads": strong})["status"] == "partly"
    near = [dict(h, tau_gradient=0.9, jsd=0.01) for h in heads]
    assert c13_faithfulness({"epsilon": 0.01, "heads": near})["status"] == "did not hold"


def test_accounts_follow_the_kv_cache_formula():
    shape = ModelShape(d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30, vocab_size=49152,
                       d_ff=1536, mlp="gated")
    acc = accounts(shape)
    assert [(r["label"], r["n_kv_heads"], r["is_model"]) for r in acc["rows"]] == \
        [("MHA", 9, False), ("GQA", 3, True), ("MQA", 1, False)]
    for r in acc["rows"]:  # 2 (K and V) x layers x n_kv_heads x head_dim x 2 bytes (bf16)
        assert r["kv_bytes_per_token"] == 2 * 30 * r["n_kv_heads"] * 64 * 2
        assert r["kv_bytes_per_token"] == kv_cache(shape.replace(n_kv_heads=r["n_kv_heads"]), 1, 1, 2)[
            "bytes_per_token"]
    assert _variants(12, 12) == [("MHA", 12), ("GQA", 4), ("MQA", 1)]
    c = c15_gqa(acc, {"source": "text", "heads_before": 3, "heads_after": 1, "ppl_before": 10.0, "ppl_after": 12.0})
    assert c["status"] == "held" and abs(c["number"] - 0.2) < 1e-12 and "(33%)" in c["finding"]
    assert c15_gqa(acc, None)["status"] == "partly"


def test_summary_is_five_lines_with_the_counts():
    lines = summary_lines(example_report())
    assert len(lines) == 5
    assert lines[0].startswith("heads per role: previous-token 4, duplicate-token 0, induction 4")
    assert lines[1].startswith("top heads: ")
    assert lines[2] == ("chapter claims held: 15 of 15 (15 measured: C1 held, C2 held, C3 held, C4 held, C5 held, "
                        "C6 held, C7 held, C8 held, C9 held, C10 held, C11 held, C12 held, C13 held, C14 held, C15 held)")
    assert lines[4] == "every section present"
    gone = summary_lines(example_report(missing=("roles",)))
    assert gone[0] == "heads per role: not available" and gone[4] == "not available: roles"


# ------------------------------------------------------------------------------ all fifteen claims
def test_every_claim_is_in_report_json_with_its_number_test_and_source():
    r = example_report()
    assert [c["id"] for c in r["claims"]] == [f"C{i}" for i in range(1, 16)] == list(CLAIM_IDS)
    for c in r["claims"]:
        assert set(c) >= {"id", "title", "claim", "test", "status", "finding", "number", "source"}, c["id"]
        assert c["status"] == "held", (c["id"], c["finding"])
        assert isinstance(c["number"], (int, float)) and not isinstance(c["number"], bool), c["id"]
        assert c["test"].strip() and c["finding"].strip() and c["source"].strip(), c["id"]
    src = {c["id"]: c["source"] for c in r["claims"]}
    for cid in ("C2", "C4", "C5", "C7", "C12", "C13", "C14"):
        assert src[cid].startswith("measured on example in this report's run"), (cid, src[cid])
    # C11 and C15: what the commands give (their saved results for these weights)
    assert src["C11"].startswith("saved result of `headcount prune --model example --fraction 0.2 --out DIR --json` "
                                 "(benchmarks/results/commands/example-prune-0.2.json), measured on these weights")
    assert "the merge: saved result of `headcount merge-kv --model example --kv-heads 1 --json`" in src["C15"]
    no_command = example_report(missing=("prune_command",))
    src = {c["id"]: c["source"] for c in no_command["claims"]}
    for cid, name in (("C1", "multi-relation"), ("C8", "heads-sweep")):
        assert f"full run saved in benchmarks/results/{name}.json" in src[cid], src[cid]
    assert "benchmarks/results/low-rank.json" in src["C9"] and src["C9"].startswith("measured on example")
    assert "benchmarks/results/write-address.json" in src["C3"] and "write geometry measured on example" in src["C3"]
    assert "default pruning order and compensation" in src["C11"]


def test_quick_experiments_say_so():
    quick = {k: (lambda _, v=v: v) for k, v in example_experiments("quick").items()}
    r = example_report(overrides=quick)
    src = {c["id"]: c["source"] for c in r["claims"]}
    for cid, name in (("C1", "multi-relation"), ("C3", "write-address"), ("C8", "heads-sweep"), ("C9", "low-rank")):
        assert f"--quick run" in src[cid] and f"headcount experiment {name} --quick" in src[cid], src[cid]
        assert "benchmarks/results" not in src[cid]


def _set(path: str, value):
    """An override that sets result[k1][k2]... = value (integer keys index lists)."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]

    def change(result):
        obj = result
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value(obj[keys[-1]]) if callable(value) else value
        return result
    return change


# (claim, result name, change, the status it must get): each breaks exactly one claim of the example
BROKEN = [
    ("C1", "experiment-multi-relation", _set("result.results.1.accuracy", 0.6), "did not hold"),
    ("C1", "experiment-multi-relation", _set("result.results.0.accuracy", 0.9), "partly"),
    ("C2", "checks", _set("c2.relative_diff", 1e-3), "did not hold"),
    ("C3", "experiment-write-address", _set("result.results.1.loss", 2.38), "partly"),
    ("C4", "checks", _set("c4.model.measured", lambda v: v + 1), "did not hold"),
    ("C5", "checks", _set("c5.rows.0.measured", 0), "did not hold"),  # a counter that misses the fused kernel
    ("C6", "checks", _set("c6.measured.1.peak_bytes", lambda v: 2 * v), "did not hold"),
    ("C6", "checks", _set("c6.measured", []), "partly"),
    ("C8", "experiment-heads-sweep", _set("result.results.2.ppl_mean", 12.0), "did not hold"),
    ("C8", "experiment-heads-sweep", _set("result.results.0.ppl_mean", 10.4), "partly"),
    ("C9", "experiment-low-rank", _set("result.results.3.error", 0.05), "partly"),
    ("C10", "checks", _set("c10.presets.2.n_heads", 8), "did not hold"),
    ("C11", "prune_command", _set("ppl_after", 18.5), "did not hold"),
    ("C12", "gates", _set("ppl_after", 13.0), "did not hold"),
    ("C12", "gates", _set("reached", False), "did not hold"),
    ("C12", "gates", _set("heads_removed", 2), "did not hold"),
    ("C14", "checks", _set("c14.measured", lambda v: v * 2), "did not hold"),
]


@pytest.mark.parametrize("cid,name,change,status", BROKEN,
                         ids=[f"{c}-{s.replace(' ', '-')}-{i}" for i, (c, _, _, s) in enumerate(BROKEN)])
def test_a_claim_that_fails_is_reported_as_failed_with_its_number(cid, name, change, status):
    r = example_report(overrides={name: change})
    by = {c["id"]: c for c in r["claims"]}
    assert by[cid]["status"] == status, by[cid]["finding"]
    assert by[cid]["number"] is not None or cid == "C6"  # C6 without measurements has only the formula
    assert [c["id"] for c in r["claims"] if c["status"] != "held"] == [cid]  # the others still hold
    lines = summary_lines(r)
    mark = "NOT held" if status == "did not hold" else status
    assert lines[2].startswith("chapter claims held: 14 of 15 (15 measured: ") and f"{cid} {mark}," in lines[2] + ","


def test_c11_decides_on_the_default_point_not_the_curve():
    r = example_report()
    # the curve's best lstsq point is fine, but prune_to's defaults at 20% lost 30%: C11 did not hold, number +30%
    broken = dict(r["pruning"], default=dict(r["pruning"]["default"], ppl=13.0))
    c = c11_pruning(broken)
    assert c["status"] == "did not hold" and abs(c["number"] - 0.3) < 1e-9 and "+30.0%" in c["finding"]
    assert "prune_to(model, 0.2) with its defaults: order reconstruction" in c["finding"]


def test_missing_sources_are_not_measured_not_held():
    r = example_report(missing=("checks", "gates", "experiment-multi-relation", "experiment-write-address",
                                "experiment-heads-sweep", "experiment-low-rank"))
    by = {c["id"]: c for c in r["claims"]}
    for cid in ("C1", "C2", "C3", "C4", "C5", "C6", "C8", "C10", "C12", "C14"):
        assert by[cid]["status"] == "not measured" and by[cid]["source"] == "not available in this report", cid
    assert by["C9"]["status"] == "held" and "low-rank" not in by["C9"]["source"]  # the model's ranks alone
    assert summary_lines(r)[2].startswith("chapter claims held: 5 of 15 (5 measured: C1 n/a, C2 n/a")
    assert normalise(read_claims(r)) == r["claims"]  # claims are read from report.json alone


def test_c8_with_one_seed_uses_a_relative_floor():
    from headcount.report.claims import c8_heads_sweep
    rows = [{"n_heads": h, "head_dim": 64 // h, "ppl_mean": p, "ppl_std": 0.0} for h, p in ((1, 16.0), (4, 14.65),
                                                                                            (32, 14.60))]
    c = c8_heads_sweep({"source": "quick", "command": "headcount experiment heads-sweep --quick", "seeds": 1,
                        "result": {"results": rows}})
    assert c["status"] == "partly" and "extremes that lose: 1;" in c["finding"]  # 4 heads is within 1% of 32
    rows[1]["ppl_mean"] = 15.0  # now 2.7% off the best: the optimum is not broad
    assert c8_heads_sweep({"source": "quick", "result": {"results": rows}})["status"] == "did not hold"
