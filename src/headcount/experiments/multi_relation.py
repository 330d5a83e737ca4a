"""multi-relation (chapter 2.3.1): one head gives one weighted average; n heads give n.

The task. A sequence of `seq_len` tokens, each a value in [0, n_values) plus a tag: `n_relations`
positions carry the markers 1..k (one each), the rest are fillers, the last token is the query. The
answer is the ordered k-tuple of the marked values: "the value marked A, the value marked B".
The marker is ADDED to the value's embedding (value + tag + position), as a previous layer writing
"follows marker A" into the residual stream would; so the value vectors of the A- and B-positions
share one subspace and differ only by a constant per tag.

The model. The query reads the sequence through ONE headcount.MultiHeadAttention (no biases), and a
LayerNorm + MLP readout maps query + attention output to k x n_values logits. d_model is fixed, so
every head count has the same parameters (4 d_model^2 in the attention; headcount.cost prints them).

Why one head should fail. Its output is one weighted average sum_j w_j v_j. Attending to both marked
positions gives w_A v_A + w_B v_B, in which the A-value and the B-value sit in the same subspace: with
w_A = w_B it cannot tell (a, b) from (b, a). Two heads can each take one position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headcount.attention import MultiHeadAttention
from headcount.experiments.results import ExperimentResult, RelationRow, mean_std
from headcount.experiments.small import attention_accounts, check_heads
from headcount.experiments.train import resolve_config, seeded, train

Tensor = torch.Tensor

CLAIM = ("2.3.1: one head gives one weighted average per position; n heads give n. A query that needs "
         "values from k positions chosen by k relations needs k heads.")
# 64 values in d_model = 32: the value vectors cannot all be orthogonal, so a mixture of two is hard to undo.
FULL = dict(heads=(1, 2, 4, 8), d_model=32, n_values=64, n_relations=2, seq_len=16, steps=1000, batch_size=128,
            seeds=3, lr=5e-3, test_size=4096)
QUICK = dict(heads=(1, 2), d_model=32, n_values=64, n_relations=2, seq_len=12, steps=400, batch_size=128,
             seeds=1, lr=5e-3, test_size=2048)


class RelationTask:
    """Batches of (values [B, T], tags [B, T], targets [B, k]); tag 0 = filler, 1..k = markers, k+1 = query."""

    def __init__(self, n_values: int, n_relations: int, seq_len: int):
        if seq_len < n_relations + 1:
            raise ValueError(f"seq_len: expected at least n_relations + 1 = {n_relations + 1}, got {seq_len}")
        self.n_values, self.n_relations, self.seq_len = n_values, n_relations, seq_len

    @property
    def n_tags(self) -> int:
        return self.n_relations + 2

    def sample(self, batch_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """values, tags, targets, and the marked positions [B, k]."""
        k, t = self.n_relations, self.seq_len
        values = torch.randint(0, self.n_values, (batch_size, t), generator=gen)
        positions = torch.rand(batch_size, t - 1, generator=gen).argsort(dim=1)[:, :k]  # distinct, never the query
        tags = torch.zeros(batch_size, t, dtype=torch.long)
        tags.scatter_(1, positions, torch.arange(1, k + 1).expand(batch_size, k))
        tags[:, -1] = k + 1
        values[:, -1] = 0
        return values, tags, values.gather(1, positions), positions


class RelationModel(nn.Module):
    """embed(value) + embed(tag) + embed(position) -> one MultiHeadAttention read by the last token -> MLP."""

    def __init__(self, task: RelationTask, d_model: int, n_heads: int, d_ff: int | None = None):
        super().__init__()
        self.task = task
        self.value_embed = nn.Embedding(task.n_values, d_model)
        self.tag_embed = nn.Embedding(task.n_tags, d_model)
        self.pos_embed = nn.Embedding(task.seq_len, d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, bias=False)
        self.norm = nn.LayerNorm(d_model)
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.readout = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(),
                                     nn.Linear(d_ff, task.n_relations * task.n_values))

    def embed(self, values: Tensor, tags: Tensor) -> Tensor:
        pos = torch.arange(values.shape[1], device=values.device)
        return self.value_embed(values) + self.tag_embed(tags) + self.pos_embed(pos)  # (B, T, d)

    def forward(self, values: Tensor, tags: Tensor, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """-> logits [B, k, n_values], weights [B, n_heads, 1, T] (the query's) when need_weights."""
        x = self.embed(values, tags)
        out, weights = self.attn(x[:, -1:], x, need_weights=need_weights)  # the query reads all T tokens
        h = self.norm(x[:, -1] + out[:, 0])
        logits = self.readout(h).view(-1, self.task.n_relations, self.task.n_values)
        return logits, weights


def head_contexts(attn: MultiHeadAttention, query: Tensor, context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each head's output BEFORE o_proj, recomputed from its weights and value vectors.

    -> (ctx [B, n_heads, T_q, head_dim], weights [B, n_heads, T_q, S], values [B, n_heads, S, head_dim]);
    o_proj(ctx.transpose(1, 2).reshape(B, T_q, -1)) equals the module's output.
    """
    nh, nkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    weights = attn(query, context, need_weights=True).weights
    w_v = attn.qkv_proj.weight[(nh + nkv) * hd:]  # V rows: (nkv * hd, d)
    b_v = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[(nh + nkv) * hd:]
    v = F.linear(context, w_v, b_v).view(context.shape[0], context.shape[1], nkv, hd).transpose(1, 2)
    v = v[:, list(attn.kv_head_of)]  # (B, nh, S, hd): the KV head each query head reads
    return weights @ v, weights, v


@torch.no_grad()
def evaluate(model: RelationModel, batch) -> tuple[float, float]:
    """(exact-match accuracy over all k values, per-value accuracy)."""
    values, tags, targets, _ = batch
    logits, _ = model(values, tags)
    right = logits.argmax(-1) == targets
    return float(right.all(dim=1).float().mean()), float(right.float().mean())


@torch.no_grad()
def diagnose(model: RelationModel, batch) -> dict:
    """Where each head's attention goes, and (for every head) how close its output is to the average of
    the values at the marked positions. 0 = exactly their average; 1 = as far as one value is from it."""
    values, tags, targets, positions = batch
    x = model.embed(values, tags)
    ctx, weights, v = head_contexts(model.attn, x[:, -1:], x)
    ctx, weights = ctx[:, :, 0], weights[:, :, 0]  # (B, nh, hd), (B, nh, S)
    k = positions.shape[1]
    idx = positions[:, None, :].expand(-1, weights.shape[1], -1)  # (B, nh, k)
    mass = weights.gather(2, idx)  # (B, nh, k)
    v_marked = v.gather(2, idx[..., None].expand(-1, -1, -1, v.shape[-1]))  # (B, nh, k, hd)
    avg = v_marked.mean(dim=2)
    spread = (v_marked - avg[:, :, None]).norm(dim=-1).mean(dim=2).clamp_min(1e-12)  # (B, nh)
    to_avg = (ctx - avg).norm(dim=-1) / spread
    to_nearest = (ctx[:, :, None] - v_marked).norm(dim=-1).min(dim=2).values / spread
    heads = []
    for h in range(weights.shape[1]):
        heads.append({"head": h,
                      "mass_on_marked": [round(float(m), 4) for m in mass[:, h].mean(0)],
                      "mass_elsewhere": round(float(1 - mass[:, h].sum(-1).mean()), 4),
                      "distance_to_average": round(float(to_avg[:, h].median()), 4),
                      "distance_to_nearest_value": round(float(to_nearest[:, h].median()), 4)})
    return {"relations": k, "heads": heads}


def run(*, quick: bool = False, seed: int = 0, steps: int | None = None, seeds: int | None = None,
        progress: bool = True, **options) -> ExperimentResult:
    cfg = resolve_config("multi-relation", quick, QUICK, FULL, options, steps=steps, seeds=seeds)
    heads = check_heads(cfg["heads"], cfg["d_model"])
    cfg["heads"] = heads
    task = RelationTask(cfg["n_values"], cfg["n_relations"], cfg["seq_len"])
    test = task.sample(cfg["test_size"], torch.Generator().manual_seed(999_983))  # never seen in training

    rows, details = [], {"one_head": None, "one_head_seeds": [], "per_model": {}}
    for n_heads in heads:
        accs, slots, secs, diag = [], [], 0.0, None
        for s in range(cfg["seeds"]):
            gen = seeded(seed + s)
            model = RelationModel(task, cfg["d_model"], n_heads)

            def loss_of(m, batch):
                logits, _ = m(batch[0], batch[1])
                return F.cross_entropy(logits.reshape(-1, task.n_values), batch[2].reshape(-1))

            log = train(model, lambda step: task.sample(cfg["batch_size"], gen), loss_of, steps=cfg["steps"],
                        lr=cfg["lr"], desc=f"multi-relation n_heads={n_heads} seed={seed + s}", progress=progress)
            acc, slot = evaluate(model, test)
            accs.append(acc)
            slots.append(slot)
            secs += log.seconds
            seed_diag = diagnose(model, test)
            if s == 0:
                diag = seed_diag
            if n_heads == 1:  # why one head fails, seed by seed
                details["one_head_seeds"].append({"seed": seed + s, "accuracy": acc, **seed_diag["heads"][0]})
        mean, std = mean_std(accs)
        accounts = attention_accounts(cfg["d_model"], n_heads, cfg["seq_len"])
        rows.append(RelationRow(n_heads=n_heads, head_dim=cfg["d_model"] // n_heads, accuracy=mean,
                                accuracy_std=std, accuracy_seeds=accs, slot_accuracy=mean_std(slots)[0],
                                attention_params=accounts["attention_params"],
                                attention_params_measured=sum(p.numel() for p in model.attn.parameters()),
                                attention_flops=accounts["attention_flops"],
                                score_elements=accounts["score_elements"], train_seconds=round(secs, 2)))
        details["per_model"][str(n_heads)] = diag
        if n_heads == 1:
            details["one_head"] = diag["heads"][0]
    chance = 1.0 / cfg["n_values"] ** cfg["n_relations"]
    details["chance_accuracy"] = chance
    details["symmetric_ceiling"] = _symmetric_ceiling(cfg["n_values"], cfg["n_relations"])
    return ExperimentResult("multi-relation", CLAIM, quick, cfg, rows, details, _notes(rows, details))


def _symmetric_ceiling(n_values: int, k: int) -> float:
    """Best exact-match accuracy of a readout that sees only the multiset of the k values (k = 2:
    right whenever a == b, half the time otherwise)."""
    if k != 2:
        return float("nan")
    same = 1.0 / n_values
    return same + (1 - same) * 0.5


def _notes(rows: list[RelationRow], details: dict) -> list[str]:
    notes = []
    by = {r.n_heads: r for r in rows}
    k = details["one_head"]["mass_on_marked"] if details.get("one_head") else None
    if 1 in by:
        others = [r for r in rows if r.n_heads > 1]
        if others:
            best = max(others, key=lambda r: r.accuracy)
            notes.append(f"one head: accuracy {by[1].accuracy:.3f}; best of several heads: {best.accuracy:.3f} "
                         f"({best.n_heads} heads)")
    seeds = details.get("one_head_seeds", [])
    if len(seeds) > 1:
        notes.append("one head, per seed: " + "; ".join(
            f"seed {h['seed']} accuracy {h['accuracy']:.3f} with attention {h['mass_on_marked']}" for h in seeds))
    if k:
        oh = details["one_head"]
        notes.append(f"the one head (seed {seeds[0]['seed'] if seeds else 0}) puts {' + '.join(f'{m:.2f}' for m in k)} of its attention on the marked "
                     f"positions ({oh['mass_elsewhere']:.2f} elsewhere); its output's distance to the average of "
                     f"their value vectors is {oh['distance_to_average']:.2f} (0 = the average, 1 = one value; "
                     f"distance to the nearest single value: {oh['distance_to_nearest_value']:.2f})")
    return notes


def format_text(result: ExperimentResult) -> str:
    cfg = result.config
    lines = [f"multi-relation: {cfg['n_relations']} relations, {cfg['n_values']} values, seq_len {cfg['seq_len']}, "
             f"d_model {cfg['d_model']}, {cfg['steps']} steps x batch {cfg['batch_size']}, {cfg['seeds']} seed(s)",
             f"{'n_heads':>7} {'head_dim':>8} {'accuracy':>9} {'± std':>7} {'per-value':>9} "
             f"{'attn params (cost)':>18} {'measured':>8} {'attn FLOPs':>10} {'score elems':>11}"]
    for r in result.rows():
        lines.append(f"{r['n_heads']:>7} {r['head_dim']:>8} {r['accuracy']:>9.3f} {r['accuracy_std']:>7.3f} "
                     f"{r['slot_accuracy']:>9.3f} {r['attention_params']:>18,} {r['attention_params_measured']:>8,} "
                     f"{r['attention_flops']:>10,} {r['score_elements']:>11,}")
    d = result.details
    lines.append(f"chance {d['chance_accuracy']:.4f}; a readout that sees only the unordered pair can reach "
                 f"{d['symmetric_ceiling']:.3f}")
    for h in d.get("one_head_seeds", []):
        lines.append(f"  one head, seed {h['seed']}: accuracy {h['accuracy']:.3f}; attention on the marked positions "
                     f"{h['mass_on_marked']}, elsewhere {h['mass_elsewhere']:.3f}; output to the average of their "
                     f"values {h['distance_to_average']:.3f}, to the nearest value {h['distance_to_nearest_value']:.3f}")
    for n, diag in d.get("per_model", {}).items():
        for h in diag["heads"]:
            lines.append(f"  n_heads={n} head {h['head']}: mass on marked {h['mass_on_marked']}, elsewhere "
                         f"{h['mass_elsewhere']:.3f}; output to average {h['distance_to_average']:.3f}, "
                         f"to nearest value {h['distance_to_nearest_value']:.3f}")
            if h["head"] >= 3:
                lines.append(f"  ... ({len(diag['heads']) - 4} more heads)") if len(diag["heads"]) > 4 else None
                break
    lines += result.notes
    return "\n".join(line for line in lines if line is not None)


def plot(result: ExperimentResult, ax) -> None:
    rows = result.rows()
    xs = [r["n_heads"] for r in rows]
    acc, std = [r["accuracy"] for r in rows], [r["accuracy_std"] for r in rows]
    yerr = [[min(s, a) for a, s in zip(acc, std)], [min(s, 1 - a) for a, s in zip(acc, std)]]  # kept in [0, 1]
    ax.errorbar(xs, acc, yerr=yerr, marker="o", capsize=3, label="exact match (k values), ± std over seeds")
    ax.plot([x for r, x in zip(rows, xs) for _ in r["accuracy_seeds"]],
            [a for r in rows for a in r["accuracy_seeds"]], "k.", alpha=0.5, label="each seed")
    ax.plot(xs, [r["slot_accuracy"] for r in rows], marker="s", linestyle="--", label="per value")
    ax.axhline(result.details["symmetric_ceiling"], color="grey", linestyle=":", label="unordered-pair ceiling")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("n_heads (same d_model, same parameters)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title("multi-relation: one head vs several")
    ax.legend(loc="lower right")
