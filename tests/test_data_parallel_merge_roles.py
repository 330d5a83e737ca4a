"""merge-kv and roles over ranks: the calibration rows split over a gloo group (row w on rank
w % world), the float64 sums (and the gradients of the local steps) all-reduced, give the single process's
result: merged weights to relative 1e-6, the same KV groups, role scores to 1e-6. Under torchrun only
rank 0 prints and writes; more ranks than windows is one line and exit 2 on every rank, nothing written; a
rank that dies makes the others exit 2 with one line within --timeout, nothing written.

Workers are module-level functions: headcount.distributed.spawn starts them in fresh processes (one torch
thread each). Small random models; the roles and CLI tests use a tiny random decoder saved with SmolLM2's
tokenizer (roles and the CLI need one), and the encoder roles case MiniLM itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headcount import distributed
from headcount.models import Decoder, DecoderConfig, Encoder, EncoderConfig
from headcount.surgery import merge_kv

pytestmark = pytest.mark.usefixtures("one_thread_for_tiny_models")

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TEXT = ("The old man quickly ate the red apple. The young woman slowly read a long book. "
        "A small dog happily chased the ball across the green field. She gave him the keys before noon. "
        "They carefully built a wooden boat near the quiet river. Our teacher explained the difficult lesson "
        "twice. Heavy rain flooded every narrow street in town. My brother repaired his broken bicycle "
        "yesterday. Seven bright stars appeared above the dark mountains. The hungry children shared warm "
        "bread with their neighbours. ") * 10


# ------------------------------------------------------------------------------------------- merge-kv
def _decoder() -> Decoder:
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=8, d_ff=64,
                        max_position=64, rope_theta=10000.0, norm_eps=1e-5)
    return Decoder(cfg).eval()


def _encoder() -> Encoder:
    torch.manual_seed(1)
    return Encoder(EncoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_position=64)).eval()


def _calibration(which: str):
    g = torch.Generator().manual_seed(2)
    if which == "decoder":  # 5 windows: global batches of 4 + 1, one per rank (whole batches)
        return torch.randint(0, 64, (5, 24), generator=g)
    if which == "decoder-4":  # one global batch, fewer than ranks: its windows w on rank w % 2; the local
        return torch.randint(0, 64, (4, 24), generator=g)  # steps then fit and validate on it, and move weights
    batches = []  # encoder: padded sentence batches (rows of every length); one batch: split by rows
    for n, t in ((8, 12),) if which == "encoder-1" else ((5, 12), (3, 9)):
        ids = torch.randint(1, 64, (n, t), generator=g)
        mask = torch.ones(n, t, dtype=torch.long)
        for row in range(n):
            mask[row, t - row:] = 0
        batches.append((ids * mask, mask))
    return batches


# the closed form + the o_proj refit: statistics summed in float64, so the weights equal one process's
CLOSED = {  # case: (calibration, merge_kv keywords)
    "decoder-auto-rows": ("decoder-4", dict(n_kv_heads=2)),
    "decoder-auto-residual": ("decoder", dict(n_kv_heads=2, target="residual")),
    "decoder-mqa-stream": ("decoder", dict(n_kv_heads=1, target="stream")),
    "encoder-auto": ("encoder", dict(n_kv_heads=2)),
    "encoder-auto-rows": ("encoder-1", dict(n_kv_heads=2)),
}
# plus gradient steps (local_steps: Adam on the layer; refine_steps: Adam on the rotary key mix), each step's
# gradient all-reduced per global batch; the settings are ones where the steps are kept (they move weights).
# Whole batches per rank: each batch's gradient comes from one rank, so the steps are the single process's.
STEPS = {
    "decoder-auto-steps": ("decoder", dict(n_kv_heads=2, local_steps=6, refine_steps=3, target="residual")),
    "decoder-mqa-steps": ("decoder-4", dict(n_kv_heads=1, local_steps=4, target="stream")),
    "encoder-steps": ("encoder-1", dict(n_kv_heads=2, local_steps=3, local_lr=3e-4)),
}
CASES = {**CLOSED, **STEPS}


def _model(which: str):
    return _encoder() if which.startswith("encoder") else _decoder()


def _merge(case: str, group=None, **override) -> dict:
    which, kwargs = CASES[case]
    model = _model(which)
    kwargs = dict(kwargs, **override)
    n = kwargs.pop("n_kv_heads")
    kwargs = {"local_steps": 0, "uptrain_steps": 0} | kwargs  # the closed form unless a case asks for steps
    result = merge_kv(model, n, calibration=_calibration(which), progress=False, group=group, **kwargs)
    # numpy, not tensors: a tensor sent back from a spawned rank lives in shared memory that dies with it
    return {"groups": [m.groups for m in result.layers], "kv_head_of": [m.kv_head_of for m in result.layers],
            "errors": [m.error_after_refit for m in result.layers],
            "tokens": result.calibration_tokens,
            "weights": [t.detach().double().numpy().copy() for layer in model.layers
                        for t in (layer.attn.qkv_proj.weight, layer.attn.o_proj.weight, layer.attn.o_proj.bias)
                        if t is not None]}


def _merge_rank(case: str) -> dict:
    from headcount.analysis.batches import calibration_batches
    from headcount.surgery.merging.stream import shard_batches

    out = _merge(case, group="auto")
    which = CASES[case][0]
    _, index = shard_batches(calibration_batches(_model(which), _calibration(which)), distributed.DataParallel("auto"))
    out["rows"] = [row for _, rows in index for row in rows]
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _whole(weights: list) -> np.ndarray:
    return np.concatenate([w.reshape(-1) for w in weights])


SHARES = {  # rows of each rank: whole batches r::2 when there are at least 2, else rows w % 2
    "decoder": ([0, 1, 2, 3], [4]), "decoder-4": ([0, 2], [1, 3]),
    "encoder": ([0, 1, 2, 3, 4], [5, 6, 7]), "encoder-1": ([0, 2, 4, 6], [1, 3, 5, 7])}


def _check_shares_and_heads(case: str, ranks: list, one: dict) -> None:
    # each rank saw its own share, the two disjoint and together every calibration row
    assert (ranks[0]["rows"], ranks[1]["rows"]) == SHARES[CASES[case][0]]
    for r in ranks:
        assert r["groups"] == one["groups"] and r["kv_head_of"] == one["kv_head_of"]  # the same heads merged
        assert r["tokens"] == one["tokens"] and len(r["weights"]) == len(one["weights"])
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):  # every rank holds the same model, exactly
        assert np.array_equal(a, b)


def _merge_rank_all(_) -> dict:
    return {case: _merge_rank(case) for case in CASES}


@pytest.fixture(scope="module")
def merged_by_rank() -> dict:
    """{case: [rank 0's result, rank 1's]}: one start of 2 ranks runs every case in turn (each builds its own
    seeded model and calibration), as starting fresh processes costs more than these small merges."""
    ranks = distributed.spawn(_merge_rank_all, 2, None, timeout_s=300)
    return {case: [r[case] for r in ranks] for case in CASES}


@pytest.mark.parametrize("case", list(CLOSED))
def test_merge_two_ranks_equal_one_process(case, merged_by_rank):
    one = _merge(case)
    ranks = merged_by_rank[case]
    _check_shares_and_heads(case, ranks, one)
    for r in ranks:
        for a, b in zip(r["weights"], one["weights"]):  # every merged weight, the refit o_proj among them
            assert _rel(a, b) <= 1e-6, _rel(a, b)
        np.testing.assert_allclose(r["errors"], one["errors"], rtol=1e-6)


@pytest.mark.parametrize("case", list(STEPS))
def test_merge_gradient_steps_over_two_ranks(case, merged_by_rank):
    """Whole batches per rank (decoder-auto-steps): the single process's steps, weights to 1e-6. A batch split
    by rows: Adam's first steps are lr * sign(gradient), and right after the refit o_proj's gradient is zero
    up to rounding, so float32 sums taken in another order (two ranks, or one process given its windows in
    another order) move single weights by up to lr: equal within that noise, far below what the steps change.
    Every rank holds exactly the same model either way."""
    one = _merge(case)
    ranks = merged_by_rank[case]
    _check_shares_and_heads(case, ranks, one)
    closed = _merge(case, local_steps=0, refine_steps=0)
    moved = _rel(_whole(one["weights"]), _whole(closed["weights"]))  # what the steps did
    differ = _rel(_whole(ranks[0]["weights"]), _whole(one["weights"]))
    assert moved > 1e-3, moved
    if CASES[case][0] == "decoder":  # whole batches
        for a, b in zip(ranks[0]["weights"], one["weights"]):
            assert _rel(a, b) <= 1e-6, _rel(a, b)
    else:
        assert differ <= 0.05 * moved, (moved, differ)


def _merge_too_many(_):
    model = _decoder()
    merge_kv(model, 1, local_steps=0, uptrain_steps=0, calibration=_calibration("decoder")[:1], progress=False,
             group="auto")


def test_merge_more_ranks_than_windows_is_a_clear_error():
    outcomes = distributed.spawn(_merge_too_many, 2, None, timeout_s=60, raise_errors=False)
    assert all(o.error_type == "ValueError" for o in outcomes), outcomes
    assert all("2 ranks but only 1 calibration windows" in o.error for o in outcomes)


# -------------------------------------------------------------------------------------------- roles
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    """A tiny random decoder with SmolLM2's tokenizer, saved (roles and the CLI need a tokenizer)."""
    from headcount.models import load
    from headcount.models.formats.native import save

    tok = load("smollm2").tokenizer
    torch.manual_seed(3)
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  head_dim=8, d_ff=64, max_position=512, rope_theta=10000.0, norm_eps=1e-5)).eval()
    model.tokenizer = tok
    path = tmp_path_factory.mktemp("dp") / "tiny"
    save(model, path)
    return path


def _roles(model_name: str, batch_size: int, group=None) -> dict:
    from headcount.analysis import roles
    from headcount.models import load

    model = load(model_name)
    r = roles(model, TEXT, max_tokens=160, window=32, max_sentences=40, induction_len=8, induction_batch_size=3,
              batch_size=batch_size, progress=False, group=group)
    return r.to_json(meta=True)


def _roles_rank(model_name: str, batch_size: int) -> dict:
    return _roles(model_name, batch_size, group="auto")


def _close(a, b, where=""):
    """Nested JSON equal, numbers to 1e-6: role scores lie in [0, 1] (a syntactic gain in [-1, 1]) and roles()
    rounds them to 6 significant digits, so summing in another order can move one by a unit of that rounding
    (1e-7 for 0.0697195 against 0.0697196); 1e-6 absolute, plus 1e-6 relative for the larger numbers of meta."""
    if isinstance(b, dict):
        assert set(a) == set(b), where
        for k in b:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and not isinstance(b, bool):
        assert abs(a - b) <= 1e-6 * (1 + abs(b)), (where, a, b)
    else:
        assert a == b, (where, a, b)


ROLES_CASES = [("tiny", 2), ("minilm", 2), ("tiny", 8)]


def _roles_rank_all(tiny: str) -> dict:
    return {(name, b): _roles_rank(tiny if name == "tiny" else name, b) for name, b in ROLES_CASES}


@pytest.fixture(scope="module")
def roles_by_rank(tiny_lm) -> dict:
    """{(model, batch size): [rank 0's JSON, rank 1's]}: one start of 2 ranks runs every case in turn."""
    ranks = distributed.spawn(_roles_rank_all, 2, str(tiny_lm), timeout_s=300)
    return {case: [r[case] for r in ranks] for case in ROLES_CASES}


@pytest.mark.parametrize("model_name, batch_size", ROLES_CASES)
def test_roles_two_ranks_equal_one_process(model_name, batch_size, tiny_lm, roles_by_rank):
    """5 windows: in batches of 2 (3 batches, whole ones per rank: 2 + 1), or of 8 (one batch, split by
    windows 3 + 2); the sentence batches r::2; the induction batch on rank 1."""
    name = str(tiny_lm) if model_name == "tiny" else model_name
    one = _roles(name, batch_size)
    ranks = roles_by_rank[(model_name, batch_size)]
    assert one["meta"]["window_tokens"] == 5 * one["meta"]["window_length"]
    for r in ranks:
        _close(r, one)  # every role's scores to 1e-6, the labelled heads identical, the counts equal
        for role in one:
            if role != "meta":
                assert r[role]["heads"] == one[role]["heads"]


def _roles_too_many(model_name: str):
    from headcount.analysis import roles
    from headcount.models import load

    roles(load(model_name), TEXT, max_tokens=40, window=32, progress=False, only=["previous_token"], group="auto")


def test_roles_more_ranks_than_windows_is_a_clear_error(tiny_lm):
    outcomes = distributed.spawn(_roles_too_many, 2, str(tiny_lm), timeout_s=60, raise_errors=False)
    assert all(o.error_type == "ValueError" for o in outcomes), outcomes
    assert all("2 ranks (torchrun) but only 1 window" in o.error and "max_tokens" in o.error for o in outcomes)


# ---------------------------------------------------------------------------------------------- CLI
def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


# two uptrain steps still take the data-parallel uptrain's path (gradients all-reduced); the default 20 only repeat
# it, at full-vocabulary logits each, in three processes
MERGE_ARGS = ["--kv-heads", "1", "--calibration-windows", "2", "--eval-windows", "1", "--local-steps", "0",
              "--uptrain-steps", "2", "--json"]


def test_merge_cli_under_torchrun_rank0_writes_and_equals_one_process(tiny_lm, tmp_path):
    torchrun = Path(PYTHON).with_name("torchrun")
    out2, out1 = tmp_path / "two", tmp_path / "one"
    two = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(distributed.free_port()),
                          "-m", "headcount", "merge-kv", "--model", str(tiny_lm), *MERGE_ARGS, "--out", str(out2),
                          "--timeout", "60"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count('"heads_before"') == 1  # one JSON: rank 0 prints, rank 1 is silent
    data = json.loads(two.stdout[two.stdout.index("{"):])
    assert data["heads_before"] == 4 and data["heads_after"] == 2
    # only rank 0 wrote: the saved model and nothing beside it (no second copy, no temporary directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two"]
    one = subprocess.run([PYTHON, "-m", "headcount", "merge-kv", "--model", str(tiny_lm), *MERGE_ARGS, "--out",
                          str(out1)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    from headcount.models import load

    a, b = load(out2), load(out1)
    for la, lb in zip(a.layers, b.layers):
        assert la.attn.kv_head_of == lb.attn.kv_head_of
        for x, y in ((la.attn.o_proj.weight, lb.attn.o_proj.weight),
                     (la.attn.qkv_proj.weight, lb.attn.qkv_proj.weight)):
            assert _rel(x.detach().double().numpy(), y.detach().double().numpy()) <= 1e-6


def _ranks(args_of_rank, *, world: int = 2, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """`python -m headcount ...` on `world` ranks with torchrun's environment (RANK, WORLD_SIZE, MASTER_*),
    without torchrun's agent (which would stop the others as soon as one exits): each rank's own exit."""
    port = str(distributed.free_port())
    procs = []
    for rank in range(world):
        env = dict(_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        procs.append(subprocess.Popen([PYTHON, "-m", "headcount", *args_of_rank(rank)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {rank} hung")
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("W", "[W"))]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_cli_more_ranks_than_windows_exit_2_nothing_written(tiny_lm, tmp_path):
    out = tmp_path / "never"
    merged = _ranks(lambda r: ["merge-kv", "--model", str(tiny_lm), "--kv-heads", "1", "--calibration-windows", "1",
                               "--out", str(out)])
    for rank, p in enumerate(merged):
        assert p.returncode == 2
        line = _one_line(p.stderr)
        assert f"(rank {rank})" in line and "--calibration-windows" in line and "2 ranks" in line, line
    role = _ranks(lambda r: ["roles", "--model", str(tiny_lm), "--text", str(_text_file(tmp_path)), "--max-tokens",
                             "100", "--json"])
    for rank, p in enumerate(role):
        assert p.returncode == 2 and p.stdout == ""
        line = _one_line(p.stderr)
        assert f"(rank {rank})" in line and "--max-tokens" in line and "1 window" in line, line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def test_roles_cli_under_two_ranks_rank0_prints_the_one_process_json(tiny_lm, tmp_path):
    args = ["roles", "--model", str(tiny_lm), "--text", str(_text_file(tmp_path)), "--max-tokens", "600",
            "--max-sentences", "12", "--json"]
    ranks = _ranks(lambda r: args)
    assert [p.returncode for p in ranks] == [0, 0], [p.stderr[-2000:] for p in ranks]
    assert ranks[1].stdout == ""  # rank 1 prints nothing
    one = subprocess.run([PYTHON, "-m", "headcount", *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    _close(json.loads(ranks[0].stdout), json.loads(one.stdout))


def test_a_rank_that_dies_makes_the_other_exit_with_one_line(tiny_lm, tmp_path):
    out = tmp_path / "merged"
    missing = tmp_path / "no-such-model"
    merged = _ranks(lambda r: ["merge-kv", "--model", str(tiny_lm if r == 0 else missing), *MERGE_ARGS,
                               "--out", str(out), "--timeout", "20"], timeout=200)
    assert [p.returncode for p in merged] == [2, 2]
    assert "(rank 1)" in _one_line(merged[1].stderr)
    line = _one_line(merged[0].stderr)
    assert "(rank 0)" in line and "another rank" in line, line
    assert not out.exists() and list(tmp_path.iterdir()) == []

