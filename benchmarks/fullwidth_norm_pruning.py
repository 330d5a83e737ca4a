"""What structural head removal costs when q/k norms run over the whole projection (OLMo 2), against the
same heads gated to 0 (which keeps every head in the norm's statistics), on a random small model of each
family from headcount.models.exactness (no download). qwen3 (per-head norms) is the control: there gating
and removal are the same computation.

    python benchmarks/fullwidth_norm_pruning.py          # prints JSON

Per family and removal plan: mean KL(gated || pruned) over next-token distributions of 4 x 64 random
tokens and max |logits diff| (with compensate="none": the error of removing rather than gating), and, for
scale, mean KL(unpruned || gated) (what removing the heads costs at all) and KL(unpruned || pruned) (with
"lstsq", the default compensated prune, o_proj refit on 4 x 64 calibration tokens: whether compensation
still pulls the pruned model back toward the unpruned one)."""

import json
import os
import warnings

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _kl(p_logits, q_logits) -> float:
    p = torch.log_softmax(p_logits.double(), -1)
    q = torch.log_softmax(q_logits.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def measure(family: str, plan: dict[int, list[int]], compensate: str) -> dict:
    from headcount.models import exactness, from_transformers
    from headcount.surgery import prune

    hf = exactness.random_transformers_model(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_transformers(hf)
    n_layers, n_heads = len(model.layers), model.layers[0].attn.n_heads
    gates = torch.ones(n_layers, n_heads)
    for layer, heads in plan.items():
        gates[layer, heads] = 0.0
    ids = torch.randint(3, 509, (4, 64), generator=torch.Generator().manual_seed(0))
    cal = torch.randint(3, 509, (4, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits
        gated = model(ids, head_gates=gates).logits
    prune(model, plan, compensate=compensate, calibration=cal, progress=False)
    with torch.no_grad():
        pruned = model(ids).logits
    return {"family": family, "compensate": compensate, "removed": sum(len(h) for h in plan.values()),
            "kl_gated_vs_pruned": _kl(gated, pruned), "max_abs_logit_diff": float((gated - pruned).abs().max()),
            "kl_unpruned_vs_gated": _kl(full, gated), "kl_unpruned_vs_pruned": _kl(full, pruned),
            "logit_scale": float(full.abs().max())}


def main() -> None:
    one_query_head = {i: [1] for i in range(6)}  # K/V heads all stay (groups of 2): only q_norm's statistics move
    whole_group = {i: [0, 1] for i in range(6)}  # KV head 0 goes too: k_norm's statistics move as well
    rows = []
    for family in ("olmo2", "qwen3"):
        for name, plan in (("one query head per layer", one_query_head), ("one GQA group per layer", whole_group)):
            for compensate in ("none", "lstsq"):
                rows.append({"plan": name, **measure(family, plan, compensate)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
