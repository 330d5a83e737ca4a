"""Conversion to and from torch.nn.MultiheadAttention.

torch's in_proj_weight is [3 E, E] with rows [Q | K | V], head h at rows h*dh:(h+1)*dh of each
block: exactly headcount's fused layout for n_kv_heads == n_heads, so weights copy unchanged.
Masks do NOT: torch's bool masks mean True = blocked; use headcount.masks.from_torch_mask.
"""

from __future__ import annotations

import torch
from torch import nn


def from_torch(cls, module: nn.MultiheadAttention):
    if not isinstance(module, nn.MultiheadAttention):
        raise TypeError(f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}")
    if not module._qkv_same_embed_dim:
        raise ValueError(f"module: expected kdim == vdim == embed_dim={module.embed_dim}, got kdim={module.kdim}, "
                         f"vdim={module.vdim} (separate K/V input widths are not supported)")
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError("module: add_bias_kv=True / add_zero_attn=True append extra key positions; "
                         "headcount.MultiHeadAttention does not model them")
    has_bias = module.in_proj_bias is not None
    ref = module.in_proj_weight
    attn = cls(module.embed_dim, module.num_heads, bias=has_bias, o_bias=module.out_proj.bias is not None,
               dropout=module.dropout, device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        attn.qkv_proj.weight.copy_(module.in_proj_weight)
        attn.o_proj.weight.copy_(module.out_proj.weight)
        if has_bias:
            attn.qkv_proj.bias.copy_(module.in_proj_bias)
        if module.out_proj.bias is not None:
            attn.o_proj.bias.copy_(module.out_proj.bias)
    attn.train(module.training)
    return attn


def to_torch(attn) -> nn.MultiheadAttention:
    if attn.n_kv_heads != attn.n_heads or not attn.is_uniform:
        raise ValueError(f"n_kv_heads: torch.nn.MultiheadAttention has no GQA/MQA; expected n_kv_heads == "
                         f"n_heads={attn.n_heads}, got {attn.n_kv_heads}")
    if attn.q_norm is not None:
        raise ValueError("qk_norm_eps: torch.nn.MultiheadAttention has no per-head q/k norm; expected a module "
                         f"without one, got qk_norm_eps={attn.q_norm.eps:g}")
    if attn.sliding_window is not None:
        raise ValueError("sliding_window: torch.nn.MultiheadAttention has no sliding window; expected None, got "
                         f"{attn.sliding_window} (pass the window as attn_mask instead)")
    if attn.n_heads * attn.head_dim != attn.d_model:
        raise ValueError(f"head_dim: torch.nn.MultiheadAttention needs n_heads * head_dim == d_model={attn.d_model}, "
                         f"got {attn.n_heads} x {attn.head_dim}")
    if abs(attn.softmax_scale * attn.head_dim ** 0.5 - 1.0) > 1e-12:
        raise ValueError(f"softmax_scale: torch.nn.MultiheadAttention uses 1/sqrt(head_dim); got {attn.softmax_scale}")
    qkv_bias, o_bias = attn.qkv_proj.bias is not None, attn.o_proj.bias is not None
    if qkv_bias != o_bias:
        raise ValueError(f"bias: torch.nn.MultiheadAttention has biases on both projections or neither; got "
                         f"qkv_proj bias={qkv_bias}, o_proj bias={o_bias}")
    ref = attn.qkv_proj.weight
    module = nn.MultiheadAttention(attn.d_model, attn.n_heads, dropout=attn.dropout, bias=qkv_bias,
                                   batch_first=True, device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        module.in_proj_weight.copy_(attn.qkv_proj.weight)
        module.out_proj.weight.copy_(attn.o_proj.weight)
        if qkv_bias:
            module.in_proj_bias.copy_(attn.qkv_proj.bias)
            module.out_proj.bias.copy_(attn.o_proj.bias)
    module.train(attn.training)
    return module
