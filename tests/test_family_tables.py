"""The tables that must gain an entry with every family the formats read (models/formats/families.py): the cost
accounts' families (cost/shape.py) and the exactness rows against transformers (models/exactness.py). A family
added to the formats alone fails here, instead of being counted as another model or never compared."""

import pytest

from headcount.cost.shape import from_config, known_model_types
from headcount.models import exactness
from headcount.models.formats.families import FAMILIES

# families whose exactness against transformers is not a random row of RANDOM_FAMILIES, and where it is instead
COMPARED_ELSEWHERE = {
    "bert": "an encoder: the minilm row of `headcount bench exactness` (a real BERT checkpoint)",
    "gpt2": "its Family names no transformers classes: tests/test_models_convert.py compares GPT2LMHeadModel",
}


def test_every_format_family_is_counted_by_cost():
    missing = {f.name: mt for f in FAMILIES.values() for mt in f.model_types if mt not in known_model_types()}
    assert not missing, f"cost/shape.py _FAMILIES lacks these model_types: {missing}"


def test_every_format_family_has_an_exactness_row():
    compared = {cfg_cls for cfg_cls, _, _ in exactness.RANDOM_FAMILIES.values()}
    missing = [f.name for f in FAMILIES.values() if f.name not in COMPARED_ELSEWHERE
               and (f.classes is None or f.classes[0] not in compared)]
    assert not missing, f"models/exactness.py RANDOM_FAMILIES lacks a row for: {missing}"
    assert set(COMPARED_ELSEWHERE) <= set(FAMILIES)  # an exemption for a family that no longer exists goes too


def test_olmo2_counts_match_transformers_on_the_meta_device(tmp_path):
    """OLMo 2's entry: full-width q/k norms ((n_heads + n_kv_heads) x head_dim weights each), counted as
    transformers builds the model (parameters counted on the meta device: no weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Olmo2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256)
    cfg.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.Olmo2ForCausalLM(cfg)
    from headcount.cost.accounts import param_counts

    shape = from_config(tmp_path)
    assert shape.qk_norm and shape.qk_norm_full
    assert param_counts(shape)["total"] == sum(p.numel() for p in model.parameters())
