"""grad_memory: frozen-weight backward passes with layers checkpointed to fit a budget give the same
scores as a plain backward, the saved-bytes estimate matches a direct measurement, and the budget holds."""

import pytest
import torch

from headcount.analysis import grad_memory
from headcount.analysis.head_importance import importance
from headcount.models import Decoder, DecoderConfig

pytestmark = pytest.mark.usefixtures("one_thread_for_tiny_models")


def decoder(max_position=512, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=50, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=48,
                        max_position=max_position)
    return Decoder(cfg, dtype=torch.float64).eval()


@pytest.mark.parametrize("method", ["gradient", "reconstruction"])
def test_checkpointing_every_layer_changes_nothing(method):
    """budget 0 checkpoints every layer; a huge budget none: the scores are bit-identical (same arithmetic,
    recomputed), and the cost says 3 vs 2 forward equivalents."""
    model = decoder()
    windows = torch.randint(1, 50, (3, 24), generator=torch.Generator().manual_seed(1))
    runs = {b: importance(model, method=method, windows=windows, max_windows=None, window=24, batch_size=2,
                          progress=False, activation_budget=b) for b in (0, 10**12)}
    assert runs[0].info["memory"]["checkpointed_layers"] == 4
    assert runs[10**12].info["memory"]["checkpointed_layers"] == 0
    assert runs[0].info["forward_equivalents"] == 3.0 and runs[10**12].info["forward_equivalents"] == 2.0
    assert torch.equal(runs[0].scores.nan_to_num(), runs[10**12].scores.nan_to_num())
    assert all(p.requires_grad for p in model.parameters())  # restored


def test_extrapolated_saved_bytes_match_a_direct_measurement():
    """The three-probe extrapolation to 400 tokens against autograd's saved bytes at 400 tokens."""
    model = decoder()
    estimate = grad_memory.saved_bytes_per_sequence(model, 400)
    with grad_memory._frozen(model):
        direct = grad_memory._saved_bytes(model, 400)
    assert direct > 0 and abs(estimate - direct) / direct < 0.05


def _live_graph_tensors() -> int:
    import gc
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None)


def test_the_saved_bytes_probe_leaves_no_graph_behind():
    """The probe's graph is freed with its output: no tensor of it stays alive (a pack hook that hands the
    graph the tensor it saved as its own output makes a cycle no collector sees: 0.26 GiB on the 1.5B)."""
    model = decoder()
    before = _live_graph_tensors()
    with grad_memory._frozen(model):
        assert grad_memory._saved_bytes(model, 64) > 0
    assert _live_graph_tensors() == before


def test_plan_fits_the_budget_with_as_few_checkpointed_layers_as_possible():
    model = decoder()
    full = grad_memory.plan(model, (2, 64), budget=10**12)
    assert full["checkpointed_layers"] == 0
    least = grad_memory.plan(model, (2, 64), budget=0)  # every layer checkpointed: the least it can keep
    assert least["checkpointed_layers"] == 4 and least["activation_bytes"] < full["activation_bytes"]
    for budget in ((least["activation_bytes"] + full["activation_bytes"]) // 2, least["activation_bytes"]):
        p = grad_memory.plan(model, (2, 64), budget=budget)
        k = p["checkpointed_layers"]
        assert 0 < k <= 4 and p["activation_bytes"] <= budget
        if k > 1:  # one fewer would not fit
            fewer = (4 - k + 1) * p["saved_bytes_per_layer"] + (k - 1) * 2 * 64 * 32 * 8 + p["saved_bytes_per_layer"]
            assert fewer > budget
    with pytest.raises(ValueError, match="budget"):
        grad_memory.plan(model, (2, 64), budget=-1)


def test_an_overflowing_calibration_pass_is_a_clear_error_and_nothing_changes():
    """fp16 activations past 65,504 (made here by scaling the embedding): importance and prune say where, in
    which dtype, and the model is left as it was."""
    from headcount.surgery import prune

    model = decoder().to(torch.float16)
    with torch.no_grad():
        model.embed.weight.mul_(1e5)  # inf in fp16
    windows = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"--dtype: .*inf/NaN.*float16.*bf16 or fp32"):
        importance(model, method="gradient", windows=windows, max_windows=None, window=16, progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"inf/NaN at layer 0's output"):
        prune(model, {1: [0]}, calibration=windows, progress=False)
    assert model.layers[1].attn.n_heads == 4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
