"""Which heads each rank gets: pure arithmetic, no torch. Used by the per-rank accounts (cost/parallel.py)
and by headcount.parallel to cut the real shards, so the two never disagree.

Query heads are split into contiguous runs, as even as possible, the first ranks taking one more:
9 heads over 2 ranks = 5 + 4; over 4 ranks = 3 + 2 + 2 + 2. Each rank keeps the KV heads its query
heads read; a KV head read from two ranks is held (and cached) on both: "replicated".

    SmolLM2 (9 query heads, 3 KV heads, q -> kv: 0 0 0 1 1 1 2 2 2) over 2 ranks:
        rank 0: query heads 0-4 -> KV heads 0, 1       rank 1: query heads 5-8 -> KV heads 1, 2
        KV head 1 lives on both ranks: 4 KV heads stored where one process stores 3.

The same rule splits an MLP's hidden units (d_ff) into contiguous column blocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from headcount.arguments import positive_int


def _positive(name: str, value) -> int:
    return positive_int(name, value, type_error=TypeError)  # a wrong type is a TypeError, as in attention.py


def split_even(n: int, world_size: int, *, what: str = "n_heads") -> list[range]:
    """n items over world_size ranks: contiguous ranges, sizes differing by at most one, larger first.

    Raises ValueError when world_size > n (a rank would get nothing)."""
    _positive(what, n)
    _positive("world_size", world_size)
    if world_size > n:
        raise ValueError(f"world_size: {world_size} ranks is more than {what}={n}; every rank needs at least one "
                         f"(use at most {n} ranks)")
    base, extra = divmod(n, world_size)
    out, start = [], 0
    for rank in range(world_size):
        size = base + (rank < extra)
        out.append(range(start, start + size))
        start += size
    return out


def uniform_kv_map(n_heads: int, n_kv_heads: int) -> tuple[int, ...]:
    """Query head i reads KV head i // (n_heads // n_kv_heads) (GQA's convention)."""
    _positive("n_heads", n_heads)
    _positive("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads={n_heads}, got {n_kv_heads}")
    group = n_heads // n_kv_heads
    return tuple(i // group for i in range(n_heads))


@dataclass(frozen=True)
class RankHeads:
    """One rank's share of one attention module (indices are the module's own head indices)."""

    rank: int
    world_size: int
    query_heads: tuple[int, ...]
    kv_heads: tuple[int, ...]  # the KV heads its query heads read (sorted)
    replicated_kv_heads: tuple[int, ...]  # those of kv_heads that another rank holds too

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def head_plan(n_heads: int, world_size: int, *, n_kv_heads: int | None = None,
              kv_head_of: tuple[int, ...] | list[int] | None = None) -> list[RankHeads]:
    """Every rank's query heads and KV heads, for one attention module.

    kv_head_of: the query -> KV head map (a pruned module's may be uneven); default the uniform GQA map
    for n_kv_heads (None = MHA).
    """
    _positive("n_heads", n_heads)
    if kv_head_of is None:
        kv_head_of = uniform_kv_map(n_heads, n_heads if n_kv_heads is None else n_kv_heads)
    kv_head_of = tuple(int(k) for k in kv_head_of)
    if len(kv_head_of) != n_heads:
        raise ValueError(f"kv_head_of: expected {n_heads} entries (one per query head), got {len(kv_head_of)}")
    ranges = split_even(n_heads, world_size, what="n_heads")
    reads = [tuple(sorted({kv_head_of[q] for q in r})) for r in ranges]
    holders: dict[int, int] = {}
    for kv in reads:
        for k in kv:
            holders[k] = holders.get(k, 0) + 1
    return [RankHeads(rank, world_size, tuple(r), kv, tuple(k for k in kv if holders[k] > 1))
            for rank, (r, kv) in enumerate(zip(ranges, reads))]


def stored_kv_heads(plan: list[RankHeads]) -> int:
    """KV heads held over all ranks (replicas counted): >= the module's n_kv_heads."""
    return sum(len(p.kv_heads) for p in plan)
