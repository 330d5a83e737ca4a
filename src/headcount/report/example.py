"""A synthetic report.json with hand-built attention patterns: to test the page and preview it without
a model or an analysis (`python -m headcount.report.example DIR` writes it).

    example_report(n_layers=4, n_heads=4, *, missing=()) -> dict   (collect.assemble's output)

Head 0 of every layer attends to the previous token, head 1 to the first token (a sink), head 2
uniformly, head 3 to the token after the previous copy of the current one (induction); the role
scores, faithfulness, rank, importance, pruning and K/V-merge sections are made-up but well-formed.
"""

from __future__ import annotations

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


def example_report(n_layers: int = 4, n_heads: int = 4, *, missing: tuple[str, ...] = ()) -> dict:
    from headcount.cost import ModelShape
    from headcount.report.accounts import accounts, shape_json
    from headcount.report.collect import assemble

    shape = ModelShape(d_model=32 * n_heads, n_heads=n_heads, n_kv_heads=max(1, n_heads // 2), n_layers=n_layers,
                       vocab_size=1000, d_ff=128 * n_heads, mlp="gated", norm="rmsnorm", final_norm=True,
                       position="rotary", name="example")
    n = len(TOKENS)
    sample = {"sentence": " ".join(TOKENS), "tokens": TOKENS, "scale": 1000,
              "layers": [[_pattern((h + l) % 4, n) for h in range(n_heads)] for l in range(n_layers)]}
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
    pruning = {"model": "example", "base_ppl": 10.0,
               "points": [{"fraction": f, "order": "gradient", "compensate": c, "mode": "query",
                           "heads_removed": round(f * n_layers * n_heads), "ppl": round(10.0 * (1 + f * f * k), 3)}
                          for f in (0.1, 0.2, 0.3, 0.4, 0.5) for c, k in (("none", 2.0), ("lstsq", 0.4))]}
    merge = {"heads_before": shape.n_kv_heads, "heads_after": 1, "params_before": 100000, "params_after": 96000,
             "kv_bytes_per_token_before": 2 * n_layers * shape.n_kv_heads * 32 * 4,
             "kv_bytes_per_token_after": 2 * n_layers * 32 * 4, "ppl_before": 10.0, "ppl_after": 11.5,
             "method": "aware"}
    results = {"shape": {"shape": shape_json(shape), "accounts": accounts(shape)}, "sample": sample, "roles": roles,
               "faithfulness": faith, "rank": rank, "importance": importance, "pruning": pruning, "kv_merge": merge}
    for key in missing:
        results.pop(key, None)
    return assemble(model_name="example", kind="decoder", results=results,
                    unavailable={k: "left out of this example" for k in missing},
                    params={"seed": 0, "quick": True, "text": "synthetic"})


if __name__ == "__main__":  # python -m headcount.report.example DIR
    from headcount.report.build import write_report

    print(write_report(example_report(), sys.argv[1] if len(sys.argv) > 1 else "out/report-example", force=True))
