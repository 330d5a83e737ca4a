"""headcount.analysis.refit: Gram statistics, ridge solves and removal errors against independent truths."""

import pytest
import torch

from headcount.analysis.refit import (GramStats, collect_o_proj_stats, head_columns, objective, removal_errors,
                                      ridge_solve)
from headcount.models import Decoder, DecoderConfig, Encoder, EncoderConfig


pytestmark = pytest.mark.usefixtures("one_thread_for_tiny_models")


def _stats(x: torch.Tensor, y: torch.Tensor) -> GramStats:
    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    return GramStats(x1.T @ x1, x1.T @ y, (y * y).sum(0), x.shape[0])


def _data(n=200, d=12, m=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d, m, generator=g, dtype=torch.float64) + torch.randn(m, generator=g, dtype=torch.float64)
    y = y + 0.3 * torch.randn(n, m, generator=g, dtype=torch.float64)
    return x, y


def _tiny_decoder(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48, max_position=64, o_bias=True)
    cfg.update(kw)
    return Decoder(DecoderConfig(**cfg)).eval()


@pytest.mark.parametrize("keep", [list(range(12)), [0, 3, 4, 7, 11], [5]])
def test_ridge_solve_with_zero_ridge_is_lstsq(keep):
    x, y = _data()
    w, b = ridge_solve(_stats(x, y), keep, ridge=0.0)
    design = torch.cat([x[:, keep], torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    ref = torch.linalg.lstsq(design, y).solution
    torch.testing.assert_close(w, ref[:-1].T, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(b, ref[-1], rtol=1e-8, atol=1e-8)


def test_ridge_solve_matches_augmented_lstsq_and_no_bias():
    x, y = _data()
    keep = [1, 2, 6, 9]
    stats = _stats(x, y)
    lam = 0.05 * float(stats.xtx.diagonal()[:12].mean())
    w, b = ridge_solve(stats, keep, ridge=0.05)
    # ridge = lstsq on rows augmented with sqrt(lam) I (bias column unpenalised)
    design = torch.cat([x[:, keep], torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)
    aug = torch.cat([design, torch.cat([lam ** 0.5 * torch.eye(4, dtype=x.dtype), torch.zeros(4, 1, dtype=x.dtype)], 1)])
    ref = torch.linalg.lstsq(aug, torch.cat([y, torch.zeros(4, y.shape[1], dtype=y.dtype)])).solution
    torch.testing.assert_close(w, ref[:-1].T, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(b, ref[-1], rtol=1e-8, atol=1e-8)
    w0, b0 = ridge_solve(stats, keep, ridge=0.0, fit_bias=False)
    torch.testing.assert_close(w0, torch.linalg.lstsq(x[:, keep], y).solution.T, rtol=1e-8, atol=1e-8)
    assert torch.all(b0 == 0)


@pytest.mark.parametrize("ridge", [0.0, 1e-3, 0.1])
def test_removal_errors_equal_brute_force_refits(ridge):
    x, y = _data(d=12)
    stats = _stats(x, y)
    heads = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    weights = torch.rand(y.shape[1], dtype=torch.float64) + 0.5
    errs = removal_errors(stats, heads, ridge=ridge, weights=weights)
    for h in range(4):
        keep = [c for g, cols in enumerate(heads) if g != h for c in cols]
        w, b = ridge_solve(stats, keep, ridge=ridge)
        resid = y - x[:, keep] @ w.T - b
        lam = ridge * float(stats.xtx.diagonal()[:12].mean())
        truth = float(((resid ** 2).sum(0) * weights).sum() + lam * ((w ** 2).sum(1) * weights).sum())
        assert errs[h].item() == pytest.approx(truth, rel=1e-7)
        assert objective(stats, keep, ridge=ridge, weights=weights) == pytest.approx(truth, rel=1e-7)
    # greedy step: with head 1 gone, the errors of the three others
    errs2 = removal_errors(stats, [heads[0], heads[2], heads[3]], ridge=ridge)
    assert errs2[1].item() == pytest.approx(objective(stats, heads[0] + heads[3], ridge=ridge), rel=1e-7)


def test_collect_stats_on_a_tiny_decoder_equal_a_direct_capture():
    model = _tiny_decoder()
    ids = torch.randint(0, 50, (3, 16))
    xs, ys = {}, {}
    def grab(i):
        def hook(module, args, out):
            xs[i], ys[i] = args[0].detach(), out.detach()
        return hook
    hooks = [model.layers[i].attn.o_proj.register_forward_hook(grab(i)) for i in range(3)]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    stats = collect_o_proj_stats(model, ids, layers=[0, 2], batch_size=2, progress=False)
    assert sorted(stats) == [0, 2]
    for i in (0, 2):
        ref = _stats(xs[i].reshape(-1, 32).double(), ys[i].reshape(-1, 32).double())
        torch.testing.assert_close(stats[i].xtx, ref.xtx, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(stats[i].xty, ref.xty, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(stats[i].yty, ref.yty, rtol=1e-6, atol=1e-6)
        assert stats[i].n_tokens == 48
        # the full refit reproduces o_proj itself
        w, b = ridge_solve(stats[i], range(32), ridge=0.0)
        torch.testing.assert_close(w.float(), model.layers[i].attn.o_proj.weight, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(b.float(), model.layers[i].attn.o_proj.bias, rtol=1e-3, atol=1e-4)
    # stop_early changes nothing
    late = collect_o_proj_stats(model, ids, layers=[0, 2], batch_size=3, stop_early=False, progress=False)
    torch.testing.assert_close(late[0].xtx, stats[0].xtx)


def test_reference_targets_come_from_the_reference_model():
    model, reference = _tiny_decoder(0), _tiny_decoder(1)
    ids = torch.randint(0, 50, (2, 8))
    ys = {}
    def grab(module, args, out):
        ys[1] = out.detach()
    hook = reference.layers[1].attn.o_proj.register_forward_hook(grab)
    with torch.no_grad():
        reference(ids)
    hook.remove()
    stats = collect_o_proj_stats(model, ids, layers=1, reference=reference, progress=False)[1]
    torch.testing.assert_close(stats.yty, (ys[1].reshape(-1, 32).double() ** 2).sum(0), rtol=1e-6, atol=1e-6)


def test_encoder_padding_is_left_out():
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=40, d_model=24, n_layers=2, n_heads=3, d_ff=32, max_position=32)).eval()
    ids = torch.randint(1, 40, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    stats = collect_o_proj_stats(model, [(ids, mask)], layers=[1], progress=False)[1]
    assert stats.n_tokens == 16
    assert stats.xtx[-1, -1].item() == 16


def test_head_columns_and_bad_input():
    model = _tiny_decoder()
    assert head_columns(model.layers[0].attn)[1] == list(range(8, 16))
    x, y = _data()
    with pytest.raises(ValueError, match="keep_cols"):
        ridge_solve(_stats(x, y), [0, 12])
    with pytest.raises(ValueError, match="ridge"):
        ridge_solve(_stats(x, y), [0], ridge=-1.0)
    with pytest.raises(ValueError, match="layers"):
        collect_o_proj_stats(model, torch.zeros(1, 4, dtype=torch.long), layers=[7], progress=False)
    with pytest.raises(ValueError, match="share a column"):
        removal_errors(_stats(x, y), [[0, 1], [1, 2]])
