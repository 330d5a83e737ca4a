"""Gates trained WITH the model (Voita et al. 2019's setup): what train_gates(joint=True) adds to the frozen
variant in gates.py, which runs the loop.

    trained_parameters(model, params) -> [Parameter]   the weights that move with the gates
    teacher_copy(model, trained) -> model              a frozen copy of the unedited model for the distillation

Which weights move (`params`, the choice healing offers):
  "attention"  every layer's attention (qkv_proj, o_proj, q/k norms) and the norms around it (attn_norm,
               post_attn_norm): the edited sub-layers and what feeds them, ~1/4 of a small decoder's weights
  "all"        every parameter (embeddings and lm_head included): the default, what the bench measured

The teacher. In the frozen variant the teacher is the model itself without gates; here the model's weights
move, so the teacher is a copy taken before training, frozen. It owns only the tensors the student trains and
SHARES every other parameter and buffer with the student (copy.deepcopy with those tensors pre-entered in
its memo, as models.copying.attention_copy does): "attention" costs one copy of the attention weights and
norms, "all" a whole second model.

Why the removal after joint training is compensate="none": the kept heads' weights were trained to work
without the closed ones (the gates folded into o_proj make the pruned model exactly the gated model at its
deterministic gates). A least-squares refit would instead pull o_proj back towards the all-heads output of the
trained weights, which is no model anyone trained.
"""

from __future__ import annotations

import copy
import itertools

PARAMS = ("attention", "all")
DEFAULT_PARAMS = "all"  # measured: smollm2 50% (docs/pruning.md); "attention" shares more with the teacher
WEIGHT_LR = 1e-4  # AdamW's on the trained weights (the gates keep their own lr)


def check_params(params) -> str:
    if params not in PARAMS:
        raise ValueError(f"params: expected one of {', '.join(PARAMS)} (the weights trained with the gates), "
                         f"got {params!r}")
    return params


def trained_parameters(model, params: str = DEFAULT_PARAMS) -> list:
    """The parameters that train with the gates (each once, in module order)."""
    check_params(params)
    if params == "all":
        return list(model.parameters())
    seen, out = set(), []
    for layer in model.layers:
        mods = [layer.attn] + [m for m in (getattr(layer, n, None) for n in ("attn_norm", "post_attn_norm"))
                               if m is not None]
        for p in itertools.chain.from_iterable(m.parameters() for m in mods):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def teacher_copy(model, trained) -> object:
    """A frozen eval-mode copy of `model` owning the `trained` tensors, every other tensor shared with it."""
    own = {id(p) for p in trained}
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers()) if id(t) not in own}
    teacher = copy.deepcopy(model, memo)
    for p in teacher.parameters():
        if id(p) in own or id(p) not in memo:
            p.requires_grad_(False)
    return teacher.eval()
