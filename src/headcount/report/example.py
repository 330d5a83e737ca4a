"""A synthetic report.json with hand-built attention patterns: to test the page and preview it without
a model or an analysis (`python -m headcount.report.example DIR` writes it).

    example_report(n_layers=4, n_heads=4, *, missing=()) -> dict   (collect.assemble's output)

Head 0 of every layer attends to the previous token, head 1 to the first token (a sink), head 2
uniformly, head 3 to the token after the previous copy of the current one (induction); the role
scores, faithfulness, rank, importance, pruning, K/V-merge, gates, experiments and chapter-check sections are
made-up but well-formed, and every one of the fifteen claims holds on them (tests break one at a time).
"""

from __future__ import annotations

import copy
import sys

TOKENS = ["The", "cat", "sat", "on", "the", "mat", ".", "The", "cat", "sat", "on", "the", "mat", "."]


def _pattern(kind: int, n: int) -> list[list[int]]:
    rows = []
    for q in range(n):
        row = [0] * n
        if kind == 0:
            row[max(q - 1, 0)] = 1000
        elif kind == 1:
            row[0] = 1000
        elif kind == 2:
            for k in range(q + 1):
                row[k] = round(1000 / (q + 1))
        else:
            period = 7
            target = q - period + 1 if q >= period else 0
            row[target] = 1000
        rows.append(row)
    return rows


def _roles(n_layers: int, n_heads: int) -> dict:
    """Role scores: a strong head per labelled role in every layer, the rest low."""
    kinds = {"previous_token": 0, "sink": 1, "induction": 3, "duplicate_token": None, "positional": 0,
             "syntactic": None, "rare_word": None}
    thresholds = {"previous_token": 0.5, "duplicate_token": 0.5, "induction": 0.4, "positional": 0.9,
                  "syntactic": 0.1, "rare_word": 0.5, "sink": 0.6}
    roles = {}
    for role, kind in kinds.items():
        scores = [[round(0.05 + 0.02 * l + 0.01 * h, 4) for h in range(n_heads)] for l in range(n_layers)]
        if kind is not None:
            for l in range(n_layers):
                scores[l][kind] = round(0.95 - 0.03 * l, 4)
        heads = [[l, h] for l in range(n_layers) for h in range(n_heads) if scores[l][h] >= thresholds[role]]
        if role == "positional":
            heads = [[l, h, -1] for l, h in heads]
        heads.sort(key=lambda e: -scores[e[0]][e[1]])
        roles[role] = {"scores": scores, "threshold": thresholds[role], "heads": heads}
    return roles


def _analyses(shape, n_layers: int, n_heads: int) -> dict:
    """The read-only analyses: the sample's attention, roles, faithfulness, rank, importance."""
    n = len(TOKENS)
    sample = {"sentence": " ".join(TOKENS), "tokens": TOKENS, "scale": 1000,
              "layers": [[_pattern((h + l) % 4, n) for h in range(n_heads)] for l in range(n_layers)]}
    faith = {"epsilon": 0.01, "layers": [0, n_layers - 1], "n_examples": 4,
             "heads": [{"layer": l, "head": h, "tau_gradient": round(0.1 * ((h + l) % 5) - 0.1, 3),
                        "tau_loo": round(0.05 * h, 3), "tau_uniform": 0.0, "jsd": round(0.2 + 0.1 * h, 3),
                        "tv": 0.0098} for l in (0, n_layers - 1) for h in range(n_heads)],
             "summary": {}}
    bound = shape.head_dim
    rank = {"tolerance": "1e-5 x largest singular value", "lengths": [16, 32, 64, 128],
            "heads": [{"layer": l, "head": h, "length": L, "rank": min(L, bound) - (h % 2), "bound": min(L, bound)}
                      for l in range(n_layers) for h in range(n_heads) for L in (16, 32, 64, 128)],
            "summary": [{"length": L, "bound": min(L, bound), "mean_rank": min(L, bound) - 0.5,
                         "min_rank": min(L, bound) - 1, "max_rank": min(L, bound), "share_at_bound": 0.5}
                        for L in (16, 32, 64, 128)]}
    importance = {"method": "gradient", "scores": [[round(1.0 / (1 + l + h), 4) for h in range(n_heads)]
                                                   for l in range(n_layers)]}
    return {"sample": sample, "roles": _roles(n_layers, n_heads), "faithfulness": faith, "rank": rank,
            "importance": importance}


def _pruning(n_layers: int, n_heads: int) -> dict:
    """The curve (two compensations) with prune_to's default as the starred point, on the three domains."""
    pruning = {"model": "example", "base_ppl": 10.0,
               "points": [{"fraction": f, "order": "gradient", "compensate": c, "mode": "query",
                           "heads_removed": round(f * n_layers * n_heads), "ppl": round(10.0 * (1 + f * f * k), 3)}
                          for f in (0.1, 0.2, 0.3, 0.4, 0.5) for c, k in (("none", 2.0), ("lstsq", 0.4))]}
    pruning["default"] = {"fraction": 0.2, "order": "reconstruction", "compensate": "lstsq", "mode": "query",
                          "heads_removed": round(0.2 * n_layers * n_heads), "heads_before": n_layers * n_heads,
                          "via": "prune_to", "ppl": 10.3}
    pruning["points"].append(dict(pruning["default"]))
    sizes = {"prose": [4, 256], "code": [2, 128], "source": [2, 128]}  # the three held-out domains
    base = {"prose": 10.0, "code": 20.0, "source": 6.0}
    return pruning | {"ppl_by_domain_before": base, "ppl_by_domain_after": {"prose": 10.3, "code": 21.0, "source": 6.6},
                      "domain_sizes": sizes}


COMMAND_SIZES = {"prose": [4, 512], "code": [4, 512], "source": [4, 512]}  # the commands' held-out windows
COMMAND_BASE = {"prose": 16.5, "code": 24.4, "source": 9.1}
SHA = "0" * 64


def _commands(shape, n_layers: int, n_heads: int) -> dict:
    """What the commands give (saved results): the prune (C11), the K/V merge (C15) and the healed prune."""
    merge = {"heads_before": n_layers * shape.n_kv_heads, "heads_after": n_layers, "params_before": 100000,
             "params_after": 96000, "kv_bytes_per_token_before": 2 * n_layers * shape.n_kv_heads * 32 * 4,
             "kv_bytes_per_token_after": 2 * n_layers * 32 * 4, "ppl_before": 16.5, "ppl_after": 26.6,
             "method": "aware", "ppl_by_domain_before": COMMAND_BASE,
             "ppl_by_domain_after": {"prose": 26.6, "code": 45.8, "source": 25.0}, "domain_sizes": COMMAND_SIZES,
             "source": "saved", "command": "headcount merge-kv --model example --kv-heads 1 --json",
             "path": "benchmarks/results/commands/example-merge-kv-1.json", "weights_sha256": SHA, "kv_heads": 1,
             "options": {"local_steps": 60, "n_windows": 16}, "uptrain": {"steps": 20, "lr": 0.0003}}
    removed = round(0.2 * n_layers * n_heads)
    prune_command = {"source": "saved", "command": "headcount prune --model example --fraction 0.2 --out DIR --json",
                     "path": "benchmarks/results/commands/example-prune-0.2.json", "weights_sha256": SHA,
                     "fraction": 0.2, "order": "reconstruction", "compensate": "lstsq", "mode": "query",
                     "heads_before": n_layers * n_heads, "heads_after": n_layers * n_heads - removed,
                     "heads_removed": removed, "ppl_before": 16.5, "ppl_after": 17.4,
                     "ppl_by_domain_before": COMMAND_BASE,
                     "ppl_by_domain_after": {"prose": 17.4, "code": 26.8, "source": 10.5},
                     "domain_sizes": COMMAND_SIZES, "command_seconds": 120.0}
    healing = {"source": "saved",
               "command": "headcount prune --model example --fraction 0.5 --heal-steps 200 --out DIR --json",
               "path": "benchmarks/results/commands/example-prune-0.5-heal-200.json", "weights_sha256": SHA,
               "fraction": 0.5, "heads_before": n_layers * n_heads, "heads_after": n_layers * n_heads // 2,
               "held_out": {"before_edit": COMMAND_BASE, "after_edit": {"prose": 23.2, "code": 35.4, "source": 17.2},
                            "after_heal": {"prose": 19.3, "code": 28.2, "source": 13.5}},
               "domain_sizes": COMMAND_SIZES, "steps": 200, "planned_steps": 200, "tokens": 95744,
               "tokens_seen": 102400, "params": "attention", "lr": 0.0003, "trainable_params": 13400000,
               "heal_seconds": 429.0, "command_seconds": 490.0, "val_kl_first": 0.477, "val_kl_best": 0.282,
               "best_step": 200, "stopped_early": False}
    return {"kv_merge": merge, "prune_command": prune_command, "healing": healing}


def _gates(n_layers: int, n_heads: int) -> dict:
    return {"source": "run", "fraction": 0.5, "steps": 40, "heads_before": n_layers * n_heads,
            "heads_removed": n_layers * n_heads // 2, "reached": True, "n_closed": n_layers * n_heads // 2,
            "n_gates": n_layers * n_heads, "n_removed_ranked": 0, "compensate": "lstsq", "mode": "query",
            "objective": "KL of next-token distributions", "ppl_before": 10.0, "ppl_after": 11.2}


def example_report(n_layers: int = 4, n_heads: int = 4, *, missing: tuple[str, ...] = (),
                   overrides: dict | None = None) -> dict:
    """collect.assemble's output for a synthetic model. missing: results left out (their sections become
    `unavailable`); overrides: {result name: a function of that result returning the one to use} (tests break
    one claim at a time this way)."""
    from headcount.cost import ModelShape
    from headcount.report.accounts import accounts, shape_json
    from headcount.report.collect import assemble

    shape = ModelShape(d_model=32 * n_heads, n_heads=n_heads, n_kv_heads=max(1, n_heads // 2), n_layers=n_layers,
                       vocab_size=1000, d_ff=128 * n_heads, mlp="gated", norm="rmsnorm", final_norm=True,
                       position="rotary", name="example")
    results = {"shape": {"shape": shape_json(shape), "accounts": accounts(shape)},
               **_analyses(shape, n_layers, n_heads),
               "pruning": _pruning(n_layers, n_heads), **_commands(shape, n_layers, n_heads),
               "gates": _gates(n_layers, n_heads), "checks": example_checks(shape), **example_experiments()}
    for key, change in (overrides or {}).items():
        results[key] = change(copy.deepcopy(results.get(key)))
    for key in missing:
        results.pop(key, None)
    return assemble(model_name="example", kind="decoder", results=results,
                    unavailable={k: "left out of this example" for k in missing},
                    params={"seed": 0, "quick": True, "text": "synthetic"})


def example_checks(shape) -> dict:
    """The chapter checks (report.checks) as a model that passes them would give them: measured = formula."""
    from headcount.cost import ModelShape, attention_flops, attention_params, get_preset, kv_cache, score_memory

    d, seq = shape.d_model, 64
    mha = [{"n_heads": h, "head_dim": d // h, "measured": 4 * d * d,
            "formula": attention_params(ModelShape(d_model=d, n_heads=h))["total"]} for h in (1, 2, 4) if d % h == 0]
    own = attention_params(shape.replace(n_layers=1))["total"]
    flops = [{"label": f"MHA, {h} heads", "n_heads": h, "head_dim": d // h, "measured": 4 * seq * seq * d,
              "formula": 4 * seq * seq * d, "formula_causal": 2 * seq * seq * d} for h in (1, 2, 4)]
    f = attention_flops(shape.replace(n_layers=1), 1, seq)
    flops.append({"label": "this model", "n_heads": shape.n_heads, "head_dim": shape.head_dim,
                  "measured": f["scores"] + f["read"], "formula": f["scores"] + f["read"],
                  "formula_causal": (f["scores"] + f["read"]) // 2})
    chapter = []
    for h, gib in ((8, 0.25), (32, 1.0), (128, 4.0)):
        b = score_memory(ModelShape(d_model=4096, n_heads=h), 1, 4096, 2)["eager_per_layer"]
        chapter.append({"n_heads": h, "bytes": b, "gib": b / 1024**3, "chapter_gib": gib})
    measured = []
    for h in (2, 8):
        formula = score_memory(ModelShape(d_model=8 * h, n_heads=h, head_dim=8), 1, 1024, 4)["eager_peak_per_layer"]
        measured.append({"n_heads": h, "seq": 1024, "head_dim": 8, "peak_bytes": int(formula * 1.02),
                         "formula": formula, "method": "VmHWM - VmRSS"})
    presets = [{"preset": k, "d_model": get_preset(k).shape.d_model, "n_heads": get_preset(k).shape.n_heads,
                "head_dim": get_preset(k).shape.head_dim, "n_kv_heads": get_preset(k).shape.n_kv_heads,
                "chapter_n_heads": n} for k, n in (("gpt3-small", 12), ("gpt3-175b", 96), ("llama-3-8b", 32))]
    kv = kv_cache(shape, 1, 1, 2)["bytes_per_token"]
    return {
        "c2": {"layer": 0, "tokens": 14, "causal": True, "dtype": "float64", "n_heads": shape.n_heads,
               "n_kv_heads": shape.n_kv_heads, "head_dim": shape.head_dim, "max_abs_diff": 2.2e-16,
               "max_abs_output": 1.5, "relative_diff": 1.5e-16, "view_moves_no_data": True,
               "transposed_q_contiguous": False, "rotary": "left out, a hook the chapter's formula does not have"},
        "c3_geometry": {"n_layers": shape.n_layers, "d_model": d, "n_heads": shape.n_heads, "head_dim": shape.head_dim,
                        "own_slice_energy": 0.3, "reach": 0.7, "mean_overlap": 0.2, "slice_share": 1 / shape.n_heads,
                        "mean_pairwise_angle_deg": 70.0, "min_pairwise_angle_deg": 5.0, "random_overlap": 0.25},
        "c4": {"d_model": d, "four_d2": 4 * d * d, "mha": mha,
               "model": {"measured": own, "formula": own, "n_heads": shape.n_heads, "n_kv_heads": shape.n_kv_heads,
                         "head_dim": shape.head_dim}},
        "c5": {"seq": seq, "d_model": d, "four_n2_d": 4 * seq * seq * d, "two_n2_d": 2 * seq * seq * d, "rows": flops,
               "counter": "FlopCounterMode, eager path"},
        "c6": {"d_model": 4096, "seq": 4096, "dtype": "fp16", "chapter": chapter, "measured": measured,
               "tolerance": 0.1},
        "c10": {"presets": presets, "decoupled": {"preset": "gemma-3-270m", "d_model": 640, "n_heads": 4, "head_dim": 256},
                "model": {"d_model": d, "n_heads": shape.n_heads, "n_kv_heads": shape.n_kv_heads,
                          "head_dim": shape.head_dim}},
        "c14": {"dtype": "bf16", "bytes": 2, "measured": kv, "formula": kv, "n_layers": shape.n_layers,
                "n_kv_heads": shape.n_kv_heads, "head_dim": shape.head_dim,
                "by_hand": 2 * shape.n_kv_heads * shape.head_dim * shape.n_layers * 2, "uniform": True},
    }


def example_experiments(source: str = "saved") -> dict:
    """The four trained-from-scratch experiments as collect's steps return them (made-up, claims holding)."""
    def section(name, results, config, details=None):
        return {"source": source, "path": f"benchmarks/results/{name}.json" if source == "saved" else None,
                "command": f"headcount experiment {name}" + ("" if source == "saved" else " --quick"),
                "seeds": config.get("seeds", config.get("targets")), "steps": config.get("steps"),
                "result": {"experiment": name, "claim": "", "quick": source != "saved", "config": config,
                           "results": results, "details": details or {}, "notes": []}}

    return {
        "experiment-multi-relation": section("multi-relation", [
            {"n_heads": 1, "head_dim": 32, "accuracy": 0.42, "accuracy_std": 0.05, "accuracy_seeds": [0.4, 0.44],
             "attention_params": 4096},
            {"n_heads": 2, "head_dim": 16, "accuracy": 1.0, "accuracy_std": 0.0, "accuracy_seeds": [1.0, 1.0],
             "attention_params": 4096}], {"seeds": 2, "steps": 400},
            {"one_head": {"mass_on_marked": [0.45, 0.44], "distance_to_average": 0.2}}),
        "experiment-write-address": section("write-address", [
            {"variant": "o_proj (trained)", "loss": 2.37, "loss_std": 0.03},
            {"variant": "no o_proj (identity, frozen)", "loss": 2.50, "loss_std": 0.03}], {"seeds": 3, "steps": 400}),
        "experiment-heads-sweep": section("heads-sweep", [
            {"n_heads": h, "head_dim": 64 // h, "ppl_mean": p, "ppl_std": 0.05}
            for h, p in ((1, 11.0), (2, 10.5), (4, 10.4), (8, 10.45), (32, 11.2))], {"seeds": 3, "steps": 400}),
        "experiment-low-rank": section("low-rank", [
            {"head_dim": hd, "n": 16, "error": e, "n_heads": 1, "setting": "one head"}
            for hd, e in ((2, 0.33), (4, 0.13), (8, 0.024), (16, 1e-6))] + [
            {"head_dim": 8, "n": 16, "error": 0.027, "n_heads": 8, "setting": "n_heads=8, head_dim = d_model / n_heads"},
            {"head_dim": 16, "n": 16, "error": 8e-7, "n_heads": 8, "setting": "n_heads=8, head_dim = n (decoupled)"}],
            {"n": 16, "targets": 3, "steps": 2000}),
    }


if __name__ == "__main__":  # python -m headcount.report.example DIR
    from headcount.report.build import write_report

    print(write_report(example_report(), sys.argv[1] if len(sys.argv) > 1 else "out/report-example", force=True))
