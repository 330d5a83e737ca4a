"""Healing at scale: data-parallel healing under torch.distributed (DDP over a gloo group of 2
spawned ranks reaches the single process's weights with the same global batch), and bf16 healing on fp32
master weights (a bf16 heal follows the fp32 heal; without the masters its small updates round away).

Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes."""

import numpy as np
import pytest
import torch

from headcount import distributed
from headcount.models.copying import attention_copy
from headcount.models.decoder import Decoder, DecoderConfig
from headcount.surgery import heal, prune


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: conftest's module-wide single thread


def _pair():
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                        max_position=64, rope_theta=10000.0, norm_eps=1e-5)
    teacher = Decoder(cfg).eval()
    with torch.no_grad():
        for p in teacher.parameters():
            if p.dim() == 2:
                p.mul_(2)
    model = attention_copy(teacher)
    prune(model, {0: [1, 2], 1: [0]}, compensate="none")
    return model, teacher


def _windows(n=16, t=32, seed=1):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))


def _heal(group=None, params="attention") -> dict:
    model, teacher = _pair()
    r = heal(model, teacher, steps=6, tokens=16 * 32, calibration=_windows(), window=32, batch_size=4,
             validation_windows=4, eval_every=2, params=params, lr=3e-3, held_out=False, progress=False, group=group)
    # numpy, not tensors: a tensor sent back from a spawned rank lives in shared memory that dies with it
    return {"weights": {k: v.detach().double().numpy() for k, v in model.state_dict().items()},
            "val": [v for _, v in r.val_losses], "train": r.train_losses, "world": r.world_size,
            "best": r.best_step, "steps": r.steps}


PARAMS = ("attention",)  # lora runs the same DDP path (peft adapters are the trainable parameters); its import
# alone costs seconds per spawned rank


def _rank(_) -> dict:
    out = {params: _heal("auto", params) for params in PARAMS}
    try:  # every rank sees the same refusal before any collective
        model, teacher = _pair()
        heal(model, teacher, steps=2, tokens=16 * 32, calibration=_windows(), window=32, batch_size=1,
             validation_windows=4, held_out=False, progress=False, group="auto")
    except ValueError as e:
        out["too_many"] = str(e)
    return out


def test_two_ranks_reach_the_single_process_weights():
    ranks = distributed.spawn(_rank, 2, None, timeout_s=120)  # one spawn for every case: start-up is the cost
    start = _pair()[0].state_dict()
    for params in PARAMS:
        one = _heal(None, params)
        assert one["world"] == 1 and all(r[params]["world"] == 2 for r in ranks)
        assert one["best"] == one["steps"] == 6  # the weights compared are the last step's: every step counted
        moved = 0.0
        for rank in ranks:
            r = rank[params]
            assert r["best"] == one["best"] and r["steps"] == one["steps"]
            assert np.allclose(r["train"], one["train"], rtol=1e-5) and np.allclose(r["val"], one["val"], rtol=1e-5)
            for k, w in one["weights"].items():
                assert np.allclose(r["weights"][k], w, rtol=1e-5, atol=1e-6), (params, k)
                moved = max(moved, float(np.abs(w - start[k].double().numpy()).max()))
        assert moved > 1e-3, params  # the heal did move the weights the ranks agree on
    assert all("torchrun: 2 ranks but a step of 1 windows" in r["too_many"] for r in ranks)


# ------------------------------------------------------------------------------ the curve in one run
class _Stop(Exception):
    pass


def _figures(model, eval_windows=1, window=512, extra=None, only_extra=False):
    """A stand-in for the three held-out domains (real text needs a tokenizer and a large vocabulary; the
    measurement itself is tested with the CLI): perplexity on three fixed random streams. Its signature is
    held_out_figures' own (checked below), so the stand-in breaks when the real one changes."""
    with torch.no_grad():
        return {d: float(torch.exp(model.loss(model(ids, compute_logits=False).hidden_states[:, :-1], ids[:, 1:])))
                for d, ids in
                (("prose", _windows(2, seed=7)), ("code", _windows(2, seed=8)), ("source", _windows(2, seed=9)))}


def test_the_curve_is_one_run_measured_at_its_checkpoints(monkeypatch, tmp_path):
    """bench.curve: one heal, the held-out domains measured on the weights after k steps of it; the truth is the
    same heal stopped after k steps (its weights measured directly), and measuring does not perturb the run."""
    from headcount.surgery.healing import bench, loop

    import inspect

    assert inspect.signature(_figures).parameters.keys() == inspect.signature(loop.held_out_figures).parameters.keys()
    monkeypatch.setattr(loop, "held_out_figures", _figures)
    settings = dict(tokens=12 * 32, calibration=_windows(12), window=32, batch_size=2, validation_windows=4,
                    eval_windows=1, lr=3e-3, patience=10, progress=False)
    pair = _pair

    student, teacher = pair()
    out = bench.curve(student, teacher, (0, 2, 4), log=lambda m: None, **settings)
    assert [row["steps"] for row in out["curve"]] == [0, 2, 4]
    assert out["curve"][0]["held_out"] == out["heal"]["held_out"]["after_edit"]
    assert out["curve"][-1]["held_out"] == out["heal"]["held_out"]["after_heal"]
    assert set(out["before_edit"]) == {"prose", "code", "source"}

    plain, teacher2 = pair()  # the same heal without checkpoints: the same final weights
    loop.heal(plain, teacher2, steps=4, held_out=False, **settings)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), student.state_dict().values()))
    recomputed, teacher4 = pair()  # layer checkpointing (memory) changes no number
    r = loop.heal(recomputed, teacher4, steps=4, held_out=False, checkpoint_layers=True, **settings)
    assert r.checkpoint_layers and not any("forward" in vars(layer) for layer in recomputed.layers)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
               for a, b in zip(plain.state_dict().values(), recomputed.state_dict().values()))

    stopped, teacher3 = pair()  # the same heal stopped after 2 steps: its weights give the 2-step point
    real, calls = loop.train_step, []

    def two_then_stop(*args, **kwargs):
        if len(calls) == 2:
            raise _Stop
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", two_then_stop)
    with pytest.raises(_Stop):
        loop.heal(stopped, teacher3, steps=4, held_out=False, **settings)
    truth = _figures(stopped)
    assert out["curve"][1]["held_out"] == pytest.approx(truth, rel=1e-6)
    assert out["curve"][1]["held_out"] != out["curve"][0]["held_out"]

    result = {"model": "tiny", "fraction": 0.5, "speed": {"batch_windows": 2, "window": 32, "params": "attention",
              "heal_s": 1.0, "plain_s": 1.0, "ratio": 1.0, "target": 1.25}, **out}
    bench.render(result)
    bench.plot(result, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000


# ------------------------------------------------------------------------------------------ bf16 healing
def _steps(dtype, masters: bool, lr=1e-4, steps=8):
    """heal's training steps (loop.train_step, the same Mover / optimizer / masters as heal builds) without its
    validation, whose bf16 noise would choose the kept step: how far layer 0's qkv_proj moved."""
    from headcount.surgery.healing import loop
    from headcount.surgery.healing.weights import Mover

    model, teacher = _pair()
    model, teacher = model.to(dtype), teacher.to(dtype)
    w0 = model.layers[0].attn.qkv_proj.weight.detach().float().clone()
    trainable = Mover(model, teacher, "attention", [0, 1]).trainable()
    kept = loop._Masters(trainable) if masters else None
    optimizer = torch.optim.AdamW(kept.params() if kept else trainable, lr=lr, weight_decay=0.0)
    source = loop._Teacher(teacher, _windows())
    model.train()
    for step in range(steps):
        loop.train_step(model, source, [2 * step % 16, (2 * step + 1) % 16], teacher.lm_head, optimizer, trainable,
                        masters=kept)
    param = model.layers[0].attn.qkv_proj.weight
    w = param.detach()
    master = next(m for p, m in kept.copied if p is param) if kept else None
    if master is not None:
        assert torch.equal(w, master.detach().to(w.dtype))  # the model's weight is its master, rounded
    moved = master.detach() if master is not None else w.float()
    return (moved - w0).flatten(), (w.float() - w0).flatten()


def test_bf16_heals_on_fp32_masters_like_fp32():
    # lr 1e-4: each step moves a weight by ~lr, under half a bf16 ulp for most of them (median |w| 0.17)
    fp32, _ = _steps(torch.float32, masters=False)
    master, bf16 = _steps(torch.bfloat16, masters=True)  # the fp32 masters' move; the bf16 weights' move
    _, stalled = _steps(torch.bfloat16, masters=False)  # the optimizer steps the bf16 weights themselves
    cos = float(torch.nn.functional.cosine_similarity(master, fp32, dim=0))
    ratio = float(master.norm() / fp32.norm())
    assert cos > 0.8 and 0.5 < ratio < 2.0, (cos, ratio)  # bf16 healing follows the fp32 heal
    assert float(stalled.norm()) < 0.5 * float(bf16.norm())  # without the masters most updates round away


# ------------------------------------------------------------------------------------------ memory
def test_the_peak_memory_formula_against_a_measured_heal():
    """memory.heal_memory (the doc's table for the 1.5B comes from it) against the resident peak of a bf16 heal
    of a random config, with and without layer checkpointing, measured in a fresh process (VmHWM after a
    reset before each)."""
    from headcount.surgery.healing.memory import measure_peak

    # narrow (d_model 256) but long (4 x 256 tokens a step): the activations checkpointing saves stay large beside
    # the allocator's noise while the matmuls stay cheap (bf16 matmuls without AVX-512 BF16 run ~10x slower than fp32)
    cfg = {"vocab_size": 4096, "d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "head_dim": 32,
           "d_ff": 768, "max_position": 512}
    runs = measure_peak(cfg, dtype="bf16", batch=4, windows=8, steps=2, checkpoint_layers=(False, True))
    # the formula plans memory, so it may err high, not low: the peak is within 15% above it and 25% below it.
    # Measured on an AMD EPYC: without checkpointing 0.84 of the formula, with it 0.92 (the allocator and oneDNN's
    # scratch differ between CPUs).
    for r in runs:
        assert 0.75 < r["peak_bytes"] / r["formula_bytes"] < 1.15, (r["checkpoint_layers"], r["peak_bytes"] / 2**20,
                                                                   r["formula_bytes"] / 2**20)
    # What checkpointing saves of the resident peak depends on the CPU's kernels and allocator (of the 43 MiB the
    # formula plans: 24 MiB on an AMD EPYC, 6 MiB on another CI machine), so the saving is checked on what
    # autograd holds, below, where it is exact.


def test_layer_checkpointing_saves_what_the_formula_counts():
    """heal's layer checkpointing (training.checkpointing, the switch heal(checkpoint_layers=True) turns) keeps
    none of the layers' activations for backward: the saving equals activation_bytes_per_token, the memory
    formula's per-layer count, times layers x tokens, within 15%."""
    from headcount.analysis.grad_memory import _saved_bytes
    from headcount.cost.shape import ModelShape
    from headcount.surgery.healing.memory import activation_bytes_per_token
    from headcount.training.checkpointing import layer_checkpointing

    c = {"vocab_size": 512, "d_model": 128, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32,
         "d_ff": 384, "max_position": 256}
    torch.manual_seed(0)
    student = attention_copy(Decoder(DecoderConfig(**c, rope_theta=10000.0, norm_eps=1e-5)).to(torch.bfloat16))
    for name, p in student.named_parameters():  # what heal's "attention" default moves; the MLPs stay frozen
        p.requires_grad_(".attn." in name or "attn_norm" in name)
    tokens = 256
    full = _saved_bytes(student, tokens)  # grad_memory's probe: distinct storages saved for backward, weights excluded
    with layer_checkpointing(student.layers):
        checkpointed = _saved_bytes(student, tokens)
    shape = ModelShape(name="random", d_model=128, n_heads=4, n_kv_heads=2, head_dim=32, n_layers=3, d_ff=384,
                       vocab_size=512, mlp="gated", norm="rmsnorm", final_norm=True, tied_embeddings=True)
    counted = c["n_layers"] * tokens * activation_bytes_per_token(shape, "bf16")
    # measured: 0.92 of the count on this config
    assert 0.85 < (full - checkpointed) / counted < 1.15, (full, checkpointed, counted)
    assert checkpointed < 0.2 * full  # what remains is outside the layers: the embedding's rows, the final norm


def test_a_student_loaded_apart_shares_the_teachers_unchanged_tensors():
    import copy

    from headcount.surgery.healing.weights import share_unchanged

    model, teacher = _pair()
    teacher.lm_head.weight = teacher.embed.weight  # tied, as smollm2 and the 1.5B
    apart = copy.deepcopy(teacher)  # as `headcount heal` loads the edited model: its own tensors
    prune(apart, {0: [1, 2]}, compensate="none")
    before = apart(_windows(2)).logits
    saved = share_unchanged(apart, teacher)
    assert torch.equal(apart(_windows(2)).logits, before)
    assert apart.embed.weight is teacher.embed.weight and apart.lm_head.weight is apart.embed.weight
    assert apart.layers[1].attn.qkv_proj.weight is teacher.layers[1].attn.qkv_proj.weight  # unedited layer
    assert apart.layers[0].attn.qkv_proj.weight is not teacher.layers[0].attn.qkv_proj.weight  # edited: its own
    own = {id(p) for p in apart.parameters()} - {id(p) for p in teacher.parameters()}
    assert saved == sum(p.numel() * 4 for p in teacher.parameters()) - sum(
        p.numel() * 4 for p in teacher.layers[0].attn.parameters()) and own
