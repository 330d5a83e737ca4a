"""faithfulness(model, texts=None, layers=None) -> Faithfulness: is a head's attention an explanation?

Setting (Jain and Wallace 2019, for a causal LM): an example is `length` tokens and the token after
them; the output is the model's next-token distribution at the last position, the loss its
cross-entropy on the true next token. A head's attention is its weights from the LAST query position
(the row that produces that prediction) to the length - 1 context tokens before it; the taus are
over those tokens (the query token itself cannot be left out, so it is left out of every tau).

Per head, over the examples:
- tau_gradient: Kendall tau (scipy.stats.kendalltau, tau-b) between the attention and
  |gradient x input| of each token (the loss's gradient on the input embeddings, dotted with them);
- tau_loo: Kendall tau between the attention and leave-one-out importance |loss(without token i) -
  loss| (token i dropped from the context; the last token is kept, it is the query);
- tau_uniform: the chance level for this head: Kendall tau between |gradient x input| and the head's
  own weights assigned to the tokens by a uniformly random permutation (seeded). Uniform attention
  itself has no ranking (tau undefined); a permuted copy keeps the head's ties and spread and breaks
  any link to the tokens, so |tau_gradient| far above |tau_uniform| means the link is real;
- jsd / tv: the adversarial search. The head's attention logits on the last query row are shifted by a
  free vector (an additive float attn_mask on that head only, through a forward pre-hook on the public
  `model.layers[l].attn`) and optimised with Adam to maximise the Jensen-Shannon divergence (base 2,
  in [0, 1]) from the original attention, with a hinge penalty when the total variation of the
  next-token distribution passes epsilon. The best iterate whose measured TV <= epsilon is kept (the
  unperturbed attention, JSD 0, always qualifies), so the reported tv never exceeds epsilon. Every
  head of the chosen layers is searched at once: one batch row per (layer, head), a KV cache holding
  the context, one token per step.
Reported per head: means over the examples (tv: the largest over the examples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from headcount.analysis.batches import is_decoder, token_windows
from headcount.analysis.capturing import attention_modules, capture, check_layers

Tensor = torch.Tensor
DIGITS = 6


def _round(x) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return 0.0 if x == 0 else float(f"{float(x):.{DIGITS}g}")


@dataclass
class Faithfulness:
    epsilon: float
    layers: list[int]
    n_examples: int
    heads: list[dict]
    summary: dict
    meta: dict = field(default_factory=dict)

    def to_json(self, *, meta: bool = False) -> dict:
        out = {"epsilon": self.epsilon, "layers": self.layers, "n_examples": self.n_examples,
               "heads": self.heads, "summary": self.summary}
        if meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Faithfulness":
        return cls(data["epsilon"], list(data["layers"]), data["n_examples"], [dict(h) for h in data["heads"]],
                   dict(data["summary"]), dict(data.get("meta") or {}))


# -------------------------------------------------------------------------------- pure pieces
def kendall_tau(x, y) -> float:
    """scipy's Kendall tau-b; NaN when either side is constant."""
    from scipy.stats import kendalltau
    x = torch.as_tensor(x, dtype=torch.float64).cpu().numpy()
    y = torch.as_tensor(y, dtype=torch.float64).cpu().numpy()
    res = kendalltau(x, y)
    return float(getattr(res, "statistic", res[0]))


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits over the last dim (0 <= JSD <= 1)."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (torch.log2(a.clamp_min(1e-30)) - torch.log2(b.clamp_min(1e-30))),
                           torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    return 0.5 * (p - q).abs().sum(-1)


def default_layers(n_layers: int, count: int = 3) -> list[int]:
    """`count` layers spread over the depth: first, middle(s), last."""
    if n_layers <= count:
        return list(range(n_layers))
    return sorted({round(i * (n_layers - 1) / (count - 1)) for i in range(count)})


# ---------------------------------------------------------------------------- model pieces
def _loss(model, ids: Tensor, target: Tensor) -> Tensor:
    logits = model(ids, last_only=True).logits[:, -1].float()
    return F.cross_entropy(logits, target, reduction="none")


def gradient_x_input(model, ids: Tensor, target: int) -> Tensor:
    """|dL/de . e| per input token [T] for one example ids [T] (e = the input embeddings)."""
    store = {}

    def hook(module, args, out):
        leaf = out.detach().requires_grad_(True)
        store["e"] = leaf
        return leaf

    handle = model.embed.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            loss = _loss(model, ids[None], torch.tensor([target], device=ids.device)).sum()
            (grad,) = torch.autograd.grad(loss, store["e"])
    finally:
        handle.remove()
    return (grad[0] * store["e"][0].detach()).sum(-1).abs().double().cpu()


@torch.no_grad()
def leave_one_out(model, ids: Tensor, target: int) -> Tensor:
    """|loss without token i - loss| per input token [T]; the last token (the query) scores 0."""
    n = ids.shape[0]
    tgt = torch.tensor([target], device=ids.device)
    base = _loss(model, ids[None], tgt)[0]
    keep = ~torch.eye(n, dtype=torch.bool, device=ids.device)[: n - 1]  # rows: drop token i < n-1
    dropped = ids[None].expand(n - 1, n)[keep].view(n - 1, n - 1)
    losses = _loss(model, dropped, tgt.expand(n - 1))
    out = torch.zeros(n, dtype=torch.float64)
    out[: n - 1] = (losses - base).abs().double().cpu()
    return out


def last_row_attention(model, ids: Tensor, layers: list[int]) -> dict[int, Tensor]:
    """{layer: [n_heads, T]} weights from the last query position, via capture()."""
    return capture(model, ids[None], layers=layers, summaries=lambda l, w: w[0, :, -1, :].double().cpu().clone())


def adversarial_search(model, ids: Tensor, layers: list[int], *, epsilon: float, steps: int, lr: float,
                       penalty: float, seed: int) -> tuple[dict, list[tuple[int, int]]]:
    """Per (layer, head) of `layers`: the largest JSD from the original last-row attention found with the
    next-token distribution within `epsilon` total variation. Returns ({"jsd", "tv", "attention"}
    tensors over rows, the (layer, head) of each row)."""
    mods = attention_modules(model)
    rows = [(l, h) for l in layers for h in range(mods[l].n_heads)]
    b, n = len(rows), ids.shape[0]
    dev = ids.device
    with torch.no_grad():
        ref = model.new_cache(1, n)
        model(ids[None, :-1], cache=ref, compute_logits=False)
    windowed = any(m.sliding_window is not None and m.sliding_window < n for m in mods)
    row_layer = torch.tensor([l for l, _ in rows], device=dev)
    row_head = torch.tensor([h for _, h in rows], device=dev)
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randn(b, n, generator=gen).to(dev).requires_grad_(True)
    state = {}

    def make_hooks(layer):
        sel = (row_layer == layer).nonzero().flatten()

        def pre(module, args, kwargs):
            if state.get("prefill"):  # the windowed models' prefix pass (run): no mask, no weights
                return args, kwargs
            # the free vector stays float32 (what Adam steps); the mask is in the model's dtype (a bf16 model's
            # attention takes a bf16 additive mask), the cast differentiable
            dtype = args[0].dtype if args and torch.is_floating_point(args[0]) else state["delta"].dtype
            mask = torch.zeros(b, module.n_heads, 1, n, device=dev, dtype=dtype)
            mask = mask.index_put((sel, row_head[sel], torch.zeros_like(sel)), state["delta"][sel].to(dtype))
            kwargs = dict(kwargs)
            kwargs["attn_mask"] = mask
            kwargs["need_weights"] = True
            return args, kwargs

        def post(module, args, kwargs, output):
            if state.get("prefill"):
                return output
            w = output.weights  # [b, nh, 1, n]
            state.setdefault("att", {})[layer] = w[sel, row_head[sel], 0]
            return output._replace(weights=None)

        return [mods[layer].register_forward_pre_hook(pre, with_kwargs=True),
                mods[layer].register_forward_hook(post, with_kwargs=True)]

    def run(d: Tensor):
        state["delta"] = d
        state["att"] = {}
        cache = model.new_cache(b, n)
        if windowed:  # a sliding-window cache holds only its window: fill the batch's cache by a forward instead
            state["prefill"] = True
            try:
                with torch.no_grad():
                    model(ids[None, :-1].expand(b, -1), cache=cache, compute_logits=False)
            finally:
                state["prefill"] = False
        else:
            for c, r in zip(cache, ref):
                c.append(r.k[:, :, : n - 1].expand(b, -1, -1, -1), r.v[:, :, : n - 1].expand(b, -1, -1, -1))
        logits = model(ids[None, -1:].expand(b, 1), cache=cache).logits[:, -1].float()
        att = torch.empty(b, n, dtype=logits.dtype, device=dev)
        for layer in layers:
            sel = (row_layer == layer).nonzero().flatten()
            att = att.index_put((sel,), state["att"][layer].to(att.dtype))
        return torch.softmax(logits, -1), att

    handles = [h for layer in layers for h in make_hooks(layer)]
    try:
        with torch.no_grad():
            p0, a0 = run(torch.zeros(b, n, device=dev))
        best_jsd = torch.zeros(b, dtype=torch.float64)
        best_tv = torch.zeros(b, dtype=torch.float64)
        best_att = a0.detach().double().cpu().clone()
        opt = torch.optim.Adam([delta], lr=lr)
        for _ in range(steps):
            with torch.enable_grad():
                p, a = run(delta)
                jsd = js_divergence(a, a0)
                tv = total_variation(p, p0)
                loss = (-jsd + penalty * F.relu(tv / epsilon - 0.9)).sum()
                opt.zero_grad()
                (grad,) = torch.autograd.grad(loss, delta)
            delta.grad = grad
            jsd_d, tv_d = jsd.detach().double().cpu(), tv.detach().double().cpu()
            better = (tv_d <= epsilon) & (jsd_d > best_jsd)
            best_jsd = torch.where(better, jsd_d, best_jsd)
            best_tv = torch.where(better, tv_d, best_tv)
            best_att[better] = a.detach().double().cpu()[better]
            opt.step()
    finally:
        for h in handles:
            h.remove()
    return {"jsd": best_jsd, "tv": best_tv, "attention": best_att, "original": a0.detach().double().cpu()}, rows


# ------------------------------------------------------------------------------------- main
def faithfulness(model, texts: str | Sequence[str] | None = None, layers: Sequence[int] | None = None, *,
                 epsilon: float = 0.01, n_examples: int = 3, length: int = 32, steps: int = 40, lr: float = 0.5,
                 penalty: float = 10.0, seed: int = 0, progress: bool = True) -> Faithfulness:
    """Attention vs gradient x input and leave-one-out (Kendall tau), and Jain and Wallace's adversarial
    attention, for every head of `layers` (default: 3 spread over the depth).

    texts=None = the held-out part of the default corpus (this measures; it chooses nothing).
    Examples: the first n_examples non-overlapping windows of length + 1 tokens (the last is the target).
    """
    mods = attention_modules(model)
    if not is_decoder(model):
        raise ValueError(f"model: faithfulness needs a causal language model (a next-token loss and "
                         f"distribution); {getattr(model, 'name', None) or type(model).__name__} is an encoder")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 1:
        raise ValueError(f"epsilon: expected a total variation in (0, 1), got {epsilon!r}")
    for name, value, low in (("n_examples", n_examples, 1), ("length", length, 4), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    chosen = default_layers(len(mods)) if layers is None else check_layers(model, layers)
    windows = token_windows(model, texts, window=length + 1, max_windows=n_examples, part="held_out")
    if windows.shape[0] < n_examples:
        raise ValueError(f"texts: {windows.numel()} tokens give {windows.shape[0]} examples of {length + 1} tokens; "
                         f"faithfulness needs {n_examples} (give more text or fewer n_examples)")
    dev = next(model.parameters()).device
    windows = windows.to(dev)
    was_training = model.training
    model.eval()
    from tqdm.auto import tqdm
    import sys
    bar = tqdm(total=n_examples, desc="faithfulness", unit="example", file=sys.stderr, disable=not progress,
               leave=False)
    rows = [(l, h) for l in chosen for h in range(mods[l].n_heads)]
    per = {key: torch.zeros(n_examples, len(rows), dtype=torch.float64) for key in
           ("tau_gradient", "tau_loo", "tau_uniform", "jsd", "tv")}
    tau_gl = []
    gen = torch.Generator().manual_seed(seed)
    try:
        for e in range(n_examples):
            ids, target = windows[e, :length], int(windows[e, length])
            att = last_row_attention(model, ids, chosen)
            grad = gradient_x_input(model, ids, target)
            loo = leave_one_out(model, ids, target)
            ctx = length - 1  # the context tokens; the query token itself cannot be dropped
            tau_gl.append(kendall_tau(grad[:ctx], loo[:ctx]))
            for r, (l, h) in enumerate(rows):
                a = att[l][h][:ctx]
                perm = torch.randperm(ctx, generator=gen)
                per["tau_gradient"][e, r] = kendall_tau(a, grad[:ctx])
                per["tau_loo"][e, r] = kendall_tau(a, loo[:ctx])
                per["tau_uniform"][e, r] = kendall_tau(a[perm], grad[:ctx])
            found, _ = adversarial_search(model, ids, chosen, epsilon=float(epsilon), steps=steps, lr=lr,
                                          penalty=penalty, seed=seed + e)
            per["jsd"][e] = found["jsd"]
            per["tv"][e] = found["tv"]
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)

    def mean(x):
        x = x[~torch.isnan(x)]
        return float(x.mean()) if x.numel() else float("nan")

    heads = []
    for r, (l, h) in enumerate(rows):
        heads.append({"layer": l, "head": h,
                      "tau_gradient": _round(mean(per["tau_gradient"][:, r])),
                      "tau_loo": _round(mean(per["tau_loo"][:, r])),
                      "tau_uniform": _round(mean(per["tau_uniform"][:, r])),
                      "jsd": _round(mean(per["jsd"][:, r])),
                      "tv": _round(float(per["tv"][:, r].max()))})
    jsd_heads = torch.tensor([h["jsd"] for h in heads], dtype=torch.float64)

    def abs_mean(key):
        return _round(mean(torch.tensor([abs(h[key]) for h in heads if h[key] is not None], dtype=torch.float64)))

    summary = {
        "tau_gradient_mean": _round(mean(per["tau_gradient"].flatten())),
        "tau_loo_mean": _round(mean(per["tau_loo"].flatten())),
        "tau_uniform_mean": _round(mean(per["tau_uniform"].flatten())),
        "abs_tau_gradient_mean": abs_mean("tau_gradient"),
        "abs_tau_loo_mean": abs_mean("tau_loo"),
        "abs_tau_uniform_mean": abs_mean("tau_uniform"),
        "tau_gradient_vs_loo": _round(mean(torch.tensor(tau_gl, dtype=torch.float64))),
        "jsd_mean": _round(float(jsd_heads.mean())),
        "jsd_median": _round(float(jsd_heads.median())),
        "jsd_max": _round(float(jsd_heads.max())),
        "share_jsd_at_least_half": _round(float((jsd_heads >= 0.5).double().mean())),
        "tv_max": _round(float(per["tv"].max())),
    }
    meta = {"model": getattr(model, "name", None), "length": length, "steps": steps, "lr": lr, "penalty": penalty,
            "seed": seed,
            "attention": "weights from the last query position to the context tokens before it (taus); the "
                         "adversarial search perturbs the whole row, the query token included",
            "importance": {"gradient": "|dL/de . e| on the input embeddings, L = next-token cross-entropy",
                           "loo": "|L(without token i) - L|, token i dropped"},
            "uniform": "Kendall tau of |gradient x input| against the head's weights randomly permuted (seeded)",
            "jsd": "Jensen-Shannon divergence, base 2, best found with next-token TV <= epsilon; mean over examples",
            "tv": "total variation of the next-token distribution at that attention; max over examples",
            "text": "held-out part of the default corpus" if texts is None else "given texts"}
    return Faithfulness(float(epsilon), chosen, n_examples, heads, summary, meta)
