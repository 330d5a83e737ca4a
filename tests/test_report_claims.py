"""The plain-English reading (claims.py) and the five-line summary, on hand-built sections whose
answers are known."""

from headcount.cost import ModelShape, kv_cache
from headcount.report.accounts import _variants, accounts
from headcount.report.charts import strongest_roles
from headcount.report.claims import c7_roles, c9_rank, c11_pruning, c13_faithfulness, c15_gqa
from headcount.report.example import example_report
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


def test_c11_largest_fraction_within_ten_percent():
    pts = [{"fraction": f, "order": "gradient", "compensate": "none", "mode": "query", "heads_removed": 1, "ppl": p}
           for f, p in ((0.1, 10.2), (0.2, 10.9), (0.3, 11.5))]
    c = c11_pruning({"base_ppl": 10.0, "points": pts})
    assert (c["status"], c["number"]) == ("held", 0.2)
    c = c11_pruning({"base_ppl": 10.0, "points": pts[:1] + [dict(pts[1], ppl=11.2)]})
    assert (c["status"], c["number"]) == ("did not hold", 0.1)
    enc = c11_pruning({"base_ppl": None, "points": [dict(pts[1], ppl=None, cosine=0.97)]})
    assert enc["status"] == "held" and "cosine 0.970" in enc["finding"]


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
    c = c15_gqa(acc, {"heads_before": 3, "heads_after": 1, "ppl_before": 10.0, "ppl_after": 12.0})
    assert c["status"] == "held" and abs(c["number"] - 0.2) < 1e-12 and "(33%)" in c["finding"]
    assert c15_gqa(acc, None)["status"] == "partly"


def test_summary_is_five_lines_with_the_counts():
    lines = summary_lines(example_report())
    assert len(lines) == 5
    assert lines[0].startswith("heads per role: previous-token 4, duplicate-token 0, induction 4")
    assert lines[1].startswith("top heads: ")
    assert lines[2] == "chapter claims held: 5 of 5 measured (C7 held, C9 held, C11 held, C13 held, C15 held)"
    assert lines[4] == "every section present"
    gone = summary_lines(example_report(missing=("roles",)))
    assert gone[0] == "heads per role: not available" and gone[4] == "not available: roles"
