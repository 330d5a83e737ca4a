"""`headcount bench serve`: what an edit buys where a model is served, measured in each engine beside the unedited
model, with the ratios the accounts predict.

For every engine, model (the unedited one and each --edited directory), context and batch, one ServeRow: the KV
bytes the engine itself allocates, peak resident memory, prefill and decode tokens/s. Each engine runs out of
process (engines/): headcount's worker in a fresh process per row, llama.cpp's serve.mjs per row, one vLLM engine
per model serving all its rows. An engine that cannot run gives one line (`skipped`) and the others still run.

The prompt is the default corpus's held-out text (then its calibration text), tokenized once, cut to the context:
every engine reads the same ids. Each batch row holds the same prompt (no engine here shares prefixes: vLLM's
prefix caching is off). decode_tokens_per_s = batch x (new_tokens - 1) / the time after the first new token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from headcount.engines.rows import ENGINES, EngineUnavailable, ServeResult, ServeRow

NEW_TOKENS = 33  # the first after the prompt (prefill), then 32 decode steps
ZOO_SAFE = "abcdefghijklmnopqrstuvwxyz0123456789.-"


@dataclass
class Variant:
    """The unedited model (edited None) or one edit, with what the engines need of it."""

    label: str  # what the table shows
    edited: str | None
    source: str  # what headcount's worker loads: the zoo name / path given
    heads: tuple[tuple[int, int], ...]
    digest: str
    notes: dict  # engine -> notes from its export (architecture chosen, zero heads)


def _slug(text: str) -> str:
    return "".join(c if c in ZOO_SAFE else "-" for c in Path(text).name.lower()) or "model"


def check_engines(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ENGINES]
    if bad or not names:
        raise ValueError(f"--engines: expected a comma-separated list of {', '.join(ENGINES)}, got {text!r}")
    return list(dict.fromkeys(names))


def check_ints(flag: str, text: str) -> list[int]:
    from headcount.cost.fit import parse_seq
    from headcount.cost.shape import CostError

    try:
        values = [parse_seq(t) for t in text.split(",") if t.strip()]
    except CostError:
        values = []
    if not values:
        raise ValueError(f"{flag}: expected positive whole numbers separated by commas (512,4096 or 4k), got {text!r}")
    return list(dict.fromkeys(values))


def prompt_ids(model, length: int) -> list[int]:
    """The held-out text's ids (then the calibration text's), repeated if the context is longer than both."""
    from headcount.data import default_corpus

    if model.tokenizer is None:  # a model without one (a test's random model): its vocabulary in order
        ids = list(range(model.config.vocab_size))
    else:
        corpus = default_corpus()
        ids = model.tokenizer.encode(corpus.held_out_text + "\n\n" + corpus.calibration_text)
    return (ids * (length // len(ids) + 1))[:length]


def _variant(model, label: str, edited: str | None, source: str) -> Variant:
    from headcount.models.fingerprint import weights_hash

    heads = tuple((layer.attn.n_heads, layer.attn.n_kv_heads) for layer in model.layers)
    return Variant(label, edited, source, heads, weights_hash(model)[:12], {})


def run_shape_note(base_shape, v: Variant, runs: tuple, seq: int, batch: int) -> list[str]:
    """[] when the engine computes the edit's own heads; else one note with the accounts for the heads it does
    compute (a padded or copied layout): the predicted columns stay the edit's, this says what the file can buy."""
    if v.edited is None or runs == v.heads:
        return []
    from headcount.cost.edited import EditedShape, predict
    from headcount.engines import llamacpp_engine

    p = predict(base_shape, EditedShape(base_shape.base, runs, v.label), batch=batch, seq=seq,
                kv_dtype=llamacpp_engine.KV_DTYPE, weight_dtype=llamacpp_engine.WEIGHT_DTYPE)
    return [f"the shape llama.cpp computes ({sum(q for q, _ in runs)} query heads, {sum(k for _, k in runs)} K/V heads; "
            f"the edit keeps {sum(q for q, _ in v.heads)} and {sum(k for _, k in v.heads)}): the accounts predict "
            f"KV {p['kv_ratio']:.2f}x, prefill {p['prefill_speedup']:.3f}x, decode {p['decode_speedup']:.3f}x for it"]


def _base_shape(model):
    from headcount.cost.edited import EditedShape, decoder_config_shape

    return EditedShape.unedited(decoder_config_shape(model.config.to_dict(), name=str(model.name)))


def run_serve(model_name: str, edited: list[str], engines: list[str], contexts: list[int], batches: list[int], *,
              new_tokens: int = NEW_TOKENS, workdir: Path = Path("out/serve"), threads: int | None = None,
              repeats: int = 1, log=None, progress: bool = True) -> ServeResult:
    """Every row of the bench (see the module doc). ValueError (one line) for bad input, before any engine runs."""
    import os

    from headcount.cost.edited import EditedShape, edited_fit, predict
    from headcount.engines import headcount_engine, llamacpp_engine, vllm_engine
    from headcount.engines.processes import cpu_name
    from headcount.models.formats.vllm_deci import VllmExportError
    from headcount.models.options import load_model

    say = log or (lambda msg: None)
    threads = threads or os.cpu_count() or 1
    workdir = Path(workdir)
    say(f"loading {model_name}")
    base = load_model(model_name, "fp32")
    if not hasattr(base, "lm_head") or not getattr(base.config, "causal", True):
        raise ValueError(f"--model: {model_name} is not a causal decoder; bench serve serves decoders")
    longest = max(contexts) + new_tokens
    if longest > base.config.max_position:
        raise ValueError(f"--context {max(contexts)}: with {new_tokens} new tokens it is past {model_name}'s context "
                         f"of {base.config.max_position} tokens")
    base_shape = _base_shape(base)
    prompt = prompt_ids(base, max(contexts))
    variants = [_variant(base, model_name, None, model_name)]
    models = {None: base}
    for d in edited:
        if not Path(d).is_dir():
            raise ValueError(f"--edited {d}: not a directory (a `prune` / `merge-kv` --out, or an export)")
        say(f"loading {d}")
        m = load_model(d, "fp32")
        for what, mine, theirs in (("vocabulary", m.config.vocab_size, base.config.vocab_size),
                                   ("layer count", m.config.n_layers, base.config.n_layers)):
            if mine != theirs:
                raise ValueError(f"--edited {d}: its {what} ({mine:,}) differs from --model {model_name}'s ({theirs:,}): "
                                 "not an edit of that model")
        variants.append(_variant(m, Path(d).name, d, d))
        models[d] = m
    shapes = {v.edited: EditedShape(base_shape.base, v.heads, v.edited or model_name) for v in variants}

    rows: list[ServeRow] = []
    skipped: dict[str, str] = {}
    capacity: list[dict] = []
    total = len(engines) * len(variants) * len(contexts) * len(batches)
    bar = _bar(total, progress)

    def predicted(v: Variant, context: int, batch: int, kv_dtype: str, weight_dtype: str):
        if v.edited is None:
            return None, None, None
        p = predict(shapes[None], shapes[v.edited], batch=batch, seq=context + new_tokens, kv_dtype=kv_dtype,
                    weight_dtype=weight_dtype)
        return p["kv_ratio"], p["prefill_speedup"], p["decode_speedup"]

    def row(engine, v, context, batch, kv, rss, prefill_s, decode_s, kv_dtype, weight_dtype, notes=()):
        kv_r, pre_r, dec_r = predicted(v, context, batch, kv_dtype, weight_dtype)
        rows.append(ServeRow(engine, model_name, v.edited, context, batch, kv, rss,
                             batch * context / prefill_s if prefill_s else None,
                             batch * (new_tokens - 1) / decode_s if decode_s else None, kv_r, pre_r, dec_r,
                             list(notes)))

    for engine in engines:
        planned = len(variants) * len(contexts) * len(batches)
        try:
            if engine == "headcount":
                for v in variants:
                    for context in contexts:
                        for batch in batches:
                            bar.set_description(f"headcount {v.label} {context}x{batch}")
                            out = _best(repeats, lambda: headcount_engine.serve(
                                v.source, prompt[:context], batch=batch, new_tokens=new_tokens, threads=threads))
                            row("headcount", v, context, batch, out["kv_bytes"], out["peak_rss_bytes"],
                                out["prefill_s"], out["decode_s"], headcount_engine.KV_DTYPE,
                                headcount_engine.WEIGHT_DTYPE)
                            bar.update(1)
                            planned -= 1
            elif engine == "llamacpp":
                llamacpp_engine.check()
                for v in variants:
                    gguf = workdir / f"{_slug(v.source)}-{v.digest}-{llamacpp_engine.GROUPS}.gguf"
                    bar.set_description(f"llamacpp: exporting {v.label}")
                    plan = llamacpp_engine.export(models[v.edited], gguf)
                    notes = llamacpp_engine.notes(plan)
                    # the heads the GGUF makes llama.cpp compute (zero query heads, copied K/V heads included)
                    runs = tuple(zip(plan["query_heads_written"], plan["kv_heads_written"]))
                    for context in contexts:
                        for batch in batches:
                            bar.set_description(f"llamacpp {v.label} {context}x{batch}")
                            out = _best(repeats, lambda: llamacpp_engine.serve(
                                gguf, prompt[:context], batch=batch, new_tokens=new_tokens, threads=threads))
                            row("llamacpp", v, context, batch, out["kv_bytes"], out["peak_rss_bytes"],
                                out["prefill_s"], out["decode_s"], llamacpp_engine.KV_DTYPE,
                                llamacpp_engine.WEIGHT_DTYPE,
                                notes + run_shape_note(base_shape, v, runs, context + new_tokens, batch))
                            bar.update(1)
                            planned -= 1
            elif engine == "vllm":
                vllm_engine.vllm_python()
                for v in variants:
                    directory = workdir / f"{_slug(v.source)}-{v.digest}-vllm"
                    bar.set_description(f"vllm: exporting {v.label}")
                    try:
                        plan = vllm_engine.export(models[v.edited], directory)
                    except VllmExportError as e:  # this edit only: vLLM cannot hold it; the other models still run
                        skipped[f"vllm {v.edited}"] = f"vllm: {e}"
                        bar.update(len(contexts) * len(batches))
                        planned -= len(contexts) * len(batches)
                        continue
                    jobs = [{"kind": "serve", "prompt": prompt[:c], "batch": b, "new_tokens": new_tokens}
                            for c in contexts for b in batches for _ in range(repeats)]
                    bar.set_description(f"vllm {v.label}: {len(jobs)} rows on one engine")
                    out = vllm_engine.serve(directory, jobs, max_model_len=longest, max_num_seqs=max(batches),
                                            threads=threads)
                    per_block, size = out.get("kv_bytes_per_block"), out.get("block_size")
                    for i in range(0, len(out["jobs"]), repeats):
                        job = _best(repeats, iter(out["jobs"][i:i + repeats]).__next__)
                        c, b = job["context"], job["batch"]
                        kv = per_block * math.ceil((c + new_tokens) / size) * b if per_block else None
                        row("vllm", v, c, b, kv, job["peak_rss_bytes"], job["prefill_s"], job["decode_s"],
                            vllm_engine.KV_DTYPE, vllm_engine.WEIGHT_DTYPE,
                            [f"vLLM {plan['architecture'] or plan['family']}: {plan['reason']}"])
                        bar.update(1)
                        planned -= 1
                    fit = edited_fit(shapes[v.edited], vllm_engine.CACHE_GIB * 2**30, seq=longest,
                                     dtype=vllm_engine.KV_DTYPE, kv_only=True)
                    capacity.append({
                        "engine": "vllm", "model": model_name, "edited": v.edited, "kv_cache_gib": vllm_engine.CACHE_GIB,
                        "max_model_len": longest, "kv_cache_tokens": out.get("kv_cache_tokens"),
                        "max_concurrency": out.get("max_concurrency"), "kv_bytes_per_token": out.get("kv_bytes_per_token"),
                        "num_blocks": out.get("num_blocks"), "block_size": size,
                        # every block of every layer: vLLM's capacity before a request's blocks are rounded up
                        "kv_cache_tokens_in_blocks": (out["num_blocks"] * size) if out.get("num_blocks") else None,
                        # requests of 4,096 tokens its blocks hold (vLLM's "Maximum concurrency" at max_model_len 4096)
                        "max_concurrency_4096": (out["num_blocks"] / math.ceil(4096 / size))
                        if out.get("num_blocks") else None,
                        "accounts_kv_tokens": fit["kv_tokens"], "accounts_max_concurrency": fit["max_concurrency"],
                        "accounts_kv_bytes_per_token": fit["kv_bytes_per_token"],
                        "command": f"headcount cost {v.edited or model_name} --fit {vllm_engine.CACHE_GIB}GiB --kv-only "
                                   f"--dtype fp32 --seq {longest}"})
        except EngineUnavailable as e:
            skipped[engine] = str(e)
            say(f"{engine} skipped: {e}")
            bar.update(planned)
    bar.close()
    settings = _settings(new_tokens=new_tokens, threads=threads, repeats=repeats, contexts=contexts, batches=batches,
                         engines=engines, cache_gib=vllm_engine.CACHE_GIB)
    return ServeResult(rows, skipped, capacity, cpu_name(), settings)


def _settings(*, new_tokens, threads, repeats, contexts, batches, engines, cache_gib) -> dict:
    """The run's settings as the JSON records them (the prompt and each engine's dtypes in words)."""
    return {"new_tokens": new_tokens, "threads": threads, "repeats": repeats, "contexts": contexts,
            "batches": batches,
            "engines": engines, "prompt": "the default corpus's held-out text, then its calibration text",
            "dtypes": {"headcount": "fp32 weights, fp32 KV", "llamacpp": "f32 GGUF, f16 KV (llama.cpp's default)",
                       "vllm": f"fp32 weights, fp32 KV, VLLM_CPU_KVCACHE_SPACE={cache_gib} GiB, "
                               "enforce_eager, no prefix caching"}}


def _best(repeats: int, run) -> dict:
    """`repeats` answers of one row, reduced to the fastest prefill and the fastest decode (another process on the
    machine only ever slows a run down), the largest peak memory; the bytes are the same in every answer."""
    answers = [run() for _ in range(repeats)]
    best = dict(answers[0])
    best["prefill_s"] = min(a["prefill_s"] for a in answers)
    best["decode_s"] = min(a["decode_s"] for a in answers)
    best["peak_rss_bytes"] = max(a["peak_rss_bytes"] or 0 for a in answers) or None
    return best


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, unit="row", leave=False)
