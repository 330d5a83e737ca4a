"""`headcount export --to vllm`: per-layer K/V head counts as vLLM's Nemotron-NAS (DeciLM) checkpoint, read back
by headcount with the same logits, served by vLLM with the same greedy tokens where `.venv-vllm` exists."""

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headcount.cli import app
from headcount.head_surgery import merge_kv_heads
from headcount.models import load
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.formats.native import save
from headcount.models.formats.vllm_deci import REMOTE_CODE_FILE, VllmExportError, export_vllm

runner = CliRunner()
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def tiny(family="llama", n_layers=3, n_heads=4, n_kv=2, head_dim=32, seed=0):
    """head_dim 32: vLLM's CPU attention has no kernel for narrower heads. Weights of std 0.1 so that the greedy
    tokens are not ties."""
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=96, d_model=64, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                        head_dim=head_dim, d_ff=96, max_position=128, family=family, qkv_bias=family == "qwen2",
                        tie_embeddings=family == "qwen2")
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.1)
    return model


def merged(family="llama"):
    model = tiny(family)
    merge_kv_heads(model.layers[0].attn, 1)  # layer 0: MQA, layers 1-2: 2 K/V heads
    return model


def ids(n=2, t=24, seed=3):
    return torch.randint(0, 96, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_deci_round_trip(tmp_path, family):
    model = merged(family)
    plan = export_vllm(model, tmp_path / "v")
    assert plan["form"] == "deci" and plan["kv_heads"] == [1, 2, 2] and plan["n_heads_in_group"] == [4, 2, 2]
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["architectures"] == ["DeciLMForCausalLM"] and cfg["model_type"] == "nemotron-nas"
    assert [b["attention"]["n_heads_in_group"] for b in cfg["block_configs"]] == [4, 2, 2]
    assert (tmp_path / "v" / REMOTE_CODE_FILE).is_file()
    back = load(tmp_path / "v")
    assert [layer.attn.n_kv_heads for layer in back.layers] == [1, 2, 2]
    with torch.no_grad():
        assert (back(ids()).logits - model(ids()).logits).abs().max().item() < 1e-5


def test_remote_config_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    export_vllm(merged(), tmp_path / "v")
    cfg = transformers.AutoConfig.from_pretrained(tmp_path / "v", trust_remote_code=True)
    assert [b.attention.n_heads_in_group for b in cfg.block_configs] == [4, 2, 2]
    assert not hasattr(cfg.block_configs[0].ffn, "ffn_mult")  # vLLM would take ffn_mult over intermediate_size


def test_groups_out_of_order_are_reordered_exactly(tmp_path):
    model = tiny(n_heads=4, n_kv=2)
    attn = model.layers[1].attn
    merge_kv_heads(model.layers[0].attn, 1)
    # query heads 1 and 2 swapped: groups {0, 2} and {1, 3}, equal in size, not contiguous
    perm = [0, 2, 1, 3]
    with torch.no_grad():
        hd = attn.head_dim
        w = attn.qkv_proj.weight
        q = w[: 4 * hd].view(4, hd, -1)[perm].reshape(4 * hd, -1).clone()
        w[: 4 * hd] = q
        o = attn.o_proj.weight
        o.copy_(o.view(o.shape[0], 4, hd)[:, perm].reshape(o.shape[0], 4 * hd).clone())
    attn.kv_head_of = tuple(i // 2 for i in perm)
    attn.kv_index = torch.tensor(attn.kv_head_of)  # the kernels' map for groups out of order
    assert not attn.is_uniform
    export_vllm(model, tmp_path / "v")
    with torch.no_grad():
        want = model(ids()).logits
        got = load(tmp_path / "v")(ids()).logits
    assert (got - want).abs().max().item() < 1e-5


def test_uniform_model_is_the_family_checkpoint(tmp_path):
    model = tiny()
    for layer in model.layers:
        merge_kv_heads(layer.attn, 1)
    plan = export_vllm(model, tmp_path / "v")
    assert plan["form"] == "family"
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 1
    assert not (tmp_path / "v" / REMOTE_CODE_FILE).exists()


def test_refusals_write_nothing(tmp_path):
    model = tiny()
    model.layers[0].attn.prune_heads([3])  # 3 query heads in layer 0, 4 elsewhere
    with pytest.raises(VllmExportError, match="one query-head count"):
        export_vllm(model, tmp_path / "a")
    model = tiny(n_heads=6, n_kv=3)
    for layer in model.layers:
        layer.attn.prune_heads([0])  # 5 query heads everywhere, groups of 1, 2, 2
    with pytest.raises(VllmExportError, match="3 K/V heads for 5 query heads"):
        export_vllm(model, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_cli_export_to_vllm(tmp_path):
    save(merged(), tmp_path / "saved")
    result = runner.invoke(app, ["export", "--model", str(tmp_path / "saved"), "--to", "vllm",
                                 "--out", str(tmp_path / "v")])
    assert result.exit_code == 0, result.output
    assert "DeciLMForCausalLM" in result.output and "trust_remote_code=True" in result.output
    bad = tiny()
    bad.layers[0].attn.prune_heads([3])
    save(bad, tmp_path / "bad")
    result = runner.invoke(app, ["export", "--model", str(tmp_path / "bad"), "--to", "vllm",
                                 "--out", str(tmp_path / "w")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "one query-head count" in line and "--uniform" in line and "gguf" in line
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM is not installed (`make vllm` creates .venv-vllm)")
def test_vllm_serves_the_export_with_headcounts_tokens(tmp_path):
    from headcount.engines.vllm_engine import run_worker

    model = merged()
    export_vllm(model, tmp_path / "v")
    prompts = ids(2, 16).tolist()
    answer = run_worker({"model": str(tmp_path / "v"), "max_model_len": 64, "max_num_seqs": 2,
                         "jobs": [{"kind": "greedy", "prompts": prompts, "max_tokens": 32, "logprobs": 1}]},
                        timeout=600)
    rows = answer["jobs"][0]["rows"]
    from headcount.models.generation import generate

    for prompt, row in zip(prompts, rows):
        want = generate(model, prompt, 32, stop_at_eos=False).new_ids
        assert row["tokens"] == want
        with torch.no_grad():  # logprobs of the same tokens, teacher-forced
            full = torch.tensor([prompt + want])
            lp = torch.log_softmax(model(full).logits[0].double(), -1)
            mine = [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(want)]
        assert max(abs(a - b) for a, b in zip(mine, row["logprobs"])) < 1e-3
    # per-layer K/V heads reach vLLM's cache: 1 + 2 + 2 heads x 32 x (K and V) x 4 bytes per token
    assert answer["kv_bytes_per_token"] == 5 * 32 * 2 * 4
