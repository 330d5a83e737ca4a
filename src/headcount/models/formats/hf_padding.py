"""Zero heads for transformers checkpoints that cannot hold a pruned layer's head count (export_transformers).

Where a transformers class ties the head count to another field, a pruned layer is written with the count the
class wants and its removed heads as ZERO heads, as gpt_neox's and BERT's writers already do and as the Gemma 3
GGUF export does for llama.cpp:
- a query slot left empty gets zero W_Q rows (and bias) and zero o_proj columns: whatever it attends to, o_proj
  multiplies its context by 0, so the layer's output is exactly the pruned one's (a per-head sink of an empty
  slot is written as 0: it only enters that slot's own softmax);
- a KV slot left empty gets zero W_K / W_V rows, and every query slot of its group is empty.
Query head i of the pruned layer goes to a free slot of the group of its KV head (kv_head_of[i]), so the
exported layer has the even groups transformers' repeat_kv reads (slot s reads KV slot s // (n_q / n_kv)),
whatever the pruning left: per-layer counts and uneven groups alike. The file keeps the unpruned size.

Used for Phi-3 with LongRoPE (Phi3Config checks short_factor / long_factor against
hidden_size // num_attention_heads, so num_attention_heads must stay hidden_size // head_dim). Not for
full-width q/k norms (OLMo 2, OLMoE): their RMS runs over every head, zero heads included, so a zero head
changes the kept heads' normalisation. Rescaling the kept norm weights by sqrt(kept / n) leaves the pruned model
with the norm's eps x n / kept instead: measured 1.7e-4 max |logits diff| on a group-pruned random OLMoE,
over the 1e-4 an export is held to, so a pruned OLMoE is refused (docs/models.md).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def padded_slots(kv_head_of, n_q: int, n_kv: int) -> list[int]:
    """The exported query slot of each pruned query head: the free slots of its KV head's group in order.
    ValueError when a group holds more query heads than n_q / n_kv (a K/V merge: no zero head fixes that)."""
    group = n_q // n_kv
    used = [0] * n_kv
    slots = []
    for i, g in enumerate(kv_head_of):
        if g >= n_kv or used[g] >= group:
            raise ValueError(f"model: KV head {g} is read by {sum(1 for x in kv_head_of if x == g)} query heads; "
                             f"the exported layout has {n_kv} KV heads of {group} query heads each")
        slots.append(g * group + used[g])
        used[g] += 1
    return slots


def pad_attention(attn, n_q: int, n_kv: int) -> dict[str, Tensor | None]:
    """The layer's attention tensors with n_q query and n_kv KV heads, the removed ones as zero heads:
    {"qkv": [(n_q + 2 n_kv) hd, d], "qkv_bias": ... or None, "o": [d, n_q hd], "sinks": [n_q] or None}."""
    nh, nkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    slots = torch.tensor(padded_slots(attn.kv_head_of, n_q, n_kv))
    w = attn.qkv_proj.weight.detach()
    d = w.shape[1]

    def spread(t: Tensor) -> Tensor:  # [nh hd | nkv hd | nkv hd, ...] -> the padded layout
        q, k, v = t.split([nh * hd, nkv * hd, nkv * hd])
        rest = t.shape[1:]
        pq = t.new_zeros((n_q, hd) + rest)
        pq[slots] = q.reshape((nh, hd) + rest)
        pk, pv = t.new_zeros((n_kv, hd) + rest), t.new_zeros((n_kv, hd) + rest)
        pk[:nkv], pv[:nkv] = k.reshape((nkv, hd) + rest), v.reshape((nkv, hd) + rest)
        return torch.cat([pq.flatten(0, 1), pk.flatten(0, 1), pv.flatten(0, 1)])

    b = attn.qkv_proj.bias
    o = w.new_zeros(d, n_q, hd)
    o[:, slots] = attn.o_proj.weight.detach().view(d, nh, hd)
    sinks = getattr(attn, "sinks", None)
    padded_sinks = None
    if sinks is not None:
        padded_sinks = sinks.detach().new_zeros(n_q)
        padded_sinks[slots] = sinks.detach()
    return {"qkv": spread(w), "qkv_bias": None if b is None else spread(b.detach()),
            "o": o.reshape(d, n_q * hd), "sinks": padded_sinks}


def write_padded(sd: dict, prefix: str, attn, n_q: int, n_kv: int, *, fused: bool, bias: bool) -> None:
    """Replace one layer's attention tensors in a transformers state dict (`prefix` = "model.layers.{i}.self_attn.")
    by the padded ones: fused = Phi-3's qkv_proj, else q_proj / k_proj / v_proj (with biases when `bias`).
    Per-head q/k norms need nothing (a zero head's normalised q is 0); full-width ones are refused by the caller."""
    if getattr(attn.q_norm, "keep", None) is not None:
        raise ValueError("model: full-width q/k norms run over every head, zero heads included; a zero head would "
                         "change the kept heads' normalisation")
    hd = attn.head_dim
    padded = pad_attention(attn, n_q, n_kv)
    w = padded["qkv"]
    if fused:
        sd[prefix + "qkv_proj.weight"] = w
    else:
        sd[prefix + "q_proj.weight"], sd[prefix + "k_proj.weight"], sd[prefix + "v_proj.weight"] = \
            w.split([n_q * hd, n_kv * hd, n_kv * hd])
    if bias:
        b = padded["qkv_bias"] if padded["qkv_bias"] is not None else w.new_zeros(w.shape[0])
        sd[prefix + "q_proj.bias"], sd[prefix + "k_proj.bias"], sd[prefix + "v_proj.bias"] = \
            b.split([n_q * hd, n_kv * hd, n_kv * hd])
    sd[prefix + "o_proj.weight"] = padded["o"]
    if padded["sinks"] is not None:
        sd[prefix + "sinks"] = padded["sinks"]
