"""Batched generation (models/batched.py): each greedy row equals the same prompt generated alone and
transformers' batched, left-padded generate() on the same weights, on every random family; rows stop on
their own (eos, stop strings) and finished rows leave the forward."""

import copy
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from headcount.models import exactness, from_transformers, generate  # noqa: E402
from headcount.models.tokenizer import Tokenizer, byte_level_bpe  # noqa: E402

NEW = 24
DECODERS = [f for f in exactness.RANDOM_FAMILIES if "bidirectional" not in f]
# transformers switches LongRoPE's factors for the whole batch when its longest row passes
# original_max_position_embeddings; headcount switches each row at its own length, as it would alone
BATCH_SWITCHES_FOR_ALL = ("phi3",)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _prompts(lengths=(24, 7, 15), seed=3, high=509):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, high, (n,), generator=g).tolist() for n in lengths]


def _transformers_batch(hf, prompts, new_tokens):
    length = max(map(len, prompts))
    ids = torch.zeros(len(prompts), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as transformers asks of decoder-only batches
        ids[i, length - len(p):], mask[i, length - len(p):] = torch.tensor(p), 1
    config = copy.deepcopy(hf.generation_config)
    config.update(do_sample=False, eos_token_id=None, max_new_tokens=new_tokens, min_new_tokens=None, pad_token_id=0,
                  temperature=None, top_p=None, top_k=None)
    saved, hf.generation_config.eos_token_id = hf.generation_config.eos_token_id, None
    try:
        with torch.inference_mode():
            return hf.generate(ids, attention_mask=mask, generation_config=config)[:, length:].tolist()
    finally:
        hf.generation_config.eos_token_id = saved


@pytest.mark.parametrize("family", DECODERS)
def test_greedy_rows_equal_each_prompt_alone_and_transformers_batched(family):
    hf = exactness.random_transformers_model(family)
    ours = from_transformers(hf)
    prompts = _prompts()
    rows = generate(ours, prompts, NEW, stop_at_eos=False)
    assert [len(r.new_ids) for r in rows] == [NEW] * 3 and all(r.finish_reason == "length" for r in rows)
    alone = [generate(ours, p, NEW, stop_at_eos=False).new_ids for p in prompts]
    assert [r.new_ids for r in rows] == alone
    assert len({t for a in alone for t in a}) > 3  # the rows are not one repeated token
    want = ([[_transformers_batch(hf, [p], NEW)[0] for p in prompts]] if family in BATCH_SWITCHES_FOR_ALL
            else [_transformers_batch(hf, prompts, NEW)])
    assert [r.new_ids for r in rows] == want[0]


def _byte_tokenizer() -> Tokenizer:
    """One token per byte (GPT-2's byte alphabet, no merges): ids 0..255 decode to text."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2: these bytes stand for themselves
    others = iter(range(256, 512))
    table = {b: chr(b) if b in printable else chr(next(others)) for b in range(256)}
    return Tokenizer(byte_level_bpe([table[b] for b in range(256)], [], split_digits=False), eos_token_id=2,
                     pad_token_id=0, add_special_tokens=False)


@pytest.fixture(scope="module")
def small():
    hf = exactness.random_transformers_model("llama", shape={"vocab_size": 256})
    model = from_transformers(hf)
    model.tokenizer = _byte_tokenizer()
    return model


def test_each_row_stops_at_its_own_stop_string_and_its_text_is_cut_before_it(small):
    prompts = _prompts(high=255)
    free = generate(small, prompts, NEW, stop_at_eos=False)
    stop = free[0].text[6:8]  # a string row 0 writes, at its 7th character
    assert stop and stop not in free[0].text[:6]
    rows = generate(small, prompts, NEW, stop_at_eos=False, stop=[stop])
    for row, whole in zip(rows, free):
        cut = whole.text.find(stop)
        if cut < 0:  # never written: the row runs to the length, unchanged
            assert row.finish_reason == "length" and row.new_ids == whole.new_ids
        else:
            assert row.finish_reason == "stop" and row.stop_string == stop and row.text == whole.text[:cut]
            assert whole.new_ids[:len(row.new_ids)] == row.new_ids and stop in small.tokenizer.decode(row.new_ids)
    assert rows[0].finish_reason == "stop"
    one = generate(small, prompts[0], NEW, stop_at_eos=False, stop=stop)  # one prompt with stop=: one result
    assert one.new_ids == rows[0].new_ids and one.text == rows[0].text


def test_a_row_at_eos_stops_and_leaves_the_forward(small, monkeypatch):
    prompts = _prompts(high=255)
    free = generate(small, prompts, NEW, stop_at_eos=False)
    eos = free[1].new_ids[3]
    monkeypatch.setattr(small.config, "eos_token_id", eos)
    batch_sizes = []
    hook = small.layers[0].register_forward_pre_hook(lambda m, args, kwargs: batch_sizes.append(args[0].shape[0]),
                                                     with_kwargs=True)
    try:
        rows = generate(small, prompts, NEW)
    finally:
        hook.remove()
    for row, whole, prompt in zip(rows, free, prompts):
        alone = generate(small, prompt, NEW)  # the single-prompt path's own eos rule
        assert row.new_ids == alone.new_ids
        if eos in whole.new_ids:
            assert row.finish_reason == "eos" and row.stopped_at_eos
            assert row.new_ids == whole.new_ids[:whole.new_ids.index(eos) + 1]
    assert rows[1].finish_reason == "eos"
    finished = sum(r.finish_reason == "eos" for r in rows)
    assert batch_sizes[0] == 3 and min(batch_sizes) == 3 - finished and sorted(batch_sizes, reverse=True) == batch_sizes


def test_sampled_rows_are_reproducible_with_a_seed_and_bad_input_names_the_argument(small):
    prompts = _prompts(high=255)
    a = generate(small, prompts, 8, temperature=0.9, top_k=20, seed=5, stop_at_eos=False)
    b = generate(small, prompts, 8, temperature=0.9, top_k=20, seed=5, stop_at_eos=False)
    assert [r.new_ids for r in a] == [r.new_ids for r in b]
    with pytest.raises(ValueError, match="stop"):
        generate(small, prompts, 4, stop=[""])
    with pytest.raises(ValueError, match="prompt: empty"):
        generate(small, [[1, 2], []], 4)
    with pytest.raises(ValueError, match="past the model's context"):
        generate(small, [[1] * 250, [1]], 10)
    with pytest.raises(ValueError, match="on_token"):
        generate(small, prompts, 4, on_token=print)


CONTINUOUS = [f for f in DECODERS if f in ("llama", "olmoe", "granite", "gpt_neox", "olmo2", "llama rope dynamic")]


@pytest.mark.parametrize("family", CONTINUOUS)
def test_continuous_batching_gives_each_prompt_its_own_tokens(family, monkeypatch):
    from headcount.models.continuous import generate_many, supports_continuous

    ours = from_transformers(exactness.random_transformers_model(family))
    assert supports_continuous(ours)
    prompts = _prompts((24, 7, 15, 3, 30, 11, 19))
    free = [generate(ours, p, 20, stop_at_eos=False).new_ids for p in prompts]
    monkeypatch.setattr(ours.config, "eos_token_id", free[1][4])  # rows end at different steps
    alone = [generate(ours, p, 20).new_ids for p in prompts]
    assert len({len(a) for a in alone}) > 1
    seen = []
    rows = generate_many(ours, prompts, 20, batch_size=3, on_result=lambda i, r: seen.append(i))
    assert [r.new_ids for r in rows] == alone
    assert sorted(seen) == list(range(len(prompts))) and seen != list(range(len(prompts)))  # as each finished


def test_continuous_batching_grows_a_full_cache_and_each_row_keeps_its_tokens(monkeypatch):
    """A cache holds GROWTH columns past its widest row and is rebuilt wider when full: with 3 columns of room,
    20 new tokens rebuild it many times over, and every row still gets the tokens it gets alone."""
    from headcount.models import continuous

    ours = from_transformers(exactness.random_transformers_model("llama"))
    prompts = _prompts((24, 7, 15, 3, 30))
    alone = [generate(ours, p, 20, stop_at_eos=False).new_ids for p in prompts]
    monkeypatch.setattr(continuous, "GROWTH", 3)
    widths = []
    merged = continuous._merged_cache

    def counting(*args, **kw):
        out = merged(*args, **kw)
        widths.append(out[0].max_len)
        return out

    monkeypatch.setattr(continuous, "_merged_cache", counting)
    rows = continuous.generate_many(ours, prompts, 20, batch_size=3, stop_at_eos=False)
    assert [r.new_ids for r in rows] == alone
    assert len(widths) > 20 // 3 and max(widths) <= 30 + 20 + 3  # rebuilt as it filled, never the whole budget


@pytest.mark.parametrize("family", ("llama", "gpt_neox"))
def test_continuous_batching_prefills_a_shared_prefix_once_and_each_row_keeps_its_tokens(family, monkeypatch):
    """Prompts that share 12 leading tokens (a chat template's system turn, say): the prefix runs through the
    model once, each row still gets the tokens it gets alone, across several admissions of new rows."""
    from headcount.models import continuous

    ours = from_transformers(exactness.random_transformers_model(family))
    shared = _prompts((12,), seed=5)[0]
    tails = _prompts((9, 1, 17, 4, 13, 6), seed=6)
    tails[3][0] = (tails[0][0] + 1) % 509 + 3  # no longer common prefix than the 12 tokens
    prompts = [shared + t for t in tails]
    assert continuous.shared_prefix(prompts) == 12
    alone = [generate(ours, p, 12, stop_at_eos=False).new_ids for p in prompts]
    prefilled = []
    forward = type(ours).forward

    def counting(self, input_ids, **kw):
        if input_ids.shape[1] > 1:
            prefilled.append(input_ids.shape)
        return forward(self, input_ids, **kw)

    monkeypatch.setattr(type(ours), "forward", counting)
    rows = continuous.generate_many(ours, prompts, 12, batch_size=4, stop_at_eos=False)
    assert [r.new_ids for r in rows] == alone
    assert prefilled[0] == (1, 12)  # the prefix, alone, once
    assert all(shape[1] <= max(map(len, tails)) for shape in prefilled[1:])  # then only the suffixes


@pytest.mark.parametrize("shared", (0, 12))
def test_a_freed_row_takes_the_next_prompt_in_place_and_every_row_keeps_its_tokens(shared, monkeypatch):
    """Rows end at different steps (an eos); each freed row takes the next prompt no longer than the cache's width
    in the storage's spare rows (no rebuild), with and without a shared prefix, and every prompt gets the tokens
    it gets alone. A prompt wider than the cache waits for the rebuild."""
    from headcount.models import continuous

    ours = from_transformers(exactness.random_transformers_model("llama"))
    head = _prompts((shared,), seed=5)[0] if shared else []
    prompts = [head + t for t in _prompts((20, 18, 16, 3, 5, 4, 2, 6, 40, 3), seed=7)]
    free = [generate(ours, p, 14, stop_at_eos=False).new_ids for p in prompts]
    monkeypatch.setattr(ours.config, "eos_token_id", free[1][3])
    alone = [generate(ours, p, 14).new_ids for p in prompts]
    assert len({len(a) for a in alone}) > 1
    calls = {"placed": 0, "merged": 0}
    placed, merged = continuous._placed, continuous._merged_cache

    def count(name, f):
        def wrapped(*args, **kw):
            calls[name] += 1
            return f(*args, **kw)
        return wrapped

    monkeypatch.setattr(continuous, "_placed", count("placed", placed))
    monkeypatch.setattr(continuous, "_merged_cache", count("merged", merged))
    rows = continuous.generate_many(ours, prompts, 14, batch_size=4)
    assert [r.new_ids for r in rows] == alone
    assert calls["placed"] >= 2 and calls["merged"] >= 1  # the first rows and the 40-token prompt need a cache


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=5))
def test_shared_prefix_is_the_longest_common_prefix_leaving_every_row_a_token(rows):
    from headcount.models.continuous import shared_prefix

    n = shared_prefix(rows)
    assert all(r[:n] == rows[0][:n] for r in rows) and n < min(map(len, rows))
    longer = n + 1
    assert longer >= min(map(len, rows)) or len({tuple(r[:longer]) for r in rows}) > 1


def test_continuous_batching_refuses_sliding_windows():
    from headcount.models.continuous import generate_many

    ours = from_transformers(exactness.random_transformers_model("mistral"))
    with pytest.raises(ValueError, match="sliding-window"):
        generate_many(ours, _prompts(), 4)
