"""low-rank (chapter 2.3.5; Bhojanapalli et al. 2020, arXiv 2002.07028): one head's score matrix
X W_Q W_K^T X^T has rank <= min(head_dim, d_model, n), so a head narrower than the sequence cannot
express every n x n attention pattern.

Fixed inputs X [n, d_model] (Gaussian, d_model >= n so head_dim is the binding constraint). Targets:
P = softmax(s G) with G a Gaussian n x n matrix: soft patterns whose logits have full rank. For each
head_dim we fit ONE head's W_Q, W_K (a headcount.MultiHeadAttention with n_heads=1 and that head_dim,
no biases; Adam on KL(P || A), A the module's own attention weights) and report the best error
reached: the mean total-variation distance per row, 1/2 sum_j |A_ij - P_ij|, in [0, 1].

An independent check rides along: the same error for softmax of the best rank-r approximation of
the row-centred target logits (truncated SVD, r = min(head_dim, n)). Softmax forgets one constant per
row, and row-centred logits have rank <= n - 1, so n - 1 already suffices; the SVD column shows it.

Then the paper's fix at the same n_heads: MultiHeadAttention(d_model, n_heads) gives each head
d_model / n_heads < n dimensions; MultiHeadAttention(d_model, n_heads, head_dim=n) decouples head_dim
from d_model / n_heads, and every head can fit its own target.
"""

from __future__ import annotations

import torch

from headcount.arguments import positive_ints
from headcount.attention import MultiHeadAttention
from headcount.experiments.results import ExperimentResult, RankRow, mean_std
from headcount.experiments.small import check_heads
from headcount.experiments.train import resolve_config, train

Tensor = torch.Tensor

CLAIM = ("2.3.5: a head's score matrix has rank <= head_dim, so a head narrower than the sequence cannot "
         "express every n x n pattern (Bhojanapalli et al. 2020); decoupling head_dim from d_model / n_heads "
         "fixes it at the same n_heads.")
FULL = dict(n=16, d_model=64, head_dims=(1, 2, 4, 8, 12, 15, 16, 20, 32), n_heads=8, targets=3, steps=2000,
            lr=0.03, logit_scale=2.0)
QUICK = dict(n=8, d_model=16, head_dims=(1, 2, 4, 8, 12), n_heads=4, targets=1, steps=600, lr=0.05,
             logit_scale=2.0)


def targets(n: int, count: int, scale: float, seed: int) -> Tensor:
    """[count, n, n] row-stochastic targets softmax(scale * G), G ~ N(0, 1): full-rank logits."""
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(count, n, n, generator=gen, dtype=torch.float64), dim=-1).float()


def tv_error(fit: Tensor, target: Tensor) -> Tensor:
    """Mean total-variation distance per row: 1/2 sum_j |fit_ij - target_ij|, averaged over rows."""
    return 0.5 * (fit - target).abs().sum(-1).mean(-1)


def kl(target: Tensor, fit: Tensor) -> Tensor:
    """Mean KL(target || fit) per row."""
    return (target * (target.clamp_min(1e-30).log() - fit.clamp_min(1e-30).log())).sum(-1).mean(-1)


def svd_fit(target: Tensor, rank: int) -> Tensor:
    """softmax of the best rank-`rank` approximation (Frobenius) of the row-centred logits log target."""
    logits = target.double().log()
    logits = logits - logits.mean(-1, keepdim=True)
    u, s, vh = torch.linalg.svd(logits)
    approx = (u[..., :rank] * s[..., None, :rank]) @ vh[..., :rank, :]
    return torch.softmax(approx, dim=-1).float()


def fit_heads(x: Tensor, target: Tensor, *, d_model: int, n_heads: int, head_dim: int | None, steps: int,
              lr: float, desc: str, progress: bool) -> tuple[Tensor, MultiHeadAttention]:
    """Fit every head's W_Q, W_K of MultiHeadAttention(d_model, n_heads, head_dim=...) to its own target.

    x [1, n, d_model]; target [n_heads, n, n]. -> (the fitted weights [n_heads, n, n], the module).
    """
    attn = MultiHeadAttention(d_model, n_heads, head_dim=head_dim, bias=False)
    attn.o_proj.weight.requires_grad_(False)  # the weights do not depend on W_V or W_O

    def loss_of(module, _):
        weights = module(x, need_weights=True).weights[0]  # (n_heads, n, n)
        return kl(target, weights).mean()

    train(attn, lambda step: None, loss_of, steps=steps, lr=lr, warmup=steps // 50, clip=None, desc=desc,
          progress=progress)
    with torch.no_grad():
        return attn(x, need_weights=True).weights[0], attn


def run(*, quick: bool = False, seed: int = 0, steps: int | None = None, seeds: int | None = None,
        progress: bool = True, **options) -> ExperimentResult:
    cfg = resolve_config("low-rank", quick, QUICK, FULL, options, steps=steps, seeds=seeds, seeds_key="targets")
    n, d_model = cfg["n"], cfg["d_model"]
    if d_model < n:
        raise ValueError(f"d_model: expected at least n={n} so that head_dim is the binding constraint, got {d_model}")
    head_dims = positive_ints("head_dims", tuple(cfg["head_dims"]))
    n_heads = check_heads((cfg["n_heads"],), d_model, name="n_heads")[0]
    torch.manual_seed(seed)
    x = torch.randn(1, n, d_model, generator=torch.Generator().manual_seed(seed))
    rows: list[RankRow] = []
    for head_dim in head_dims:
        errs, kls, svds = [], [], []
        target = targets(n, cfg["targets"], cfg["logit_scale"], seed + 1)
        for t in range(cfg["targets"]):
            torch.manual_seed(seed + 100 * t + head_dim)
            fitted, _ = fit_heads(x, target[t:t + 1], d_model=d_model, n_heads=1, head_dim=head_dim,
                                  steps=cfg["steps"], lr=cfg["lr"], desc=f"low-rank head_dim={head_dim} target={t}",
                                  progress=progress)
            errs.append(float(tv_error(fitted, target[t:t + 1])))
            kls.append(float(kl(target[t:t + 1], fitted)))
            svds.append(float(tv_error(svd_fit(target[t:t + 1], min(head_dim, n)), target[t:t + 1])))
        mean, std = mean_std(errs)
        rows.append(RankRow(head_dim=head_dim, n=n, error=mean, error_std=std, kl=mean_std(kls)[0],
                            svd_error=mean_std(svds)[0]))
    # The paper's fix: the same n_heads, head_dim = d_model / n_heads vs head_dim = n.
    fix_target = targets(n, n_heads, cfg["logit_scale"], seed + 2)
    for label, head_dim in ((f"n_heads={n_heads}, head_dim = d_model / n_heads", None),
                            (f"n_heads={n_heads}, head_dim = n (decoupled)", n)):
        torch.manual_seed(seed + 7)
        fitted, attn = fit_heads(x, fix_target, d_model=d_model, n_heads=n_heads, head_dim=head_dim,
                                 steps=cfg["steps"], lr=cfg["lr"], desc=f"low-rank {label}", progress=progress)
        per_head = tv_error(fitted, fix_target)
        svd = tv_error(svd_fit(fix_target, min(attn.head_dim, n)), fix_target)
        rows.append(RankRow(head_dim=attn.head_dim, n=n, error=float(per_head.mean()),
                            error_std=float(per_head.std()) if n_heads > 1 else 0.0,
                            kl=float(kl(fix_target, fitted).mean()), svd_error=float(svd.mean()),
                            n_heads=n_heads, setting=label))
    return ExperimentResult("low-rank", CLAIM, quick, cfg, rows, {"bound": n}, _notes(rows, n))


def _notes(rows: list[RankRow], n: int) -> list[str]:
    one = [r for r in rows if r.setting == "one head"]
    below = [r for r in one if r.head_dim < n - 1]
    at = [r for r in one if r.head_dim >= n]
    notes = []
    if below and at:
        notes.append(f"one head: error {max(r.error for r in below):.3f} .. {min(r.error for r in below):.3f} for "
                     f"head_dim {min(r.head_dim for r in below)} .. {max(r.head_dim for r in below)} < n - 1; "
                     f"at most {max(r.error for r in at):.2g} once head_dim >= n = {n}")
    fix = [r for r in rows if r.setting != "one head"]
    if len(fix) == 2:
        notes.append(f"{fix[0].setting}: mean error {fix[0].error:.3f} over its heads; "
                     f"{fix[1].setting}: {fix[1].error:.2g}")
    return notes


def format_text(result: ExperimentResult) -> str:
    cfg = result.config
    lines = [f"low-rank: n = {cfg['n']} positions, d_model {cfg['d_model']}, targets softmax({cfg['logit_scale']} G), "
             f"{cfg['targets']} target(s) per head_dim, Adam {cfg['steps']} steps",
             "error = mean total-variation distance per row (0 = the pattern exactly, 1 = disjoint)",
             f"{'setting':<44} {'n_heads':>7} {'head_dim':>8} {'n':>4} {'error':>8} {'± std':>7} {'KL':>8} "
             f"{'SVD rank-r':>10}"]
    for r in result.rows():
        mark = "  <- head_dim = n" if r["head_dim"] == r["n"] and r["setting"] == "one head" else ""
        lines.append(f"{r['setting']:<44} {r['n_heads']:>7} {r['head_dim']:>8} {r['n']:>4} {r['error']:>8.4f} "
                     f"{r['error_std']:>7.4f} {r['kl']:>8.4f} {r['svd_error']:>10.4f}{mark}")
    lines += result.notes
    return "\n".join(lines)


def plot(result: ExperimentResult, ax) -> None:
    rows = result.rows()
    one = [r for r in rows if r["setting"] == "one head"]
    xs = [r["head_dim"] for r in one]
    ax.errorbar(xs, [r["error"] for r in one], yerr=[r["error_std"] for r in one], marker="o", capsize=3,
                label="one head, fitted (Adam)")
    ax.plot(xs, [r["svd_error"] for r in one], marker="x", linestyle="--", label="softmax of rank-r SVD logits")
    n = result.details["bound"]
    ax.axvline(n, color="red", linestyle=":", label=f"bound: head_dim = n = {n}")
    for r, m in zip([r for r in rows if r["setting"] != "one head"], ("v", "^")):
        ax.plot([r["head_dim"]], [r["error"]], marker=m, markersize=9, linestyle="none", label=r["setting"])
    ax.set_xlabel("head_dim")
    ax.set_ylabel("best error (mean TV distance per row)")
    ax.set_title("low-rank: one head's reachable patterns")
    ax.legend(fontsize=8)
