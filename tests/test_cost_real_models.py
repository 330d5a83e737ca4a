"""The parameter formulas against the real models of headcount.models."""

import pytest

from headcount.cost import get_preset, param_counts

pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_real_model_parameters_equal_formula(name):
    from headcount.models import load

    model = load(name)
    want = param_counts(get_preset(name).shape)
    assert sum(p.numel() for p in model.parameters()) == want["total"]
    for layer in model.layers:
        assert sum(p.numel() for p in layer.attn.parameters()) == want["attention_per_layer"]
