"""The rank function of test_families_moe.py's tensor-parallel check, in a module of its own so that the
spawned ranks import torch and headcount only (not transformers, which the test module needs)."""

import torch


def tp_worker(payloads: dict, inputs, prompt: int) -> dict:
    from headcount.models import generate
    from headcount.parallel import tensor_parallel
    from headcount.parallel.transfer import rebuild

    ids, mask = inputs
    out = {}
    for family, payload in payloads.items():
        model = tensor_parallel(rebuild(payload))
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
        tokens = generate(model, ids[0, :prompt].tolist(), 8, stop_at_eos=False).new_ids
        out[family] = {"logits": logits[mask.bool()].tolist(), "tokens": tokens,
                       "sinks": [layer.attn.sinks.shape[0] if layer.attn.sinks is not None else 0
                                 for layer in model.layers]}
    return out
