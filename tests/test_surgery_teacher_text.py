"""Healing on the teacher's own text (surgery/healing/teacher_text.py): samples continue calibration prompts, are
reproducible from their seed, and `headcount heal --calibration teacher` distils on them."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from conftest import tiny_byte_decoder
from headcount.analysis.batches import calibration_batches
from headcount.cli import app
from headcount.surgery import prune, save
from headcount.surgery.healing.teacher_text import teacher_texts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_samples_continue_calibration_prompts_and_repeat_with_their_seed():
    model = tiny_byte_decoder()
    texts = teacher_texts(model, 100, prompt_tokens=8, new_tokens=12, batch_size=3, progress=False)
    assert len(texts) == 5  # ceil(100 / (8 + 12))
    prompts = [row.tolist() for b in calibration_batches(model, "mixed", n_windows=5, window=8, batch_size=5)
               for row in b.ids]
    for text, prompt in zip(texts, prompts):
        assert text.startswith(model.tokenizer.decode(prompt))
        assert len(model.tokenizer.encode(text, add_special_tokens=False)) > len(prompt)
    assert teacher_texts(model, 100, prompt_tokens=8, new_tokens=12, batch_size=3, progress=False) == texts
    # a random tiny model is near-greedy at temperature 1: flatten it to see the seed matter
    hot = dict(prompt_tokens=8, new_tokens=12, temperature=3.0, progress=False)
    assert teacher_texts(model, 100, seed=1, **hot) != teacher_texts(model, 100, seed=2, **hot)


@pytest.mark.parametrize("kwargs,match", [({"tokens": 0}, "tokens"), ({"tokens": 10, "temperature": 0.0},
                                                                       "temperature"),
                                          ({"tokens": 10, "prompt_tokens": 128}, "prompt_tokens")])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        teacher_texts(tiny_byte_decoder(), progress=False, **kwargs)


def test_heal_on_the_teachers_text_from_the_command_line(tmp_path):
    torch.manual_seed(0)
    teacher = tiny_byte_decoder(max_position=512)
    child = copy.deepcopy(teacher)
    prune(child, {0: [1]}, compensate="none")
    save(teacher, tmp_path / "teacher")
    save(child, tmp_path / "child")
    result = CliRunner().invoke(app, ["heal", "--model", str(tmp_path / "child"), "--teacher",
                                      str(tmp_path / "teacher"), "--calibration", "teacher", "--steps", "1",
                                      "--tokens", "5120", "--eval-windows", "1", "--out", str(tmp_path / "healed"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["calibration"] == "teacher" and data["steps"] == 1
    assert set(data["held_out"]) == {"before_edit", "after_edit", "after_heal"}
    saved = json.loads((tmp_path / "healed" / "headcount.json").read_text())
    assert saved["healing"]["calibration"] == "teacher"
