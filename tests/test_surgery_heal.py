"""Healing: the chunked distillation loss against full-logit KL, healing lowers the KL to the
teacher on held-aside windows, LoRA merged back = the unmerged peft model, the teacher never moves, and the
CLI's bad inputs (one line, exit 2, nothing written) and interrupted heal (no --out)."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from headcount.cli import app
from headcount.models.copying import attention_copy
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import heal, prune, save
from headcount.surgery.healing.loop import BATCH_SIZE, WINDOW
from headcount.surgery.healing.loss import distill_kl
from headcount.surgery.healing.weights import Mover, check_teacher, check_trainable_dtype

runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine two spinning threads
    make them many times slower (tests/test_families_arch.py measured it): one thread, restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(seed=0, vocab=64, d_model=32, n_layers=2, max_position=64, tokenizer=None):
    torch.manual_seed(seed)
    cfg = DecoderConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8,
                        d_ff=48, max_position=max_position, rope_theta=10000.0, norm_eps=1e-5)
    model = Decoder(cfg).eval()
    with torch.no_grad():  # default init gives near-uniform next-token distributions: sharpen them
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2)
    model.tokenizer = tokenizer
    return model


def windows(n, t=32, seed=1, vocab=64):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def full_kl(student, teacher, ids) -> float:
    """The independent truth: full [B, T, vocab] logits, F.kl_div, mean over positions."""
    with torch.no_grad():
        s = F.log_softmax(student(ids).logits.double(), -1).reshape(-1, student.config.vocab_size)
        t = F.log_softmax(teacher(ids).logits.double(), -1).reshape(-1, student.config.vocab_size)
        return float(F.kl_div(s, t, log_target=True, reduction="batchmean"))


class _Head(torch.nn.Linear):
    """Not exactly nn.Linear: distill_kl's checkpointed path (as for Gemma 2's soft-capped head)."""


@pytest.mark.parametrize("head", [torch.nn.Linear, _Head])  # the fused path and the checkpointed one
def test_chunked_kl_equals_full_logits_kl_and_its_gradient(head):
    torch.manual_seed(0)
    head_s, head_t = head(16, 50, bias=False).double(), head(16, 50, bias=False).double()
    h_s, h_t = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True), torch.randn(2, 7, 16, dtype=torch.float64)
    chunked = distill_kl(h_s, h_t, head_s, head_t, chunk=3)
    full = F.kl_div(F.log_softmax(head_s(h_s), -1).reshape(-1, 50), F.log_softmax(head_t(h_t), -1).reshape(-1, 50),
                    log_target=True, reduction="sum")
    g_chunked = torch.autograd.grad(chunked, [h_s, head_s.weight])
    g_full = torch.autograd.grad(full, [h_s, head_s.weight])
    assert torch.allclose(chunked.double(), full, rtol=1e-5)
    for a, b in zip(g_chunked, g_full):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_healing_a_pruned_model_lowers_its_kl_on_held_aside_windows(params="attention"):
    teacher = tiny()
    model = attention_copy(teacher)
    prune(model, {0: [1, 2], 1: [0]}, compensate="none")
    aside = windows(6, seed=99)  # never seen by the heal (its calibration and validation windows are seed 1)
    before = full_kl(model, teacher, aside)
    frozen = {k: v.clone() for k, v in teacher.state_dict().items()}
    r = heal(model, teacher, steps=40, tokens=24 * 32, calibration=windows(24), window=32, batch_size=4,
             validation_windows=4, params=params, lr=3e-3, patience=10,
             held_out=False, progress=False)
    after = full_kl(model, teacher, aside)
    assert after < 0.92 * before, (before, after)
    assert r.steps >= 1 and r.tokens == 24 * 32 and r.val_best <= r.val_first
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in frozen.items())  # the teacher never moved
    assert all(p.requires_grad for p in model.parameters())  # every flag restored


def test_a_measurement_with_no_new_best_goes_back_to_the_best_weights_at_half_the_lr():
    """An lr far too high: the first measurements find nothing better than the edit. Each sends the run back
    to the best weights with the lr halved (recorded in lr_backoffs) until `patience` in a row end it; the
    weights kept are the best measured, so healing never hands back worse than the edit on validation."""
    teacher = tiny()
    model = attention_copy(teacher)
    prune(model, {0: [1, 2], 1: [0]}, compensate="none")
    val = windows(24)[-4:]  # the validation split: heal keeps the last validation_windows windows aside

    def val_kl() -> float:  # heal's validation figure, written out: every position that predicts a next token
        with torch.no_grad():
            s_ = F.log_softmax(model(val).logits[:, :-1].double(), -1).reshape(-1, 64)
            t_ = F.log_softmax(teacher(val).logits[:, :-1].double(), -1).reshape(-1, 64)
        return float(F.kl_div(s_, t_, log_target=True, reduction="batchmean"))

    first = val_kl()
    r = heal(model, teacher, steps=40, tokens=24 * 32, calibration=windows(24), window=32, batch_size=4,
             validation_windows=4, lr=5.0, eval_every=4, patience=3, held_out=False, progress=False)
    assert r.backoffs, r.val_losses
    lrs = [lr for _, lr in r.backoffs]
    assert lrs[0] == pytest.approx(2.5) and all(b == pytest.approx(a / 2) for a, b in zip(lrs, lrs[1:]))
    assert r.to_json()["lr_backoffs"] == [[s, v] for s, v in r.backoffs]
    # every backoff happened at a measurement that was no new best, and the weights kept are the best measured
    best = dict(r.val_losses)
    assert all(best[s] > r.val_best for s, _ in r.backoffs)
    assert r.val_first == pytest.approx(first, rel=1e-4)
    assert val_kl() == pytest.approx(r.val_best, rel=1e-4) and r.val_best <= first * (1 + 1e-6)


def test_the_default_lr_is_a_relative_step():
    """AdamW moves a weight by ~lr whatever its size: weights 10x smaller get a 10x smaller default lr (the
    formula: DEFAULT_LR x RMS / REFERENCE_RMS, capped at DEFAULT_LR), and heal() uses it."""
    from headcount.surgery.healing.loop import DEFAULT_LR, REFERENCE_RMS, default_lr

    big = tiny()
    with torch.no_grad():
        for layer in big.layers:
            layer.attn.qkv_proj.weight.fill_(2 * REFERENCE_RMS)
            layer.attn.o_proj.weight.fill_(-2 * REFERENCE_RMS)
    assert default_lr(big, "attention") == DEFAULT_LR["attention"]  # never scaled up
    small = copy.deepcopy(big)
    with torch.no_grad():
        for layer in small.layers:
            layer.attn.qkv_proj.weight.fill_(REFERENCE_RMS / 10)
            layer.attn.o_proj.weight.fill_(-REFERENCE_RMS / 10)
    for params in ("attention", "all", "lora"):
        assert default_lr(small, params) == pytest.approx(DEFAULT_LR[params] / 10, rel=1e-6)  # fp32 weights
    student = attention_copy(small)
    prune(student, {0: [1]}, compensate="none")
    result = heal(student, small, steps=1, tokens=10 * 32, calibration=windows(10), window=32,
                  validation_windows=2, held_out=False, progress=False)
    assert result.lr == pytest.approx(DEFAULT_LR["attention"] / 10, rel=1e-6)


def test_every_default_weight_lr_is_the_same_relative_step():
    """One truth for decoders: merge-kv's uptrain and the joint gates' weights take their default lr through the
    same scaling as heal's (relative_lr on the unedited model): 10x smaller attention weights, a 10x smaller lr
    for each. (An encoder's joint gates keep DEFAULT_LR: relative_lr.)"""
    from headcount.surgery.healing.loop import DEFAULT_LR, REFERENCE_RMS
    from headcount.surgery.merging.defaults import UPTRAIN_LR
    from headcount.surgery.merging.kv_merge import merge_kv
    from headcount.surgery.pruning.gates import train_gates

    rates = {}
    for scale in (2.0, 0.1):
        model = tiny()
        with torch.no_grad():
            for layer in model.layers:
                for w in (layer.attn.qkv_proj.weight, layer.attn.o_proj.weight):
                    w.copy_(torch.sign(torch.randn_like(w)) * scale * REFERENCE_RMS)
        merged = merge_kv(copy.deepcopy(model), 1, calibration=windows(4), window=32, local_steps=0, uptrain_steps=1,
                          progress=False)
        gates = train_gates(model, heads_to_keep=4, steps=1, calibration=windows(4), window=32, progress=False,
                            joint=True)
        rates[scale] = (merged.options["uptrain_lr"], merged.uptrain["lr"], gates.weight_lr)
    assert rates[2.0] == pytest.approx((UPTRAIN_LR, UPTRAIN_LR, DEFAULT_LR["attention"]))  # never scaled up
    assert rates[0.1] == pytest.approx(tuple(r / 10 for r in rates[2.0]), rel=1e-6)
    from headcount.models.encoder import Encoder, EncoderConfig
    from headcount.surgery.healing.loop import default_lr

    encoder = Encoder(EncoderConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=40, max_position=32))
    with torch.no_grad():
        for layer in encoder.layers:
            layer.attn.qkv_proj.weight.fill_(REFERENCE_RMS / 10)
            layer.attn.o_proj.weight.fill_(REFERENCE_RMS / 10)
    assert default_lr(encoder, "attention") == DEFAULT_LR["attention"]  # an encoder's: unscaled


def test_a_lora_heal_folds_its_adapters_back():
    teacher = tiny()
    model = attention_copy(teacher)
    prune(model, {0: [1, 2], 1: [0]}, compensate="none")
    r = heal(model, teacher, steps=8, tokens=12 * 32, calibration=windows(12), window=32, validation_windows=4,
             params="lora", lr=1e-3, held_out=False, progress=False)
    assert r.val_best <= r.val_first and r.lora_rank and r.trainable_params > 0
    assert type(model.layers[0].attn.qkv_proj) is torch.nn.Linear
    assert not any("lora" in n for n, _ in model.named_parameters())


def test_all_params_unties_the_shared_tensors_and_keeps_the_students_own_ties():
    teacher = tiny()
    teacher.lm_head.weight = teacher.embed.weight  # tied, as smollm2
    model = attention_copy(teacher)
    prune(model, {0: [3]}, compensate="none")
    frozen = teacher.embed.weight.detach().clone()
    heal(model, teacher, steps=3, tokens=12 * 32, calibration=windows(12), window=32, validation_windows=4,
         params="all", lr=1e-2, held_out=False, progress=False)
    assert torch.equal(teacher.embed.weight, frozen)
    assert model.embed.weight is not teacher.embed.weight  # the student's own copy ...
    assert model.lm_head.weight is model.embed.weight  # ... still tied to its lm_head


def test_lora_merged_back_gives_the_unmerged_peft_models_logits():
    teacher = tiny()
    model = attention_copy(teacher)
    prune(model, {1: [2]}, compensate="none")
    mover = Mover(model, teacher, "lora", [0, 1])
    with torch.no_grad():
        for p in mover.trainable():
            p.normal_(0, 0.3)  # lora_B starts at zero: give the adapters something to merge
    ids = windows(2)
    with torch.no_grad():
        unmerged = mover.lora(ids).logits
        plain = mover.lora.model(ids).logits
    merged_model = mover.finish()
    with torch.no_grad():
        merged = merged_model(ids).logits
    assert not torch.allclose(unmerged, teacher(ids).logits.detach(), atol=1e-3)  # the adapters do act
    assert torch.allclose(merged, unmerged, rtol=1e-4, atol=1e-4) and torch.equal(plain, unmerged)  # fp32 sums
    assert not any("lora" in n for n, _ in merged_model.named_parameters())


def test_check_teacher_names_what_differs():
    model = tiny()
    for other, match in ((tiny(vocab=65), "vocabulary"), (tiny(d_model=40), "d_model"), (tiny(n_layers=3), "n_layers")):
        with pytest.raises(ValueError, match=f"teacher: .*{match}"):
            check_teacher(model, other)

    class Tok:
        def __init__(self, shift):
            self.shift = shift

        def encode(self, text):
            return [ord(c) + self.shift for c in text]

    with pytest.raises(ValueError, match="teacher: its tokenizer"):
        check_teacher(tiny(tokenizer=Tok(0)), tiny(tokenizer=Tok(1)))
    with pytest.raises(ValueError, match="dtype: cannot train float16 weights on cpu"):
        check_trainable_dtype(tiny().half())


# -------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random decoder with SmolLM2's tokenizer (calibration and held-out text need one), its pruned
    child, and teachers that cannot be its ancestor."""
    from headcount.models import load

    tok = load("smollm2").tokenizer
    root = tmp_path_factory.mktemp("heal")
    teacher = tiny(vocab=tok.vocab_size, max_position=512, tokenizer=tok)
    save(teacher, root / "teacher")
    child = copy.deepcopy(teacher)
    prune(child, {0: [1], 1: [2]}, compensate="none")
    save(child, root / "child")
    save(tiny(vocab=tok.vocab_size, d_model=40, max_position=512, tokenizer=tok), root / "wide")
    save(tiny(vocab=tok.vocab_size + 1, max_position=512, tokenizer=tok), root / "vocab")
    return root


def bad(args, match):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and match in lines[0], result.output


@pytest.mark.parametrize("teacher,match", [("wide", "--teacher: d_model=40"), ("vocab", "--teacher: vocabulary")])
def test_heal_refuses_a_teacher_that_is_not_the_ancestor(saved, teacher, match):
    out = saved / f"out-{teacher}"
    bad(["heal", "--model", str(saved / "child"), "--teacher", str(saved / teacher), "--out", str(out)], match)
    assert not out.exists()


def test_heal_refuses_a_dtype_the_device_cannot_train(saved):
    out = saved / "out-fp16"
    bad(["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"), "--dtype", "fp16",
         "--out", str(out)], "--dtype: cannot train float16")
    assert not out.exists()


TOKENS_10 = str(10 * WINDOW)  # ten windows of heal's default length: 8 to validate, 2 to train on


@pytest.mark.parametrize("command", [["prune", "--fraction", "0.3"], ["merge-kv", "--kv-heads", "1"]])
def test_negative_heal_steps(saved, command):
    out = saved / "out-neg"
    bad([*command, "--model", str(saved / "teacher"), "--heal-steps", "-1", "--out", str(out)], "--heal-steps")
    assert not out.exists()


def test_heal_cli_saves_metadata_and_reports_every_domain(saved):
    from headcount.models import load

    out = saved / "healed"
    result = runner.invoke(app, ["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"),
                                 "--steps", "2", "--tokens", TOKENS_10, "--eval-windows", "1", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert {"seconds", "forward_equivalents", "tokens", "steps"} <= set(data) and data["steps"] == 2
    assert (data["window"], data["batch_size"]) == (WINDOW, BATCH_SIZE)  # the defaults, recorded
    assert set(data["held_out"]) == {"before_edit", "after_edit", "after_heal"}
    assert set(data["held_out"]["after_heal"]) == {"prose", "code", "source"}
    from headcount.models.fingerprint import weights_hash
    # the unedited model's weights (the teacher's: what a saved result is keyed by), the student's, and the
    # command that produced the result
    assert data["weights_sha256"] == weights_hash(load(saved / "teacher"))
    assert data["edited_weights_sha256"] == weights_hash(load(saved / "child"))
    assert data["command"].startswith(f"headcount heal --model {saved / 'child'} --teacher {saved / 'teacher'} ")
    healed = load(out)
    assert healed.healing["teacher"] == str(saved / "teacher") and healed.healing["steps"] == 2
    assert healed.healing["moved"]["params"] == "attention" and healed.healing["tokens"] == int(TOKENS_10)


def calibrations_seen(monkeypatch) -> list:
    """The `calibration` every heal draws its windows from, recorded (loop._windows still does the work)."""
    from headcount.surgery.healing import loop

    seen, windows_of = [], loop._windows
    monkeypatch.setattr(loop, "_windows", lambda model, calibration, *a: seen.append(calibration) or
                        windows_of(model, calibration, *a))
    return seen


def heal_cli(saved, out, *flags):
    """`headcount heal` of the saved child from its teacher, 2 steps on ten windows, one held-out window, --json."""
    return runner.invoke(app, ["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"),
                               "--steps", "2", "--tokens", TOKENS_10, "--eval-windows", "1", *flags,
                               "--out", str(out), "--json"])


def test_heal_on_a_users_text_distils_its_calibration_part_and_measures_its_held_out_part(saved, monkeypatch):
    from headcount.data import corpus_from_text, default_corpus
    from headcount.models import load
    from headcount.surgery.healing import loop
    from headcount.surgery.healing.loop import held_out_figures

    text = saved / "mine.txt"
    text.write_text("\n\n".join(default_corpus().texts("calibration")[:30]), encoding="utf-8")
    corpus = corpus_from_text(text.read_text(encoding="utf-8"), name=text.name)
    seen = calibrations_seen(monkeypatch)
    out = saved / "healed-text"
    result = heal_cli(saved, out, "--text", str(text))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert seen == [corpus.texts("calibration")]  # distilled on the text's calibration paragraphs only
    for stage in ("before_edit", "after_edit", "after_heal"):
        assert set(data["held_out"][stage]) == {"prose", "code", "source", "text"}
    truth = held_out_figures(load(saved / "teacher"), 1, extra={"text": corpus.texts("held_out")}, only_extra=True)
    assert data["held_out"]["before_edit"]["text"] == pytest.approx(truth["text"], rel=1e-5)
    assert load(out).healing["calibration"] == str(text) and data["calibration"] == "text"


def test_prune_with_heal_steps_reports_after_heal(saved):
    out = saved / "pruned-healed"
    result = runner.invoke(app, ["prune", "--model", str(saved / "teacher"), "--fraction", "0.25", "--heal-steps", "2",
                                 "--calibration-windows", "2", "--eval-windows", "1", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert set(data["ppl_by_domain_healed"]) == set(data["ppl_by_domain_before"]) == {"prose", "code", "source"}
    assert data["heal"]["steps"] == 2 and data["heal"]["held_out"]["after_edit"] == data["ppl_by_domain_after"]


def test_heal_on_prose_and_source_distils_verbatim_package_files(saved, monkeypatch):
    """--calibration prose+source: windows alternate the default prose and the torch / numpy calibration files
    verbatim (the independent truth: token_windows over package_source_corpus), recorded in the JSON and metadata;
    an unknown stream, or one given with --text, is one clear line."""
    from headcount.analysis.batches import token_windows
    from headcount.data import default_corpus, package_source_corpus
    from headcount.models import load
    from headcount.surgery.healing import loop

    model = load(saved / "teacher")
    rows = loop._windows(model, "prose+source", 4, 64)
    assert torch.equal(rows[0::2], token_windows(model, default_corpus().texts("calibration"), window=64,
                                                 max_windows=2))
    assert torch.equal(rows[1::2], token_windows(model, package_source_corpus().texts("calibration"), window=64,
                                                 max_windows=2))
    seen = calibrations_seen(monkeypatch)
    out = saved / "healed-source"
    result = heal_cli(saved, out, "--calibration", "prose+source")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert seen == ["prose+source"] and data["calibration"] == "prose+source"
    assert load(out).healing["calibration"] == "prose+source"
    child = ["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"), "--out", str(saved / "x")]
    bad([*child, "--calibration", "prose"],
        "--calibration: expected one of mixed, prose+source, teacher, teacher-chat, teacher-answers, student-answers, got 'prose'")
    bad([*child, "--calibration", "prose+source", "--text", str(saved / "mine.txt")], "--calibration:")
    assert not (saved / "x").exists()


def test_an_interrupted_heal_leaves_no_out(saved, monkeypatch):
    from headcount.surgery.healing import loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train_step", interrupted)
    out = saved / "interrupted"
    result = runner.invoke(app, ["heal", "--model", str(saved / "child"), "--teacher", str(saved / "teacher"),
                                 "--steps", "2", "--tokens", TOKENS_10, "--eval-windows", "1", "--out", str(out)])
    assert result.exit_code != 0
    assert not out.exists() and not list(saved.glob(".interrupted*"))


def test_bench_parts_run_on_a_tiny_model(tmp_path):
    from headcount.surgery.healing import bench

    teacher = tiny()
    model = attention_copy(teacher)
    prune(model, {0: [1]}, compensate="none")
    timing = bench.speed(model, teacher, repeats=1, windows=windows(2))
    assert timing["heal_s"] > 0 and timing["plain_s"] > 0 and timing["ratio"] > 0
    assert type(model.layers[0].attn.qkv_proj) is torch.nn.Linear and not model.training
    before = {"prose": 10.0, "code": 20.0}
    result = {"model": "tiny", "fraction": 0.3, "speed": timing, "before_edit": before,
              "curve": [{"steps": s, "tokens_seen": 512 * s, "tokens": 4096, "seconds": 1.0,
                         "held_out": {"prose": 12.0 - s / 10, "code": 25.0 - s / 10}} for s in (0, 10)]}
    bench.render(result)
    bench.plot(result, tmp_path / "heal.png")
    assert (tmp_path / "heal.png").stat().st_size > 1000
