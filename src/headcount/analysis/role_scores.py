"""roles(model, texts=None) -> RoleScores: what each head does, as a [n_layers, n_heads] score per role.

    role             score (per head)                                              label when
    previous_token   sum(A * P) / sum(A), P[t, t-1]              (TransformerLens)   score > 0.5
    duplicate_token  same, P = earlier copies of the query's token                   score > 0.5
    induction        same, P = the token after an earlier copy, on repeated         score > 0.4
                     random token sequences (seeded)
    positional       share of tokens whose argmax sits at one relative offset        share >= 0.9
                     (Voita et al. 2019; the offset is reported: -1, +1, ...)
    syntactic        best over nsubj/dobj/amod/advmod x both directions of          gain >= 0.10
                     (argmax accuracy against spaCy's parse - the best fixed
                     relative offset's accuracy for that relation)  (Voita)
    rare_word        share of queries whose argmax lands on the sentence's least     share >= 0.5
                     frequent word (wordfreq)                         (Voita)
    sink             mean weight on the first token (query positions >= 10 for a     mean >= 0.5
                     decoder; every position for an encoder)

Pattern scores (patterns.py) count the query rows where the pattern has a target. The thresholds for
previous-token (0.5) and induction (0.4) are the thresholds the roles are named by; duplicate-token follows previous-token.
Syntactic details (directions, the causal restriction, first-subword alignment): syntax.py.

Inputs (texts=None = the calibration part of the default corpus):
- windows of `window` consecutive tokens (decoders; encoders get [CLS] ... [SEP] around them) for
  previous_token, duplicate_token, positional and sink, up to max_tokens tokens;
- `induction_batch` sequences of `induction_len` distinct tokens drawn (seeded) from the text's own
  tokens, each repeated twice; only the second copy's rows have a target;
- sentences (headcount.analysis.batches.split_sentences), one per row, for syntactic and rare_word.

Data parallelism (group=): every rank builds the same inputs, then takes a share: the window batches
r::world (as one process runs them; with fewer batches than ranks, the windows r::world), the induction
sequences (one batch) on the last rank, and the sentence batches r::world (the batches of sentences of
similar length that one process would run, unchanged); every role's sums and counts are all-reduced once in
float64, so every rank returns the single process's scores (to summation order, and to float32 rounding
where a window batch was split).
More ranks than windows: ValueError on every rank before any forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from headcount.analysis import patterns
from headcount.analysis.batches import is_decoder, resolve_texts, split_sentences
from headcount.analysis.capturing import attention_modules, capture

Tensor = torch.Tensor

ROLES = ("previous_token", "duplicate_token", "induction", "positional", "syntactic", "rare_word", "sink")
THRESHOLDS = {"previous_token": 0.5, "duplicate_token": 0.5, "induction": 0.4, "positional": 0.9,
              "syntactic": 0.10, "rare_word": 0.5, "sink": 0.5}
STRICT = {"previous_token", "duplicate_token", "induction"}  # labelled when score > threshold (else >=)
MIN_TOKENS = 32  # the window roles need at least this many tokens
MIN_INSTANCES = 10  # a relation-direction is scored only with at least this many instances
SINK_FROM = 10  # decoders: the sink is measured at query positions >= this
DIGITS = 6


def _round(x: float) -> float:
    return 0.0 if x == 0 else float(f"{x:.{DIGITS}g}")


@dataclass
class RoleScores:
    """Per-role [n_layers][n_heads] scores, thresholds and labelled heads, plus `meta` (sources, token
    counts, positional offsets, per-relation syntactic accuracies). `to_json()` is the contract:
    {role: {"scores", "threshold", "heads"}} for each role; `to_json(meta=True)` adds a "meta" key."""

    scores: dict[str, list[list[float]]]
    thresholds: dict[str, float]
    heads: dict[str, list[list]]
    meta: dict = field(default_factory=dict)

    @property
    def roles(self) -> list[str]:
        return [r for r in ROLES if r in self.scores]

    def tensor(self, role: str) -> Tensor:
        """[n_layers, n_heads] float tensor of one role's scores (needs the same head count per layer)."""
        return torch.tensor(self.scores[role], dtype=torch.float64)

    def labels(self, layer: int, head: int) -> list[str]:
        """The roles for which (layer, head) is labelled."""
        return [r for r in self.roles if any(e[0] == layer and e[1] == head for e in self.heads[r])]

    def strongest(self, layer: int, head: int) -> str | None:
        """The labelled role whose score is furthest past its threshold (score / threshold), or None."""
        best, role = 0.0, None
        for r in self.labels(layer, head):
            ratio = self.scores[r][layer][head] / self.thresholds[r]
            if ratio > best:
                best, role = ratio, r
        return role

    def to_json(self, *, meta: bool = False) -> dict:
        out = {r: {"scores": self.scores[r], "threshold": self.thresholds[r], "heads": self.heads[r]}
               for r in self.roles}
        if "sink" in out and self.meta.get("declared_sinks"):  # a model with learned sink logits (GPT-OSS)
            out["sink"]["declared"] = self.meta["declared_sinks"]
        if meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, data: dict) -> "RoleScores":
        roles = [r for r in ROLES if r in data]
        return cls({r: data[r]["scores"] for r in roles}, {r: data[r]["threshold"] for r in roles},
                   {r: [list(e) for e in data[r]["heads"]] for r in roles}, dict(data.get("meta") or {}))

    def summary(self) -> dict[str, int]:
        """{role: number of labelled heads}."""
        return {r: len(self.heads[r]) for r in self.roles}


# ------------------------------------------------------------------------------------ inputs
def _progress(total: int, desc: str, enabled: bool):
    import sys

    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="batch", file=sys.stderr, disable=not enabled, leave=False)


def _special_wrap(model) -> tuple[list[int], list[int]]:
    """The tokens the model's tokenizer puts before and after a text ([CLS], [SEP] for BERT; none for SmolLM2)."""
    tok = model.tokenizer
    if not tok.add_special_tokens:
        return [], []
    enc = tok.backend.encode("x", add_special_tokens=True)
    flags = list(enc.special_tokens_mask)
    ids = list(enc.ids)
    first = flags.index(0) if 0 in flags else len(ids)
    return ids[:first], [i for i, f in zip(ids[first:], flags[first:]) if f]


def _stream_ids(model, texts: list[str]) -> list[int]:
    from headcount.models.evaluation import token_stream
    return token_stream(model, texts)


def window_batches(model, stream: list[int], *, window: int, max_tokens: int, batch_size: int,
                   min_tokens: int = MIN_TOKENS) -> list[Tensor]:
    """[B, T] windows of the token stream (with the model's special tokens around each for encoders)."""
    pre, post = _special_wrap(model)
    limit = model.config.max_position - len(pre) - len(post)
    body = max(1, min(window - len(pre) - len(post), limit, len(stream)))
    if len(stream) < min_tokens:
        raise ValueError(f"texts: {len(stream)} tokens is too short for the previous_token, duplicate_token, "
                         f"positional and sink roles: they need at least {MIN_TOKENS} tokens")
    n = max(1, min(len(stream) // body, max(1, max_tokens // body)))
    rows = [pre + stream[i * body:(i + 1) * body] + post for i in range(n)]
    ids = torch.tensor(rows, dtype=torch.long)
    return list(ids.split(batch_size))


def induction_batch(model, stream: list[int], *, length: int, batch: int, seed: int) -> Tensor:
    """[batch, 2 * length] (+ special tokens): `length` distinct tokens of the text, seeded, twice."""
    pre, post = _special_wrap(model)
    distinct = sorted(set(stream))
    if len(distinct) < length:
        raise ValueError(f"texts: {len(distinct)} distinct tokens is too few for the induction role: it repeats "
                         f"a random sequence of {length} distinct tokens drawn from the text (give more text)")
    if 2 * length + len(pre) + len(post) > model.config.max_position:
        raise ValueError(f"induction_len: {length} twice is past the model's context of {model.config.max_position}")
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(distinct, dtype=torch.long)
    rows = []
    for _ in range(batch):
        seq = pool[torch.randperm(len(pool), generator=gen)[:length]].tolist()
        rows.append(pre + seq + seq + post)
    return torch.tensor(rows, dtype=torch.long)


def _device(model):
    return next(model.parameters()).device


# ------------------------------------------------------------------------------------ passes
def _window_pass(model, batches, causal, acc, progress, dp=None):
    mods = attention_modules(model)
    bar = _progress(len(batches), "roles: windows", progress)
    for ids in batches:
        ids = ids.to(_device(model))
        t = ids.shape[1]
        prev = patterns.previous_token_pattern(t)
        dup = patterns.duplicate_token_pattern(ids, causal=causal)

        def reduce(layer, w):
            return (patterns.pattern_sums(w, prev), patterns.pattern_sums(w, dup),
                    patterns.offset_counts(w), patterns.first_token_sums(w, min_position=SINK_FROM if causal else 0),
                    _declared_sink_sums(w, SINK_FROM if causal else 0))

        out = capture(model, ids, summaries=reduce)
        for layer in range(len(mods)):
            (pn, pd), (dn, dd), counts, (sn, sd), (gn, gd) = out[layer]
            a = acc[layer]
            a["declared"] = (a["declared"][0] + gn, a["declared"][1] + gd)
            a["prev"] = (a["prev"][0] + pn, a["prev"][1] + pd)
            a["dup"] = (a["dup"][0] + dn, a["dup"][1] + dd)
            a["sink"] = (a["sink"][0] + sn, a["sink"][1] + sd)
            # offsets of windows of different lengths: pad the counts to the longest
            old = a["offsets"]
            if old is None:
                a["offsets"] = counts
            else:
                if old.shape[1] != counts.shape[1]:
                    width = max(old.shape[1], counts.shape[1])
                    old, counts = _pad_counts(old, width), _pad_counts(counts, width)
                a["offsets"] = old + counts
        bar.update(1)
    bar.close()
    if dp is not None and dp.world > 1:  # every window's sums: one float64 all-reduce
        keys = ("prev", "dup", "sink", "declared")
        parts = [t for a in acc for k in keys for t in a[k]] + [a["offsets"] for a in acc]
        summed = iter(dp.sum_many(parts))
        for a in acc:
            for k in keys:
                a[k] = (next(summed), next(summed))
        for a in acc:
            a["offsets"] = next(summed)


def _declared_sink_sums(w: Tensor, min_position: int) -> tuple[Tensor, Tensor]:
    """Per head (sum over rows of 1 - the row's weights' sum, rows): the share of each softmax row a learned
    sink logit takes (MultiHeadAttention.sinks: the weights returned leave the sink's column out), at query
    positions >= min_position. 0 for a model without sinks."""
    rows = w[:, :, min_position:].double()  # (B, H, T', S)
    share = (1.0 - rows.sum(dim=-1)).clamp_min(0.0)  # (B, H, T')
    return share.sum(dim=(0, 2)), torch.full((w.shape[1],), float(rows.shape[0] * rows.shape[2]), dtype=torch.float64)


def _pad_counts(counts: Tensor, width: int) -> Tensor:
    extra = (width - counts.shape[1]) // 2
    return torch.nn.functional.pad(counts, (extra, extra))


def _sentence_pass(model, parsed, batch_size, acc, progress, dp=None):
    from headcount.analysis.syntax import relation_names

    mods = attention_modules(model)
    pad = model.tokenizer.pad_token_id
    order = sorted(range(len(parsed)), key=lambda i: len(parsed[i].ids))  # similar lengths together
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if dp is not None and dp.world > 1:  # whole batches r::world: each runs exactly as in one process
        chunks = chunks[dp.rank::dp.world]
    bar = _progress(len(chunks), "roles: sentences", progress)
    names = relation_names()
    for chunk in chunks:
        sents = [parsed[i] for i in chunk]
        t = max(len(s.ids) for s in sents)
        ids = torch.full((len(sents), t), pad, dtype=torch.long)
        mask = torch.zeros(len(sents), t, dtype=torch.bool)
        for b, s in enumerate(sents):
            ids[b, :len(s.ids)] = torch.tensor(s.ids)
            mask[b, :len(s.ids)] = True
        causal = acc["causal"]
        rows, groups = [], []
        for g, name in enumerate(names):
            for b, s in enumerate(sents):
                for q, tgt in s.relations[name]:
                    rows.append((b, q, tgt))
                    groups.append(g)
        n_per = torch.bincount(torch.tensor(groups, dtype=torch.long), minlength=len(names) + 1) if groups else \
            torch.zeros(len(names) + 1, dtype=torch.long)
        for b, s in enumerate(sents):
            if s.rare is None:
                continue
            for q in range(len(s.ids)):
                if q == s.rare or (causal and q < s.rare):
                    continue
                rows.append((b, q, s.rare))
                groups.append(len(names))  # the last group: rare word
        n_rare = len(groups) - int(n_per[:len(names)].sum())
        query_rows = torch.tensor(rows, dtype=torch.long).reshape(-1, 3)
        group_ids = torch.tensor(groups, dtype=torch.long)

        def reduce(layer, w):
            return patterns.pointer_hits(w, query_rows, group_ids, len(names) + 1)

        dev = _device(model)
        out = capture(model, (ids.to(dev), mask.to(dev)), summaries=reduce)
        for layer in range(len(mods)):
            hits = out[layer]  # [relations + 1, H]
            a = acc[layer]
            for g, name in enumerate(names):
                a["rel"][name] = a["rel"][name] + hits[g]
            a["rare"] = a["rare"] + hits[len(names)]
        for g, name in enumerate(names):
            acc["n_rel"][name] += int(n_per[g])
        acc["n_rare"] += n_rare
        bar.update(1)
    bar.close()
    if dp is not None and dp.world > 1:  # hits and counts of every rank's batches: one float64 all-reduce
        layers = [k for k in acc if isinstance(k, int)]
        parts = [acc[layer]["rel"][n] for layer in layers for n in names] + [acc[layer]["rare"] for layer in layers]
        parts.append(torch.tensor([float(acc["n_rel"][n]) for n in names] + [float(acc["n_rare"])],
                                  dtype=torch.float64))
        summed = iter(dp.sum_many(parts))
        for layer in layers:
            for n in names:
                acc[layer]["rel"][n] = next(summed)
        for layer in layers:
            acc[layer]["rare"] = next(summed)
        counts = [int(round(float(x))) for x in next(summed)]
        acc["n_rel"] = dict(zip(names, counts[:-1]))
        acc["n_rare"] = counts[-1]


def relation_baselines(parsed) -> dict[str, dict]:
    """Per relation-direction: instance count, the most common relative offset and its share (the baseline)."""
    from collections import Counter

    from headcount.analysis.syntax import relation_names
    out = {}
    for name in relation_names():
        offsets = Counter(t - q for s in parsed for q, t in s.relations[name])
        n = sum(offsets.values())
        if n:
            offset, count = min(offsets.items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
            out[name] = {"n": n, "baseline": count / n, "baseline_offset": offset}
        else:
            out[name] = {"n": 0, "baseline": None, "baseline_offset": None}
    return out


# -------------------------------------------------------------------------------------- main
def roles(model, texts: str | Sequence[str] | None = None, *, max_tokens: int = 2048, window: int = 256,
          max_sentences: int = 96, induction_len: int = 48, induction_batch_size: int = 4, batch_size: int = 4,
          seed: int = 0, progress: bool = True, only: Sequence[str] | None = None, group=None) -> RoleScores:
    """Score every head of `model` for each role (see the module docstring); texts=None = calibration text.

    max_tokens: tokens of windows for previous/duplicate/positional/sink; window: their length.
    max_sentences: sentences parsed for syntactic and rare_word.
    induction_len / induction_batch_size: the repeated random sequences (seed picks them).
    only: a subset of ROLES to compute (the others are absent from the result).
    group: None (one process), "auto" (torch.distributed's default group when initialised) or a process
    group: the window batches, the induction batch and the sentence batches split over its ranks, the sums
    all-reduced (module docstring); every rank returns the same scores.
    """
    from headcount.distributed import DataParallel

    dp = DataParallel(group)
    mods = attention_modules(model)
    chosen = list(ROLES) if only is None else [r for r in ROLES if r in set(only)]
    if only is not None and (unknown := sorted(set(only) - set(ROLES))):
        raise ValueError(f"only: unknown roles {unknown}; expected some of {list(ROLES)}")
    for name, value in (("max_tokens", max_tokens), ("window", window), ("max_sentences", max_sentences),
                        ("induction_len", induction_len), ("induction_batch_size", induction_batch_size),
                        ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if window < MIN_TOKENS:
        raise ValueError(f"window: expected at least {MIN_TOKENS} tokens, got {window}")
    if getattr(model, "tokenizer", None) is None:
        raise ValueError("model: roles() needs a model with a tokenizer")
    texts = resolve_texts(texts)
    causal = is_decoder(model)
    n_heads = [m.n_heads for m in mods]
    zeros = [torch.zeros(h, dtype=torch.float64) for h in n_heads]
    scores: dict[str, list[list[float]]] = {}
    heads: dict[str, list[list]] = {}
    meta: dict = {"model": getattr(model, "name", None), "causal": causal, "n_layers": len(mods),
                  "n_heads": n_heads, "seed": seed, "roles": chosen,
                  "pattern_rows": "query rows where the pattern has a target",
                  "argmax": "the key with the maximum weight (the first on ties)"}
    was_training = model.training
    model.eval()
    try:
        stream = _stream_ids(model, texts)
        # windows: previous_token, duplicate_token, positional, sink
        if {"previous_token", "duplicate_token", "positional", "sink"} & set(chosen):
            batches = window_batches(model, stream, window=window, max_tokens=max_tokens, batch_size=batch_size)
            mine = batches
            if dp.world > 1:  # whole batches r::world (each runs as in one process), or windows r::world
                rows = torch.cat(batches)
                if rows.shape[0] < dp.world:
                    raise ValueError(f"max_tokens (--max-tokens): {dp.world} ranks (torchrun) but only "
                                     f"{rows.shape[0]} window(s) of {rows.shape[1]} tokens to split over them; "
                                     f"expected at least one window per rank: use at most {rows.shape[0]} "
                                     f"rank(s) or raise max_tokens to {dp.world * rows.shape[1]}")
                mine = (batches[dp.rank::dp.world] if len(batches) >= dp.world
                        else list(rows[dp.rank::dp.world].split(batch_size)))
            acc = [{"prev": (z, z), "dup": (z, z), "sink": (z, z), "declared": (z, z), "offsets": None} for z in zeros]
            _window_pass(model, mine, causal, acc, progress, dp)
            meta["window_tokens"] = int(sum(b.numel() for b in batches))
            meta["window_length"] = int(batches[0].shape[1])
            ratio = lambda nd: [_round(float(x)) for x in torch.where(nd[1] > 0, nd[0] / nd[1].clamp_min(1e-300), 0)]  # noqa: E731
            scores["previous_token"] = [ratio(a["prev"]) for a in acc]
            scores["duplicate_token"] = [ratio(a["dup"]) for a in acc]
            scores["sink"] = [ratio(a["sink"]) for a in acc]
            sink_num = sum(float(a["sink"][0].sum()) for a in acc)
            sink_den = sum(float(a["sink"][1].sum()) for a in acc)
            meta["sink_mean"] = _round(sink_num / sink_den) if sink_den else None
            meta["sink_from_position"] = SINK_FROM if causal else 0
            if any(getattr(m, "sinks", None) is not None for m in mods):  # the model declares its sinks (GPT-OSS)
                meta["declared_sinks"] = {
                    "logits": [[_round(float(x)) for x in m.sinks.detach().float()] if m.sinks is not None else None
                               for m in mods],
                    "weight": [ratio(a["declared"]) for a in acc],
                    "what": "each head's learned sink logit, and the mean share of its softmax rows the sink takes "
                            f"(1 - the row's weights' sum) at query positions >= {meta['sink_from_position']}; the "
                            "sink role's scores measure the weight on the first token"}
            pos = [patterns.positional_from_counts(a["offsets"]) for a in acc]
            scores["positional"] = [[_round(float(x)) for x in share] for share, _ in pos]
            meta["positional_offsets"] = [[int(x) for x in off] for _, off in pos]
        if "induction" in chosen:
            ids = induction_batch(model, stream, length=induction_len, batch=induction_batch_size, seed=seed)
            # one batch, as one process runs it, on the last rank (a split batch is not bitwise the same
            # forward, and the scores' 6-digit rounding would show it); the others add zeros
            out = _induction_sums(model, ids if dp.rank == dp.world - 1 else ids[:0], len(mods), n_heads)
            if dp.world > 1:
                summed = iter(dp.sum_many([t for i in range(len(mods)) for t in out[i]]))
                out = {i: (next(summed), next(summed)) for i in range(len(mods))}
            scores["induction"] = [[_round(float(x)) for x in torch.where(d > 0, n / d.clamp_min(1e-300), 0)]
                                   for n, d in (out[i] for i in range(len(mods)))]
            meta["induction"] = {"length": induction_len, "sequences": induction_batch_size,
                                 "source": "distinct tokens of the text, seeded, each sequence repeated twice"}
        if {"syntactic", "rare_word"} & set(chosen):
            _sentences(model, texts, causal, max_sentences, batch_size, progress, n_heads, scores, meta, dp)
    finally:
        model.train(was_training)

    scores = {r: scores[r] for r in chosen if r in scores}
    thresholds = {r: THRESHOLDS[r] for r in ROLES if r in scores}
    for r in thresholds:
        heads[r] = _labelled(r, scores[r], thresholds[r], meta)
    meta["thresholds_rule"] = {r: (">" if r in STRICT else ">=") for r in thresholds}
    return RoleScores(scores, thresholds, heads, meta)


def _induction_sums(model, ids: Tensor, n_layers: int, n_heads: list[int]) -> dict:
    """{layer: (sum(A * P), sum(A))} of the induction pattern over these sequences (zeros for none)."""
    if ids.shape[0] == 0:  # a rank that does not run the induction batch adds nothing
        return {i: (torch.zeros(n_heads[i], dtype=torch.float64), torch.zeros(n_heads[i], dtype=torch.float64))
                for i in range(n_layers)}
    pattern = patterns.induction_pattern(ids)
    return capture(model, ids.to(_device(model)), summaries=lambda layer, w: patterns.pattern_sums(w, pattern))


def _sentences(model, texts, causal, max_sentences, batch_size, progress, n_heads, scores, meta, dp=None):
    from headcount.analysis.syntax import parse_sentences, relation_names

    sentences = split_sentences(texts, max_sentences=max_sentences)
    if not sentences:
        raise ValueError("texts: no sentence of 4 or more words, which the syntactic and rare_word roles need "
                         "(they need at least one sentence)")
    parsed = parse_sentences(model, sentences, causal=causal, max_len=min(128, model.config.max_position))
    if not parsed:
        raise ValueError("texts: every sentence is longer than 128 tokens; the syntactic and rare_word roles need "
                         "at least one shorter sentence")
    names = relation_names()
    acc = {"causal": causal, "n_rel": {n: 0 for n in names}, "n_rare": 0}
    for layer, h in enumerate(n_heads):
        acc[layer] = {"rel": {n: torch.zeros(h, dtype=torch.float64) for n in names},
                      "rare": torch.zeros(h, dtype=torch.float64)}
    _sentence_pass(model, parsed, max(batch_size, 16), acc, progress, dp)  # short rows: larger batches
    base = relation_baselines(parsed)
    scored = [n for n in names if base[n]["n"] >= MIN_INSTANCES]
    detail = {}
    for n in names:
        entry = dict(base[n])
        entry["scored"] = n in scored
        if entry["baseline"] is not None:
            entry["baseline"] = _round(entry["baseline"])
        if base[n]["n"]:
            entry["accuracy"] = [[_round(float(x) / base[n]["n"]) for x in acc[l]["rel"][n]]
                                 for l in range(len(n_heads))]
        detail[n] = entry
    gains, best_rel = [], []
    for layer, h in enumerate(n_heads):
        row, rel_row = [], []
        for head in range(h):
            best, which = -math.inf, None
            for n in scored:
                g = float(acc[layer]["rel"][n][head]) / base[n]["n"] - base[n]["baseline"]
                if g > best:
                    best, which = g, n
            row.append(_round(best) if which is not None else 0.0)
            rel_row.append(which)
        gains.append(row)
        best_rel.append(rel_row)
    if "syntactic" in meta["roles"]:
        scores["syntactic"] = gains
        meta["syntactic"] = {
            "relations": detail, "best_relation": best_rel, "min_instances": MIN_INSTANCES,
            "directions": {"->": "the governor (syntactic head word) attends to its dependent",
                           "<-": "the dependent attends to its governor"},
            "alignment": "words map to their first subword token by character offsets",
            "causal_rule": ("causal model: only instances whose target token comes before the query token "
                            "are scored" if causal else "encoder: every instance is scored"),
            "score": "accuracy of the head's argmax minus the best fixed relative offset's accuracy, best relation",
            "sentences": len(parsed)}
    if "rare_word" in meta["roles"]:
        n_rare = acc["n_rare"]
        scores["rare_word"] = [[_round(float(x) / n_rare) if n_rare else 0.0 for x in acc[l]["rare"]]
                               for l in range(len(n_heads))]
        meta["rare_word"] = {"queries": n_rare, "frequencies": "wordfreq, English",
                             "queries_rule": ("positions after the rare word's first subword" if causal
                                              else "every other position")}


def labelled_heads(role: str, scores: Sequence[Sequence[float]], threshold: float | None = None,
                   extra: Sequence[Sequence] | None = None) -> list[list]:
    """[[layer, head(, extra)], ...] of the heads past `threshold` (default THRESHOLDS[role]), highest score
    first (ties: lower layer, then head). extra[layer][head] is appended when given (offset, relation)."""
    threshold = THRESHOLDS[role] if threshold is None else threshold
    passes = (lambda s: s > threshold) if role in STRICT else (lambda s: s >= threshold - 1e-12)
    found = [(float(s), layer, head) for layer, row in enumerate(scores) for head, s in enumerate(row) if passes(s)]
    found.sort(key=lambda e: (-e[0], e[1], e[2]))
    return [[layer, head] + ([extra[layer][head]] if extra is not None else []) for _, layer, head in found]


def layer_scores(weights: Tensor, ids: Tensor | None = None, *, causal: bool = True,
                 query_mask: Tensor | None = None) -> dict[str, Tensor]:
    """The window roles for ONE layer's weights [B, H, T, S] (or [H, T, S]), as pure functions:
    previous_token, positional (+ positional_offset), sink, and with ids [B, T] duplicate_token and
    induction (meaningful on repeated sequences). Each a [H] tensor."""
    w = weights if weights.dim() == 4 else weights.unsqueeze(0)
    t, s = w.shape[-2:]
    out = {"previous_token": patterns.pattern_score(w, patterns.previous_token_pattern(t, s), query_mask)}
    share, offset = patterns.positional_score(w, query_mask)
    out["positional"], out["positional_offset"] = share, offset
    num, den = patterns.first_token_sums(w, query_mask, min_position=SINK_FROM if causal else 0)
    out["sink"] = torch.where(den > 0, num / den.clamp_min(1), torch.zeros_like(num))
    if ids is not None:
        ids = ids if ids.dim() == 2 else ids.unsqueeze(0)
        out["duplicate_token"] = patterns.pattern_score(w, patterns.duplicate_token_pattern(ids, causal=causal),
                                                        query_mask)
        out["induction"] = patterns.pattern_score(w, patterns.induction_pattern(ids), query_mask)
    return out


def _labelled(role: str, scores: list[list[float]], threshold: float, meta: dict) -> list[list]:
    extra = None
    if role == "positional":
        extra = meta["positional_offsets"]
    elif role == "syntactic":
        extra = meta["syntactic"]["best_relation"]
    return labelled_heads(role, scores, threshold, extra)
