"""Role scores on hand-built attention patterns with known answers, the word -> subword alignment on
both tokenizers, and a small real-model check (smollm2 has previous-token and induction heads)."""

import pytest
import torch

from headcount.analysis import patterns
from headcount.analysis.role_scores import THRESHOLDS, labelled_heads, layer_scores


def causal_uniform(t):
    return torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]


def previous_token(t):
    a = torch.zeros(t, t)
    a[0, 0] = 1
    a[torch.arange(1, t), torch.arange(0, t - 1)] = 1
    return a


def offset_pattern(t, k):
    """Bidirectional: query i -> key i + k where it exists, else i - 1."""
    a = torch.zeros(t, t)
    for i in range(t):
        a[i, i + k if i + k < t else i - 1] = 1
    return a


def label(role, scores_row, extra=None):
    return labelled_heads(role, [scores_row.tolist()], extra=[extra.tolist()] if extra is not None else None)


def test_previous_token_pattern_scores_one_and_is_labelled():
    w = torch.stack([previous_token(16), causal_uniform(16)])  # [H=2, T, S]
    s = layer_scores(w, causal=True)
    assert s["previous_token"][0] == pytest.approx(1.0)
    assert label("previous_token", s["previous_token"]) == [[0, 0]]
    # positional: every row but the first sits at -1: 15/16 >= 0.9
    assert s["positional"][0] == pytest.approx(15 / 16) and s["positional_offset"][0] == -1


def test_uniform_attention_is_labelled_nothing():
    t = 64
    ids = torch.randint(0, 20, (1, t))
    for causal, w in ((True, causal_uniform(t)), (False, torch.full((t, t), 1 / t))):
        s = layer_scores(w[None], ids, causal=causal)
        for role in ("previous_token", "duplicate_token", "induction", "positional", "sink"):
            assert label(role, s[role]) == [], (causal, role, float(s[role][0]))


def test_offset_plus_two_is_positional_at_plus_two():
    t = 32
    w = torch.stack([offset_pattern(t, 2), torch.full((t, t), 1 / t)])
    s = layer_scores(w, causal=False)
    assert s["positional"][0] == pytest.approx(30 / 32)
    assert label("positional", s["positional"], s["positional_offset"]) == [[0, 0, 2]]


def test_induction_on_a_repeated_sequence():
    n = 10
    seq = torch.randperm(50)[:n]
    ids = torch.cat([seq, seq])[None]  # [1, 2n]
    t = 2 * n
    ideal = torch.zeros(t, t)
    ideal[:n, 0] = 1  # first copy: nothing to copy, park on token 0
    for i in range(n, t):
        ideal[i, i - n + 1] = 1  # the token after the earlier copy of token i
    w = torch.stack([ideal, previous_token(t), causal_uniform(t)])
    s = layer_scores(w, ids, causal=True)
    assert s["induction"][0] == pytest.approx(1.0)
    assert s["induction"][1] == pytest.approx(0.0)  # previous-token is not induction (n > 2)
    assert label("induction", s["induction"]) == [[0, 0]]
    # a duplicate-token head: query i -> key i - n (same token) scores 1 on the duplicate pattern
    dup = torch.zeros(t, t)
    dup[:n, 0] = 1
    dup[torch.arange(n, t), torch.arange(0, n)] = 1
    assert layer_scores(dup[None], ids)["duplicate_token"][0] == pytest.approx(1.0)


def test_patterns_match_their_definitions():
    ids = torch.tensor([[3, 1, 3, 2, 1, 3]])
    dup, ind = patterns.duplicate_token_pattern(ids), patterns.induction_pattern(ids)
    both = patterns.duplicate_token_pattern(ids, causal=False)
    for i in range(6):
        for j in range(6):
            assert dup[0, i, j] == (j < i and ids[0, i] == ids[0, j])
            assert both[0, i, j] == (j != i and ids[0, i] == ids[0, j])
            assert ind[0, i, j] == (j >= 1 and j - 1 < i and ids[0, i] == ids[0, j - 1])


def test_pattern_score_is_sum_a_p_over_sum_a_on_rows_with_a_target():
    torch.manual_seed(1)
    w = torch.softmax(torch.randn(3, 8, 8), -1)
    p = torch.rand(8, 8) > 0.7
    p[2] = False
    got = patterns.pattern_score(w, p)
    rows = p.any(-1)
    want = (w * p).sum((-1, -2)) / (w * rows[:, None]).sum((-1, -2))
    assert torch.allclose(got.float(), want, atol=1e-6)


def test_sink_counts_positions_from_ten_for_decoders():
    t = 20
    w = torch.zeros(1, t, t)
    w[0, :10, 0] = 1.0  # positions < 10 on the first token
    w[0, 10:, 5] = 1.0  # positions >= 10 elsewhere
    assert layer_scores(w, causal=True)["sink"][0] == 0
    assert layer_scores(w, causal=False)["sink"][0] == pytest.approx(0.5)


def test_labelled_heads_order_and_threshold():
    scores = [[0.2, 0.7], [0.95, 0.5]]
    assert labelled_heads("previous_token", scores) == [[1, 0], [0, 1]]  # 0.5 is not > 0.5
    assert THRESHOLDS["previous_token"] == 0.5 and THRESHOLDS["induction"] == 0.4


def test_pointer_hits():
    w = torch.zeros(2, 1, 4, 4)
    w[0, 0, 3, 1] = 1
    w[1, 0, 2, 0] = 1
    q = torch.tensor([[0, 3, 1], [1, 2, 1], [1, 3, 0]])
    assert patterns.pointer_hits(w, q).tolist() == [2.0]  # row 3 of batch 1 is all zero -> argmax 0


# ------------------------------------------------------------------------------- alignment
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_word_to_first_subword_alignment(name, request):
    from headcount.analysis.syntax import align, encode_with_offsets
    model = request.getfixturevalue(name)
    text = "Antidisestablishmentarianism unbelievably overcomplicates floccinaucinihilipilification."
    ids, offsets, special = encode_with_offsets(model, text)
    multi = 0
    for word in text.rstrip(".").split():
        start = text.index(word)
        i = align(offsets, special, start, start + len(word))
        pieces = [k for k, (a, b) in enumerate(offsets) if not special[k] and a < start + len(word) and b > start]
        multi += len(pieces) >= 2
        assert i == pieces[0]
        a, b = offsets[i]
        assert a <= start < b  # the first subword starts the word
        assert model.tokenizer.decode([ids[i]]).strip().lower().replace("##", "") == text[a:b].strip().lower()
    assert multi >= 3  # the alignment was tested on multi-token words


def test_parse_relations_respect_causality(minilm):
    from headcount.analysis.syntax import parse_sentences
    text = "The old man quickly ate the red apple."
    enc = parse_sentences(minilm, [text], causal=False)[0]
    dec = parse_sentences(minilm, [text], causal=True)[0]
    ids = enc.ids
    word = {minilm.tokenizer.decode([t]): i for i, t in enumerate(ids)}
    man, old, ate, apple = word["man"], word["old"], word["ate"], word["apple"]
    assert (man, old) in enc.relations["amod->"] and (old, man) in enc.relations["amod<-"]
    assert (man, old) in dec.relations["amod->"] and dec.relations["amod<-"] == []  # old comes first
    assert (ate, man) in dec.relations["nsubj->"] and (apple, ate) in dec.relations["dobj<-"]
    from wordfreq import word_frequency
    words = "The old man quickly ate the red apple".split()
    rarest = min(words, key=lambda w: (word_frequency(w.lower(), "en"), words.index(w)))
    assert enc.rare_word == rarest and enc.rare == word[rarest.lower()]


# ------------------------------------------------------------------------------- real model
def test_smollm2_has_previous_token_and_induction_heads(smollm2):
    from headcount.analysis import roles
    r = roles(smollm2, max_tokens=128, window=128, induction_len=24, induction_batch_size=2,
              only=["previous_token", "induction"], progress=False)
    j = r.to_json()
    assert set(j) == {"previous_token", "induction"}
    assert len(j["previous_token"]["scores"]) == 30 and len(j["previous_token"]["scores"][0]) == 9
    assert j["previous_token"]["heads"] and j["induction"]["heads"]
    top = j["induction"]["heads"][0]
    assert j["induction"]["scores"][top[0]][top[1]] > 0.4
