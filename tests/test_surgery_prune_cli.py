"""`headcount prune` / `headcount export`: the JSON contract and every bad input (exit 2, one line,
no traceback, nothing written)."""

import json

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.surgery import prune, save
from test_surgery_prune import tiny

runner = CliRunner()

PRUNE_KEYS = {"heads_before", "heads_after", "params_before", "params_after", "kv_bytes_per_token_before",
              "kv_bytes_per_token_after", "ppl_before", "ppl_after"}


def bad(args, match):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and match in lines[0], result.output
    return result


def test_existing_out_without_force_writes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    bad(["prune", "--model", "smollm2", "--fraction", "0.2", "--out", str(out)], "already exists")
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"  \n\n ", "empty"), (b"\xff\xfe bad", "not UTF-8")])
def test_bad_text_files(tmp_path, content, match):
    text = tmp_path / "t.txt"
    text.write_bytes(content)
    bad(["prune", "--fraction", "0.2", "--text", str(text), "--out", str(tmp_path / "o")], match)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,match", [
    (["--fraction", "1.5"], "--fraction"),
    (["--fraction", "0"], "--fraction"),
    (["--fraction", "0.2", "--mode", "kv"], "--mode"),
    (["--fraction", "0.2", "--compensate", "median"], "--compensate"),
    (["--fraction", "0.2"], "--out"),
])
def test_bad_options(tmp_path, args, match):
    bad(["prune", *args] + ([] if match == "--out" else ["--out", str(tmp_path / "o")]), match)
    assert not (tmp_path / "o").exists()


def test_export_of_a_saved_directory_whose_config_and_tensors_disagree(tmp_path):
    model = tiny()
    prune(model, {1: [4]}, compensate="none")
    save(model, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "headcount.json").read_text())
    meta["layers"][1]["n_heads"] = 6
    meta["layers"][1]["kv_head_of"] = [0, 0, 0, 1, 1, 1]
    meta["layers"][1]["kept_heads"] = list(range(6))
    (tmp_path / "m" / "headcount.json").write_text(json.dumps(meta))
    bad(["export", "--model", str(tmp_path / "m"), "--to", "transformers", "--out", str(tmp_path / "hf")],
        "layer 1 has n_heads=6")
    assert not (tmp_path / "hf").exists()
    bad(["export", "--model", str(tmp_path / "m"), "--to", "onnx", "--out", str(tmp_path / "hf")], "--to")


def test_export_refuses_per_layer_counts(tmp_path):
    model = tiny(d_model=48)
    prune(model, {1: [4]}, compensate="none")
    save(model, tmp_path / "m")
    bad(["export", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "hf")], "different head counts")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_prune_minilm_json_contract_then_reload(tmp_path):
    out = tmp_path / "pruned"
    result = runner.invoke(app, ["prune", "--model", "minilm", "--fraction", "0.25", "--compensate", "none",
                                 "--order", "random", "--out", str(out), "--json", "--eval-windows", "2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert PRUNE_KEYS <= set(data)
    assert data["heads_before"] == 72 and data["heads_after"] == 54
    assert data["params_after"] < data["params_before"]
    assert data["kv_bytes_per_token_after"] == data["kv_bytes_per_token_before"] * 54 // 72
    assert data["ppl_before"] is None and 0.5 < data["fidelity_after"]["cosine"] <= 1.0
    from headcount.models import load
    from headcount.models.fingerprint import weights_hash
    # what a saved result is keyed by (the weights before the edit) and the command that produced it
    assert data["weights_sha256"] == weights_hash(load("minilm"))
    assert data["command"] == (f"headcount prune --model minilm --fraction 0.25 --compensate none --order random "
                               f"--out {out} --eval-windows 2 --json")
    back = load(out)
    assert sum(layer.attn.n_heads for layer in back.layers) == 54
    again = runner.invoke(app, ["prune", "--model", "minilm", "--fraction", "0.25", "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output


def test_saved_directory_works_as_model_everywhere(tmp_path, minilm):
    """`headcount perplexity / generate --model DIR` on a pruned, saved decoder (a tiny one carrying
    minilm's tokenizer so the commands can tokenize)."""
    import torch
    from headcount.models.decoder import Decoder, DecoderConfig

    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=minilm.tokenizer.vocab_size, d_model=16, n_layers=2, n_heads=4,
                                  n_kv_heads=2, head_dim=4, d_ff=24, max_position=64, eos_token_id=102)).eval()
    model.tokenizer = minilm.tokenizer
    prune(model, {0: [1], 1: [2, 3]}, compensate="none")
    save(model, tmp_path / "m")
    text = tmp_path / "t.txt"
    text.write_text("Heads can be removed from a trained model. " * 8)
    result = runner.invoke(app, ["perplexity", "--model", str(tmp_path / "m"), "--text", str(text), "--window", "32",
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["perplexity"] > 1 and data["n_windows"] >= 2
    gen = runner.invoke(app, ["generate", "heads", "--model", str(tmp_path / "m"), "-n", "3", "--no-stop"])
    assert gen.exit_code == 0, gen.output


def test_bench_surgery_from_prints_a_saved_curve_without_measuring(tmp_path):
    # a curve as bench.run writes it: two random seeds fold into their mean and spread
    points = [{"fraction": 0.1, "order": "random", "compensate": "lstsq", "seed": s, "ppl": p,
               "ppl_by_text": {"prose": p, "code": 2 * p}} for s, p in ((0, 11.0), (1, 13.0))]
    saved = {"prune": {"smollm2_curve": {"model": "smollm2", "base_ppl": 10.0, "points": points,
                                         "base_by_text": {"prose": 10.0, "code": 20.0}}}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(saved))
    result = runner.invoke(app, ["bench", "surgery", "--from", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "12.00 (+20%) [11.0-13.0]" in result.output  # mean 12 of 11 and 13, +20% on base 10
    assert "24.00 (+20%) [22.0-26.0]" in result.output  # the code text, base 20


def test_bench_surgery_refuses_unknown_orders_before_measuring():
    bad(["bench", "surgery", "--part", "prune", "--orders", "gradient,bogus"], "bogus")


@pytest.mark.parametrize("content,match", [("not json", "--from"), ('{"other": 1}', "--from")])
def test_bench_surgery_from_refuses_what_save_did_not_write(tmp_path, content, match):
    path = tmp_path / "bench.json"
    path.write_text(content)
    bad(["bench", "surgery", "--from", str(path)], match)


def test_prune_reports_every_held_out_domain_its_cost_and_the_fraction_removed(tmp_path):
    """--uniform says up front that it removes more than asked (one head of every GQA group: 33.3%
    of smollm2's groups of three at 0.2; here conftest's tiny decoder, 2 layers of two groups of two query heads,
    saved as `--model DIR` loads it: 50% at 0.3); --json carries forward_equivalents, seconds, the fraction
    actually removed and the held-out perplexity on prose, code and standard-library source (which nothing
    calibrates on); --dtype bf16 saves bf16 weights. The counts are the model's shape; no real model needed."""
    from conftest import tiny_byte_decoder

    model = tiny_byte_decoder(max_position=512)  # the held-out windows are 512 tokens
    save(model, tmp_path / "tiny")
    heads = sum(layer.attn.n_heads for layer in model.layers)
    groups = sum(layer.attn.n_kv_heads for layer in model.layers)  # uniform: one query head of each goes
    result = runner.invoke(app, ["prune", "--model", str(tmp_path / "tiny"), "--fraction", "0.3", "--uniform",
                                 "--order", "random", "--compensate", "none", "--out", str(tmp_path / "p"), "--json",
                                 "--eval-windows", "1", "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    assert (f"removing {groups} of {heads} query heads ({groups / heads:.1%}), not the 30.0% asked"
            in result.output)
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert set(data["ppl_by_domain_before"]) == {"prose", "code", "source"}
    assert data["ppl_by_domain_before"]["prose"] == data["ppl_before"]
    assert data["fraction_removed"] == round(groups / heads, 4) and data["forward_equivalents"] == 0  # random, no refit
    assert data["seconds"] > 0
    from safetensors import safe_open
    with safe_open(str(tmp_path / "p" / "model.safetensors"), "pt") as f:
        assert f.get_slice("embed.weight").get_dtype() == "BF16"


def test_bad_dtype_and_device_are_one_line(tmp_path):
    bad(["prune", "--fraction", "0.2", "--dtype", "fp8", "--out", str(tmp_path / "x")], "--dtype")
    import torch as _t
    if not _t.cuda.is_available():
        bad(["prune", "--fraction", "0.2", "--device", "cuda", "--out", str(tmp_path / "x")], "--device")
    assert not (tmp_path / "x").exists()
