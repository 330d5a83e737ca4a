"""Which weights a heal moves, and the teacher checks (is the teacher the edited model's ancestor?).

    PARAMS = ("attention", "all", "lora")
    check_teacher(model, teacher)            ValueError naming `teacher` when it cannot be the ancestor
    check_trainable_dtype(model)             ValueError naming `dtype` when the device cannot train in it
    edited_layers(model, teacher)            layers whose attention differs from the teacher's (shape or values)
    share_unchanged(model, teacher)          the student takes the teacher's tensor wherever its own is equal
    Mover(model, teacher, params, layers)    sets requires_grad (or wraps LoRA adapters); .finish() restores
                                             the flags and folds adapters back into plain weights

"attention": each edited layer's qkv_proj, o_proj (weights and biases), its q/k norms and the norms around
the attention (attn_norm, post_attn_norm). "all": every parameter. "lora": peft LoRA adapters on the edited
layers' qkv_proj and o_proj, merged back with merge_and_unload() at the end, so the healed model is a plain
headcount model again (it saves, reloads and exports like any other).

A student made by models.copying.attention_copy SHARES its non-attention tensors with the teacher; a heal
that moves one of them first gives the student its own copy (ties inside the student, such as lm_head =
embed, are kept), so the teacher never changes.
"""

from __future__ import annotations

import itertools

import torch

from headcount.arguments import ArgumentError, one_of

PARAMS = ("attention", "all", "lora")
LORA_RANK = 16
LORA_ALPHA = 32
PROBE_TEXT = "def heal(model):\n    return model  # The quick brown fox, 2024."


def check_teacher(model, teacher) -> None:
    """The teacher must be a decoder with the student's tokenizer and vocabulary, d_model and layer count."""
    for name, m in (("model", model), ("teacher", teacher)):
        if not hasattr(m, "lm_head") or not hasattr(m, "layers"):
            raise ArgumentError(name, f"healing distils next-token distributions; expected a headcount decoder, "
                                      f"got {type(m).__name__}{' (an encoder)' if hasattr(m, 'layers') else ''}")
    if model is teacher:
        raise ArgumentError("teacher", "expected the unedited model, got the edited model itself")
    mc, tc = model.config, teacher.config
    if mc.vocab_size != tc.vocab_size:
        raise ArgumentError("teacher", f"vocabulary of {tc.vocab_size} tokens, the model's has {mc.vocab_size}; "
                                       "expected the edited model's ancestor (same tokenizer)")
    for field in ("d_model", "n_layers"):
        if getattr(mc, field) != getattr(tc, field):
            raise ArgumentError("teacher", f"{field}={getattr(tc, field)}, the model's is {getattr(mc, field)}; "
                                           "expected the edited model's ancestor (an edit of its attention heads "
                                           "keeps d_model and the layers)")
    mt, tt = model.tokenizer, teacher.tokenizer
    if (mt is None) != (tt is None):
        raise ArgumentError("teacher", "one of the model and the teacher has a tokenizer and the other none")
    if mt is not None and mt.encode(PROBE_TEXT) != tt.encode(PROBE_TEXT):
        raise ArgumentError("teacher", "its tokenizer splits text differently from the model's; expected the "
                                       "edited model's ancestor (same tokenizer)")
    if model.embed.weight.device != teacher.embed.weight.device:
        raise ArgumentError("teacher", f"on {teacher.embed.weight.device}, the model on "
                                       f"{model.embed.weight.device}; expected both on one device")


def check_trainable_dtype(model, flag: str = "dtype") -> None:
    """fp32 trains anywhere; bf16 on CPU and on GPUs that support it; fp16 only on a GPU (on CPU its backward is
    unsupported or silently inexact, and AdamW's updates underflow without loss scaling)."""
    weight = model.embed.weight
    dtype, device = weight.dtype, weight.device
    if dtype == torch.float32 or dtype == torch.float64:
        return
    if dtype == torch.bfloat16 and (device.type == "cpu" or torch.cuda.is_bf16_supported()):
        return
    if dtype == torch.float16 and device.type == "cuda":
        return
    raise ValueError(f"{flag}: cannot train {str(dtype).replace('torch.', '')} weights on {device.type}; expected fp32 "
                     f"or bf16{' (fp16 trains only on a GPU)' if dtype == torch.float16 else ''}")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def edited_layers(model, teacher) -> list[int]:
    """Layers whose attention (its heads or any of its tensors) differs from the teacher's."""
    out = []
    for i, (s, t) in enumerate(zip(model.layers, teacher.layers)):
        sa, ta = s.attn, t.attn
        if (sa.n_heads, sa.n_kv_heads, tuple(sa.kv_head_of)) != (ta.n_heads, ta.n_kv_heads, tuple(ta.kv_head_of)):
            out.append(i)
            continue
        ss, ts = sa.state_dict(), ta.state_dict()
        if ss.keys() != ts.keys() or any(not _same(ss[k], ts[k]) for k in ss):
            out.append(i)
    return out


def _attention_parameters(model, layers) -> list[torch.nn.Parameter]:
    params = []
    for i in layers:
        layer = model.layers[i]
        if getattr(layer, "attn_dropped", False):  # attention dropped: what is left of the layer (its MLP) heals it
            params += list(layer.mlp.parameters()) + list(layer.mlp_norm.parameters())
            continue
        params += list(layer.attn.parameters())  # qkv_proj, o_proj, q_norm / k_norm
        for name in ("attn_norm", "post_attn_norm"):
            module = getattr(layer, name, None)
            if module is not None:
                params += list(module.parameters())
    return list({id(p): p for p in params}.values())


def _untie_from(model, teacher, moving: set[int]) -> None:
    """Give the student its own copy of every moving parameter it shares with the teacher (same Parameter
    object, from attention_copy): one clone per shared tensor, so the student's own ties survive."""
    theirs = {id(p) for p in itertools.chain(teacher.parameters(), teacher.buffers())}
    clones: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) in theirs and id(p) in moving:
                if id(p) not in clones:
                    clones[id(p)] = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                setattr(module, name, clones[id(p)])


def share_unchanged(model, teacher) -> int:
    """Make `model` (the edited student, loaded on its own) use the teacher's tensor wherever its own parameter of
    the same name is equal (same shape, dtype, values), as models.copying.attention_copy's students do: a
    student loaded beside its teacher then holds only what the edit changed (the 1.5B heals within 2x its
    weights + 1 GiB only so: docs/healing.md). The student's own ties are kept (one decision per tensor); the
    Mover clones any shared tensor before it moves. Returns the bytes no longer held twice."""
    theirs = dict(teacher.named_parameters(remove_duplicate=False))
    decided: dict[int, torch.nn.Parameter | None] = {}
    saved = 0
    for module_name, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) not in decided:
                t = theirs.get(f"{module_name}.{name}" if module_name else name)
                same = t is not None and t is not p and _same(p.detach(), t.detach()) and p.device == t.device
                decided[id(p)] = t if same else None
                saved += p.numel() * p.element_size() if same else 0
            if decided[id(p)] is not None:
                setattr(module, name, decided[id(p)])
    return saved


class Mover:
    """Which weights move during one heal (see the module doc). trainable(): the parameters the optimizer
    steps; finish(): every requires_grad flag restored, LoRA adapters merged into plain weights."""

    def __init__(self, model, teacher, params: str, layers: list[int], *, rank: int = LORA_RANK,
                 alpha: int = LORA_ALPHA):
        one_of("params", params, PARAMS)
        self.model, self.params, self.layers = model, params, list(layers)
        self.lora, self.rank = None, rank
        if params == "lora":
            self._wrap_lora(rank, alpha)
        else:
            chosen = list(model.parameters()) if params == "all" else _attention_parameters(model, self.layers)
            _untie_from(model, teacher, {id(p) for p in chosen})
            chosen = list(model.parameters()) if params == "all" else _attention_parameters(model, self.layers)
            self._flags = {p: p.requires_grad for p in model.parameters()}
            for p in model.parameters():
                p.requires_grad_(False)
            for p in chosen:
                p.requires_grad_(True)
            self._chosen = chosen
        self._n = sum(p.numel() for p in self._chosen)

    def _wrap_lora(self, rank: int, alpha: int) -> None:
        from peft import LoraConfig, LoraModel

        self._flags = {p: p.requires_grad for p in self.model.parameters()}
        targets = [f"layers.{i}.attn.{name}" for i in self.layers for name in ("qkv_proj", "o_proj")]
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none")
        self.lora = LoraModel(self.model, config, "default")  # wraps the targets in place; the rest is frozen
        self._chosen = [p for n, p in self.lora.named_parameters() if "lora_" in n]
        for p in self._chosen:
            p.requires_grad_(True)
        self._n = sum(p.numel() for p in self._chosen)

    def trainable(self) -> list[torch.nn.Parameter]:
        return list(self._chosen)

    def n_trainable(self) -> int:
        return self._n

    def moved(self) -> dict:
        """JSON-ready: what moved (the healed model's metadata records it)."""
        return {"params": self.params, "layers": self.layers, "trainable_params": self._n,
                **({"lora_rank": self.rank} if self.params == "lora" else {})}

    def finish(self):
        """Fold adapters back (LoRA) and restore every requires_grad flag; returns the plain model."""
        if self.lora is not None:
            merged = self.lora.merge_and_unload()
            assert merged is self.model  # peft unwraps the same module tree in place
            self.lora = None
            self._chosen = []
        for p, flag in self._flags.items():
            p.requires_grad_(flag)
        return self.model
