"""surgery.save -> models.load: bit-identical models, atomic writes, disagreeing files named."""

import copy
import json

import pytest
import torch

from headcount.models import CheckpointError, load
from headcount.models.encoder import Encoder, EncoderConfig
from headcount.surgery import prune, save
from test_surgery_prune import tiny, windows


def test_uneven_pruned_decoder_round_trips_bit_identically(tmp_path):
    model = tiny(o_bias=False)
    prune(model, {0: [1], 1: [0, 1, 2], 2: [5]}, compensate="lstsq", calibration=windows(3, 16))
    assert not model.layers[0].attn.is_uniform and model.layers[0].attn.o_proj.bias is not None
    save(model, tmp_path / "m")
    back = load(tmp_path / "m", dtype=torch.float64)
    ids = windows(2, 20, seed=5)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, back(ids).logits)
    for a, b in zip(model.layers, back.layers):
        assert (a.attn.kept_heads, a.attn.kv_head_of, a.attn.n_kv_heads) == \
               (b.attn.kept_heads, b.attn.kv_head_of, b.attn.n_kv_heads)
    # a reloaded model prunes on in original indices
    prune(back, {0: [2]}, compensate="none")
    assert back.layers[0].attn.kept_heads == (0, 3, 4, 5)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary sibling left


def test_existing_directory_is_refused_unless_force(tmp_path):
    model = tiny()
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists"):
        save(model, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    save(model, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["headcount.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_config_and_tensors_that_disagree_are_named(tmp_path):
    model = tiny()
    prune(model, {1: [4]}, compensate="none")
    save(model, tmp_path / "m")
    meta_path = tmp_path / "m" / "headcount.json"
    meta = json.loads(meta_path.read_text())
    meta["layers"][1] = meta["layers"][0]  # claims layer 1 kept all 6 heads
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"layers\.1\.attn\.(qkv|o)_proj\.weight.*layer 1 has n_heads=6"):
        load(tmp_path / "m")
    meta["layers"][1] = {**meta["layers"][1], "kv_head_of": [0, 0, 0, 1, 1, 5]}
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="layer 1: kv_head_of"):
        load(tmp_path / "m")


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    model = tiny()
    save(model, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["layers.2.attn.o_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="layers.2.attn.o_proj.weight' is missing"):
        load(tmp_path / "m")


def test_encoder_with_tokenizer_round_trips(tmp_path, minilm):
    model = copy.deepcopy(minilm)
    prune(model, {0: [0, 5, 11], 3: [2]}, compensate="none")
    save(model, tmp_path / "e")
    back = load(tmp_path / "e")
    assert isinstance(back, Encoder) and back.tokenizer is not None
    sentences = ["Heads can be removed.", "A second, longer sentence about attention heads."]
    assert torch.equal(model.embed_sentences(sentences), back.embed_sentences(sentences))


def test_tiny_encoder_round_trip(tmp_path):
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=40, max_position=32)).eval()
    prune(model, {1: [0, 3]}, compensate="mean", calibration=[(torch.randint(0, 50, (3, 10)), None)])
    save(model, tmp_path / "e")
    back = load(tmp_path / "e")
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, back(ids).last_hidden_state)
