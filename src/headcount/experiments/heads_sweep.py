"""heads-sweep (chapter 2.3.5): at fixed d_model, more heads means narrower heads; Vaswani et al. 2017
(Table 3, rows A) found a broad optimum where only the extremes lose.

A byte-level decoder built from headcount's own model code (headcount.models.Decoder: GPT-2 style,
learned positions, see small.py for why bytes) is trained on the calibration part of the default
corpus and scored on the held-out part, at fixed d_model, layers, steps, batch and data order, with
n_heads in 1 .. 32 (head_dim = d_model / n_heads) and several seeds each. Parameters and FLOPs are the
same for every head count (headcount.cost); only how d_model is cut into heads changes.
"""

from __future__ import annotations

import time

import torch

from headcount.experiments.results import ExperimentResult, SweepRow, mean_std
from headcount.experiments.small import ByteCorpus, byte_decoder, check_heads, held_out_nll, lm_loss, ppl
from headcount.experiments.train import resolve_config, seeded, train

CLAIM = ("2.3.5: at fixed d_model more heads means narrower heads; the optimum is broad and both extremes lose "
         "(Vaswani et al. 2017, Table 3 rows A).")
# Vaswani et al. 2017, Table 3, rows (A): EN-DE newstest2013 dev perplexity (per word piece) and BLEU,
# d_model 512, d_k = d_v = 512 / h. The base model (h = 8) is the table's first row.
VASWANI_A = {1: (5.29, 24.9), 4: (5.00, 25.5), 8: (4.92, 25.8), 16: (4.91, 25.8), 32: (5.01, 25.4)}
# Sized for a shared 2-core CPU: 18 models x 400 steps (a few minutes idle; ~35 min at load average 25).
FULL = dict(heads=(1, 2, 4, 8, 16, 32), d_model=64, n_layers=2, seq_len=64, batch_size=16, steps=400, seeds=3,
            lr=3e-3, eval_windows=None)
QUICK = dict(heads=(1, 4, 32), d_model=64, n_layers=1, seq_len=32, batch_size=16, steps=150, seeds=1, lr=3e-3,
             eval_windows=128)


def run(*, quick: bool = False, seed: int = 0, steps: int | None = None, seeds: int | None = None,
        progress: bool = True, **options) -> ExperimentResult:
    cfg = resolve_config("heads-sweep", quick, QUICK, FULL, options, steps=steps, seeds=seeds)
    heads = check_heads(cfg["heads"], cfg["d_model"])
    cfg["heads"] = heads
    corpus = ByteCorpus.load()
    windows = corpus.held_out_windows(cfg["seq_len"], cfg["eval_windows"])
    started_cpu = time.process_time()

    def make(n_heads):
        return byte_decoder(cfg["d_model"], n_heads, cfg["n_layers"], cfg["seq_len"])

    torch.manual_seed(seed)
    untrained = ppl(held_out_nll(make(heads[0]), windows))
    rows: list[SweepRow] = []
    for n_heads in heads:
        ppls, secs = [], []
        for s in range(cfg["seeds"]):
            gen = seeded(seed + s)  # the same data order for every head count
            model = make(n_heads)
            log = train(model, lambda step: corpus.batch(gen, cfg["batch_size"], cfg["seq_len"]), lm_loss,
                        steps=cfg["steps"], lr=cfg["lr"], weight_decay=0.01,
                        desc=f"heads-sweep n_heads={n_heads} seed={seed + s}", progress=progress)
            ppls.append(ppl(held_out_nll(model, windows)))
            secs.append(log.seconds_per_step)
        mean, std = mean_std(ppls)
        vas = VASWANI_A.get(n_heads)
        rows.append(SweepRow(n_heads=n_heads, head_dim=cfg["d_model"] // n_heads, ppl_mean=mean, ppl_std=std,
                             ppl_seeds=ppls, params=sum(p.numel() for p in model.parameters()),
                             seconds_per_step=round(sum(secs) / len(secs), 4),
                             vaswani_ppl=vas[0] if vas else None, vaswani_bleu=vas[1] if vas else None))
    details = {"tokenizer": "bytes (vocab 256)", "held_out_bytes_scored": int(windows[:, 1:].numel()),
               "uniform_ppl": 256.0, "unigram_ppl": ppl(corpus.unigram_nll()), "untrained_ppl": untrained,
               "cpu_seconds": round(time.process_time() - started_cpu, 1), "vaswani_table3_A": VASWANI_A}
    return ExperimentResult("heads-sweep", CLAIM, quick, cfg, rows, details, _notes(rows))


def _notes(rows: list[SweepRow]) -> list[str]:
    if len(rows) < 2:
        return []
    best = min(rows, key=lambda r: r.ppl_mean)
    notes = [f"best: {best.n_heads} head(s) (head_dim {best.head_dim}), held-out ppl {best.ppl_mean:.3f} "
             f"± {best.ppl_std:.3f}"]
    near = [r.n_heads for r in rows if r.ppl_mean - best.ppl_mean <= max(best.ppl_std, r.ppl_std, 1e-9) * 2]
    notes.append(f"within two standard deviations of the best: n_heads {near}")
    for r in (rows[0], rows[-1]):
        if r is not best:
            spread = max(best.ppl_std, r.ppl_std)
            verdict = "loses" if r.ppl_mean - best.ppl_mean > 2 * spread else "does not clearly lose"
            notes.append(f"{r.n_heads} head(s): +{100 * (r.ppl_mean / best.ppl_mean - 1):.1f}% ppl vs the best "
                         f"({verdict} at this spread)")
    return notes


def format_text(result: ExperimentResult) -> str:
    cfg, d = result.config, result.details
    lines = [f"heads-sweep: byte-level decoder, d_model {cfg['d_model']}, {cfg['n_layers']} layer(s), context "
             f"{cfg['seq_len']}, {cfg['steps']} steps x batch {cfg['batch_size']}, {cfg['seeds']} seed(s); trained on "
             f"the calibration part, perplexity per byte on {d['held_out_bytes_scored']:,} held-out bytes",
             f"{'n_heads':>7} {'head_dim':>8} {'ppl mean':>9} {'± std':>7} {'params':>9} {'s/step':>7}   "
             f"{'Vaswani (A): dev ppl':>20} {'BLEU':>5}"]
    for r in result.rows():
        vas = (f"{r['vaswani_ppl']:>20.2f} {r['vaswani_bleu']:>5.1f}" if r["vaswani_ppl"] is not None
               else f"{'-':>20} {'-':>5}")
        lines.append(f"{r['n_heads']:>7} {r['head_dim']:>8} {r['ppl_mean']:>9.3f} {r['ppl_std']:>7.3f} "
                     f"{r['params']:>9,} {r['seconds_per_step']:>7.3f}   {vas}")
    lines.append(f"baselines: uniform {d['uniform_ppl']:.0f}, unigram {d['unigram_ppl']:.2f}, untrained "
                 f"{d['untrained_ppl']:.1f}; CPU time {d['cpu_seconds']:.0f} s")
    lines += result.notes
    return "\n".join(lines)


def plot(result: ExperimentResult, ax) -> None:
    rows = result.rows()
    xs = [r["n_heads"] for r in rows]
    ax.errorbar(xs, [r["ppl_mean"] for r in rows], yerr=[r["ppl_std"] for r in rows], marker="o", capsize=3,
                label=f"this run: held-out ppl per byte (d_model {result.config['d_model']})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x}\n({result.config['d_model'] // x})" for x in xs])
    ax.set_xlabel("n_heads (head_dim)")
    ax.set_ylabel("held-out perplexity per byte")
    ax.set_title("heads-sweep at fixed d_model")
    twin = ax.twinx()
    vx = sorted(VASWANI_A)
    twin.plot(vx, [VASWANI_A[h][0] for h in vx], marker="s", color="tab:orange", linestyle="--",
              label="Vaswani et al. 2017 Table 3 (A): dev ppl")
    twin.set_ylabel("Vaswani dev perplexity (word pieces)", color="tab:orange")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper center")
