"""A model with attention sublayers dropped, exported where the target holds it and read back with the same logits:
vLLM's Nemotron-NAS (`attention: {no_op: true}` blocks), llama.cpp's deci (head_count 0 and head_count_kv 0 for the
layer, no attn_* tensors); the KV bytes each target's accounts give equal what headcount allocates; transformers
(every layer with attention) refuses it in one line. The engines' own runs skip where they are not installed."""

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gguf
from headcount.cli import app
from headcount.cost.edited import read_edited, totals
from headcount.models import load
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.models.formats.gguf_deci import export_gguf, plan_gguf_export
from headcount.models.formats.hf import export_transformers
from headcount.models.formats.native import save
from headcount.models.formats.vllm_deci import VllmExportError, export_vllm

sys.path.insert(0, str(Path(__file__).parent))
from test_gguf_export import tiny as gguf_tiny, vocab_gguf  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
NODE_LLAMA = ROOT / "tools" / "llamacpp" / "node_modules" / "node-llama-cpp"


def tiny(family="llama", n_layers=4, vocab=96, seed=0):
    """head_dim 32 (vLLM's CPU attention has no kernel for narrower heads); weights of std 0.1."""
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=vocab, d_model=64, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=32,
                        d_ff=96, max_position=128, family=family, qkv_bias=family == "qwen2",
                        tie_embeddings=family == "qwen2")
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.1)
    return model


def ids(n=2, t=20, vocab=96, seed=7):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def same_logits(a, b, x):
    with torch.no_grad():
        torch.testing.assert_close(a(x).logits, b(x).logits, rtol=1e-5, atol=1e-5)


def measured_kv(model) -> int:
    return sum(c.nbytes for c in model.new_cache(1, 1))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_vllm_export_writes_no_op_blocks_and_reads_back(tmp_path, family):
    model = tiny(family)
    for i in (1, 3):
        model.layers[i].drop_attention()
    plan = export_vllm(model, tmp_path / "v")
    assert plan["form"] == "deci" and plan["dropped_layers"] == [1, 3]
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert [b["attention"]["no_op"] for b in cfg["block_configs"]] == [False, True, False, True]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "v" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert not [n for n in names if n.startswith(("model.layers.1.self_attn", "model.layers.1.input_layernorm"))]
    assert "model.layers.1.mlp.down_proj.weight" in names and "model.layers.0.self_attn.q_proj.weight" in names
    back = load(str(tmp_path / "v"))
    assert back.dropped_layers == (1, 3)
    same_logits(back, model, ids())
    # fp32 K/V bytes per token: the plan's, the accounts' of the export, and the caches headcount allocates
    assert plan["kv_bytes_per_token_fp32"] == measured_kv(model) == 2 * (2 * 2 * 32 * 4)
    assert totals(read_edited(tmp_path / "v"), dtype="fp32")["kv_bytes_per_token"] == measured_kv(model)


def test_vllm_refuses_an_attention_free_first_layer(tmp_path):
    model = tiny()
    model.layers[0].drop_attention()
    with pytest.raises(VllmExportError, match="layer 0's attention was dropped"):
        export_vllm(model, tmp_path / "v")
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("dropped", [(1,), (0, 2)])
def test_gguf_deci_writes_attention_free_blocks_and_reads_back(tmp_path, vocab_gguf, dropped):
    model = gguf_tiny(n_layers=3)
    for i in dropped:
        model.layers[i].drop_attention()
    plan = plan_gguf_export(model)
    assert plan["architecture"] == "deci" and plan["layouts"] == ["dropped" if i in dropped else "uniform"
                                                                  for i in range(3)]
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_from=vocab_gguf)
    reader = gguf.GGUFReader(str(path))
    heads = list(reader.fields["deci.attention.head_count"].contents())
    kv = list(reader.fields["deci.attention.head_count_kv"].contents())
    assert heads == [0 if i in dropped else 9 for i in range(3)] and kv == [0 if i in dropped else 3 for i in range(3)]
    names = {t.name for t in reader.tensors}
    for i in dropped:  # llama.cpp's deci creates no attention tensor (nor attn_norm) where n_head is 0
        assert not [n for n in names if n.startswith(f"blk.{i}.attn")]
        assert f"blk.{i}.ffn_down.weight" in names and f"blk.{i}.ffn_norm.weight" in names
    back = load(str(path))  # headcount's own reader of the deci file
    assert back.dropped_layers == tuple(dropped)
    same_logits(back, model, ids(vocab=model.config.vocab_size))
    # llama.cpp's f16 cache by the plan: only the layers with attention (3 K/V heads of 8)
    assert plan["kv_bytes_per_token_llama_cpp"] == (3 - len(dropped)) * 2 * 3 * 8 * 2
    assert plan["kv_bytes_per_token_model"] * 2 == measured_kv(model)  # the same heads in fp32


def test_transformers_refuses_and_the_cli_says_so_in_one_line(tmp_path):
    model = tiny()
    model.layers[2].drop_attention()
    with pytest.raises(ValueError, match=r"layers \[2\] have no attention .* LlamaForCausalLM"):
        export_transformers(model, tmp_path / "hf")
    save(model, tmp_path / "saved")
    result = runner.invoke(app, ["export", "--model", str(tmp_path / "saved"), "--to", "transformers",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "no attention" in line and "--to vllm" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "hf").exists()


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM is not installed (`make vllm` creates .venv-vllm)")
def test_vllm_serves_the_dropped_model_with_headcounts_tokens_and_kv(tmp_path):
    from headcount.engines.vllm_engine import run_worker
    from headcount.models.generation import generate

    model = tiny()
    model.layers[2].drop_attention()
    export_vllm(model, tmp_path / "v")
    prompts = ids(2, 16).tolist()
    answer = run_worker({"model": str(tmp_path / "v"), "max_model_len": 64, "max_num_seqs": 2,
                         "jobs": [{"kind": "greedy", "prompts": prompts, "max_tokens": 16, "logprobs": 1}]},
                        timeout=600)
    for prompt, row in zip(prompts, answer["jobs"][0]["rows"]):
        assert row["tokens"] == generate(model, prompt, 16, stop_at_eos=False).new_ids
    assert answer["kv_bytes_per_token"] == measured_kv(model)  # 3 layers of 2 K/V heads x 32, fp32


@pytest.mark.skipif(not NODE_LLAMA.is_dir(), reason="node-llama-cpp is not installed (`make llamacpp`)")
def test_llamacpp_serves_the_dropped_model_with_the_kv_the_accounts_predict(tmp_path):
    from headcount.models.zoo import smollm2_gguf

    model = tiny(vocab=49152, n_layers=2)  # smollm2's vocabulary: llama.cpp needs a tokenizer, copied from its GGUF
    model.source_gguf = smollm2_gguf()
    save(model, tmp_path / "base")
    model.layers[1].drop_attention()
    save(model, tmp_path / "dropped")
    result = runner.invoke(app, ["bench", "serve", "--model", str(tmp_path / "base"), "--edited",
                                 str(tmp_path / "dropped"), "--engines", "llamacpp", "--context", "40", "--batch", "1",
                                 "--new-tokens", "4", "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout[result.stdout.index("{"):])["rows"]
    by = {r["edited"] is not None: r["kv_bytes"] for r in rows}
    cells = 40 + 4 - 1  # f16 cache: 2 K/V heads x 32 x (K and V) x 2 bytes per layer with attention, per cell
    assert 512 * cells <= by[False] <= 512 * cells + 16 * cells + 256
    assert 256 * cells <= by[True] <= 256 * cells + 16 * cells + 256
