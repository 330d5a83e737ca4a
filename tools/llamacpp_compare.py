#!/usr/bin/env python
"""headcount against llama.cpp on the same GGUF files and the same token ids.

    .venv/bin/python tools/llamacpp_compare.py --quick          # 256 tokens, one window
    .venv/bin/python tools/llamacpp_compare.py                  # 2,048 tokens in windows of 1,024
    .venv/bin/python tools/llamacpp_compare.py --cases smollm2-pruned20,gemma3-270m --json out.json

Needs Node.js >= 20 and node-llama-cpp 3.21.1, whose npm packages carry llama.cpp's prebuilt CPU
binaries: `cd tools/llamacpp && npm install` (package.json pins it; .npmrc skips the other platforms'
and the CUDA builds). Without them the script prints one line saying what is missing and exits 0
(exit 2 with --require).

For each case it takes the held-out part of the default corpus (what `headcount perplexity` measures),
tokenizes it ONCE with headcount's tokenizer and sends the same ids to both sides. Where the GGUF says
tokenizer.ggml.add_bos_token (Gemma 3; llama.cpp's own perplexity tool then adds it, and Gemma without it
predicts nonsense) every window opens with BOS, as its unscored first token (`--bos on|off` to force):

- headcount: the per-token NLL over non-overlapping windows (headcount.models.evaluation's definition,
  the first token of each window unscored), the perplexity from `evaluate_perplexity` on those ids, the
  argmax at every position, and 32 greedy tokens after the first 32 ids (`generate`, eos not stopping);
- llama.cpp (tools/llamacpp/score.mjs): every window evaluated from an empty context, the probability
  of each next token (node-llama-cpp's full-vocabulary softmax of llama.cpp's f32 logits; its sampler
  chain is greedy alone, so nothing is filtered; renormalised in f64, because the addon's f32 sum drops
  the vocabulary's tail: that made perplexity read ~1.6e-4 relative low on smollm2), its argmax, and 32
  greedy tokens from the same prompt.
  The KV cache is f32 (`--kv f16` for llama.cpp's default).

Cases (`--cases`; the default is every case but the 1.5b model and the surgery on the new families):

  smollm2             the package's own Q4_1 GGUF, unmodified. llama.cpp multiplies the Q4_1 blocks
                      (activations rounded to Q8_1 on the CPU path), headcount the fp32 dequantisation:
                      the same weights, not the same arithmetic
  smollm2-export      the unmodified model exported by headcount (deci, f32): the same math on both sides
  smollm2-pruned20    prune_to(0.2, mode="query") with the defaults (reconstruction order, lstsq refit;
                      `headcount prune --fraction 0.2`), exported to GGUF (deci, f32)
  smollm2-mqa         merge_kv(model, 1, local_steps=0, uptrain_steps=0): every layer one K/V head (closed form), exported (deci, f32)
  gemma3-270m         the package's own Q4_K_M GGUF (gemma3), unmodified       } where the packages are
  gemma3-270m-f32     that GGUF with every tensor dequantised to F32 by this    } installed, else a
                      script (gguf's dequantize, metadata unchanged): the same   } one-line skip
                      math on both sides, as smollm2-export
  qwen2.5-coder-0.5b  the package's own GGUF (qwen2: Q5_0/Q8_0/Q6_K/Q4_K), unmodified
  qwen2.5-coder-0.5b-f32   the same, dequantised to F32
  qwen2.5-coder-1.5b  the package's own Q4_K_M GGUF (qwen2); not in the default
  gemma3-270m-export, qwen2.5-coder-0.5b-export
                      the unmodified model exported by export_gguf (f32): gemma3 and qwen2 as themselves
  qwen2.5-coder-0.5b-pruned20   prune_to(0.2, mode="query") with the defaults: per-layer head counts, which
                      llama.cpp's qwen2 cannot hold, so export_gguf writes deci with the q/k/v biases
  gemma3-270m-uniform25   prune_to(0.25, mode="query", uniform=True): 3 of 4 query heads in every layer,
                      exported as gemma3 (the lstsq refit gives Gemma 3 no o_proj bias, which llama.cpp's gemma3
                      cannot hold)
  gemma3-270m-pruned20    prune_to(0.2, mode="query") with the defaults (`headcount prune --fraction 0.2`): per-layer
                      counts, written as gemma3 with the removed query heads as exact zero heads (llama.cpp
                      computes them: no compute saved); not in the default
  qwen2.5-coder-0.5b-mqa  merge_kv(model, 1), exported; not in the default
  Every export row's notes say which architecture export_gguf chose and why.

Built models are kept in --workdir (default out/llamacpp/: a headcount save and the GGUF per case) and
reused on the next run unless --rebuild; a reused case loads the save, which gives bit-identical logits.

Columns: perplexity on each side over the same scored tokens, their relative difference, the largest
per-token |NLL difference|, how often the two argmaxes agree, and whether the 32 greedy tokens are equal
(else the first position that differs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = ROOT / "tools" / "llamacpp"
SCORE = NODE_DIR / "score.mjs"
NODE_LLAMA_CPP = "3.21.1"

DEFAULT_CASES = ["smollm2", "smollm2-export", "smollm2-pruned20", "smollm2-mqa", "gemma3-270m", "gemma3-270m-f32",
                 "gemma3-270m-export", "gemma3-270m-uniform25", "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-f32",
                 "qwen2.5-coder-0.5b-export", "qwen2.5-coder-0.5b-pruned20"]
ALL_CASES = DEFAULT_CASES + ["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-f32", "gemma3-270m-pruned20", "qwen2.5-coder-0.5b-mqa"]


class Skip(Exception):
    """This case (or the whole run) cannot be done here: one line saying why."""


# ------------------------------------------------------------------------------------ llama.cpp side
def check_node() -> str:
    """'' when node and node-llama-cpp are usable, else the one-line reason."""
    node = shutil.which("node")
    if node is None:
        return "node is not on PATH (Node.js >= 20 is needed; Debian: apt-get install nodejs npm)"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return f"`node --version` did not answer ({e})"
    if major < 20:
        return f"node {version} is too old: node-llama-cpp {NODE_LLAMA_CPP} needs >= 20"
    pkg = NODE_DIR / "node_modules" / "node-llama-cpp" / "package.json"
    if not pkg.is_file():
        return f"node-llama-cpp is not installed: run `npm install` in {NODE_DIR.relative_to(ROOT)}"
    got = json.loads(pkg.read_text()).get("version")
    if got != NODE_LLAMA_CPP:
        return (f"node-llama-cpp {got} is installed, {NODE_LLAMA_CPP} is pinned: run `npm install` in "
                f"{NODE_DIR.relative_to(ROOT)}")
    probe = subprocess.run([node, str(SCORE), "--check"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return (probe.stderr.strip().splitlines() or [f"score.mjs --check exited {probe.returncode}"])[-1]
    return ""


def llama_cpp_score(gguf: Path, windows: list[list[int]], prompt: list[int], greedy: int, *, threads: int,
                    kv: str) -> dict:
    request = {"windows": windows, "prompt": prompt, "greedy": greedy, "threads": threads, "kv": kv}
    proc = subprocess.run(["nice", "-n", "10", "node", str(SCORE), str(gguf)], input=json.dumps(request),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise Skip(lines[-1] if lines else f"score.mjs exited {proc.returncode}")
    return json.loads(proc.stdout)


def gguf_facts(path: Path) -> dict:
    """Architecture, KV heads summed over layers (what llama.cpp's cache holds) and file size."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))

    def value(key):
        f = reader.fields.get(key)
        if f is None:
            return None
        if len(f.types) and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode()
        vals = [f.parts[i].tolist() for i in f.data]
        vals = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in vals]
        return vals if len(vals) > 1 else vals[0]

    arch = value("general.architecture")
    blocks = value(f"{arch}.block_count")
    kv = value(f"{arch}.attention.head_count_kv")
    heads = value(f"{arch}.attention.head_count")
    kv_total = int(np.sum(kv)) if isinstance(kv, list) else int(kv) * int(blocks)
    q_total = int(np.sum(heads)) if isinstance(heads, list) else int(heads) * int(blocks)
    types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"architecture": arch, "layers": int(blocks), "query_heads": q_total, "kv_heads": kv_total,
            "tensor_types": types, "bytes": path.stat().st_size}


def bos_token(path: Path, mode: str) -> int | None:
    """The BOS id to open each window with, or None (mode auto: the GGUF's tokenizer.ggml.add_bos_token)."""
    if mode == "off":
        return None
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    add = fields.get("tokenizer.ggml.add_bos_token")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    if mode == "auto" and not (add is not None and add.contents()):
        return None
    if bos is None:
        raise Skip(f"{path.name} names no tokenizer.ggml.bos_token_id for --bos {mode}")
    return int(bos.contents())


# ------------------------------------------------------------------------------------ headcount side
@dataclass
class Case:
    name: str
    model: object
    gguf: Path
    what: str
    notes: list = field(default_factory=list)


def _own_gguf(name: str) -> Path:
    from headcount.models import zoo

    if not zoo.installed(name):
        raise Skip(f"{name}'s packages are not installed: {zoo.ZOO[name].pip_command}")
    if name == "smollm2":
        return zoo.smollm2_gguf()
    path, _ = zoo.packaged_gguf(name)
    return path


def build_case(name: str, workdir: Path, rebuild: bool) -> Case:
    from headcount.models import load

    base = name
    for suffix in ("-export", "-pruned20", "-uniform25", "-mqa", "-f32"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
    surgery = name[len(base) + 1:] if name != base else ""
    source = _own_gguf(base)  # also the Skip when the package is missing
    if not surgery:
        model = load(base)
        return Case(name, model, source, f"{base}'s own GGUF, unmodified")
    if surgery == "f32":
        gguf = workdir / f"{name}.gguf"
        notes = []
        if rebuild or not gguf.is_file():
            t = time.perf_counter()
            f32_copy(source, gguf)
            notes.append(f"F32 copy written in {time.perf_counter() - t:.0f} s")
        return Case(name, load(base), gguf, f"{base}'s own GGUF, every tensor dequantised to F32", notes)

    from headcount.models.formats.gguf_deci import choose_architecture
    from headcount.surgery import export_gguf, save

    save_dir, gguf = workdir / name, workdir / f"{name}.gguf"
    what = {"export": "unmodified, exported (f32)",
            "pruned20": "20% of query heads pruned (query mode, defaults), exported (f32)",
            "uniform25": "25% of query heads pruned, the same number in every layer (query mode), exported (f32)",
            "mqa": "every layer merged to 1 K/V head (merge_kv, closed form), exported (f32)"}[surgery]
    if not rebuild and save_dir.is_dir() and gguf.is_file():
        model = load(save_dir)
        where = save_dir.relative_to(ROOT) if save_dir.is_relative_to(ROOT) else save_dir
        return Case(name, model, gguf, what, [f"reused {where}", _why(choose_architecture(model))])
    model = load(base)
    notes = []
    if surgery in ("pruned20", "uniform25"):
        _export_precheck(model)
        from headcount.surgery import prune_to

        t = time.perf_counter()
        fraction, uniform = (0.2, False) if surgery == "pruned20" else (0.25, True)
        # the defaults: lstsq refit (with no o_proj bias on Gemma 3, whose llama.cpp graph has none)
        compensate = "lstsq"
        result = prune_to(model, fraction, mode="query", uniform=uniform, compensate=compensate)
        notes.append(f"prune_to {fraction} query{' uniform' if uniform else ''} compensate {compensate}: query heads "
                     f"{result.heads_before} -> {result.heads_after}, {time.perf_counter() - t:.0f} s")
    elif surgery == "mqa":
        _export_precheck(model)
        from headcount.surgery import merge_kv

        t = time.perf_counter()
        merge_kv(model, 1, local_steps=0, uptrain_steps=0, progress=False)  # the closed form
        notes.append(f"merge_kv 1: {time.perf_counter() - t:.0f} s")
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        notes.append(_why(choose_architecture(model)))
    except ValueError as e:
        raise Skip(f"export_gguf refuses it: {str(e).splitlines()[0]}") from None
    save(model, save_dir, force=True)
    export_gguf(model, gguf, force=True)
    return Case(name, model, gguf, what, notes)


def _why(choice: tuple[str, str]) -> str:
    return f"export_gguf wrote {choice[0]}: {choice[1]}"


def f32_copy(source: Path, target: Path) -> None:
    """`source` with every tensor dequantised to F32 by the gguf package (the values headcount computes
    with), all metadata but general.file_type unchanged: llama.cpp then runs the same weights in f32.
    One tensor in memory at a time; written to a temporary sibling and renamed."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        for f in reader.fields.values():
            if f.name == "general.architecture" or f.name.startswith("GGUF."):
                continue
            if f.name == "general.alignment" and f.contents() != gguf.GGUF_DEFAULT_ALIGNMENT:
                raise Skip(f"{source.name}: general.alignment {f.contents()} is not handled by this copy")
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = int(gguf.LlamaFileType.ALL_F32) if f.name == "general.file_type" else f.contents()
            writer.add_key_value(f.name, value, vtype, sub_type=sub)
        shapes = []
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # numpy order
            shapes.append(shape)
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4,
                                   raw_dtype=gguf.GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t, shape in zip(reader.tensors, shapes):
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
            writer.write_tensor_data(np.ascontiguousarray(data))
        writer.close()
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _export_precheck(model) -> None:
    """export_gguf's own check of the unmodified model, before spending minutes on surgery it cannot write."""
    from headcount.models.formats.gguf_deci import choose_architecture

    try:
        choose_architecture(model)
    except ValueError as e:
        raise Skip(f"export_gguf would refuse it: {str(e).splitlines()[0]}") from None


def headcount_score(model, windows: list[list[int]], prompt: list[int], greedy: int) -> dict:
    import torch

    from headcount.models import generate
    from headcount.models.decoder import chunked_nll
    from headcount.models.evaluation import evaluate_perplexity

    ids = [t for w in windows for t in w]
    nll, argmax, top = [], [], []
    with torch.inference_mode():
        for w in windows:
            x = torch.tensor([w])
            hidden = model(x, compute_logits=False).hidden_states[0]
            nll.append(chunked_nll(hidden[:-1], x[0, 1:], model.lm_head).double().tolist())
            chunk = max(1, (1 << 25) // model.lm_head.weight.shape[0])
            lp, ix = [], []
            for i in range(0, len(w) - 1, chunk):  # the 5 most likely tokens: how close a disagreement was
                v, j = torch.log_softmax(model.lm_head(hidden[i:min(i + chunk, len(w) - 1)]).float(), -1).topk(5)
                lp.append(v.double())
                ix.append(j)
            top.append((torch.cat(ix).tolist(), torch.cat(lp).tolist()))
            argmax.append([t[0] for t in top[-1][0]])
        ppl = evaluate_perplexity(model, ids, window=len(windows[0]))
        new = generate(model, prompt, greedy, stop_at_eos=False).new_ids if greedy else []
    return {"nll": nll, "argmax": argmax, "top": top, "perplexity": ppl.perplexity, "n_scored": ppl.n_scored,
            "greedy": new}


# ------------------------------------------------------------------------------------ comparison
def compare(hc: dict, lc: dict) -> dict:
    hn = [v for w in hc["nll"] for v in w]
    ln = [(-v if v is not None else math.inf) for w in lc["logprobs"] for v in w]
    if len(hn) != len(ln):
        raise Skip(f"llama.cpp scored {len(ln)} tokens, headcount {len(hn)}")
    ppl_lc = math.exp(math.fsum(ln) / len(ln))
    ppl_hc_tokens = math.exp(math.fsum(hn) / len(hn))
    ha = [a for w in hc["argmax"] for a in w]
    la = [a for w in lc["argmax"] for a in w]
    # where the argmaxes differ: headcount's log-prob margin of its choice over llama.cpp's (a near tie
    # is a few 1e-4 nats; llama.cpp's choice outside headcount's top 5 counts as infinite)
    top_ids = [i for w in hc["top"] for i in w[0]]
    top_lps = [v for w in hc["top"] for v in w[1]]
    gaps = [top_lps[k][0] - (top_lps[k][top_ids[k].index(b)] if b in top_ids[k] else -math.inf)
            for k, (a, b) in enumerate(zip(ha, la)) if a != b]
    first = next((i for i, (a, b) in enumerate(zip(hc["greedy"], lc["greedy"])) if a != b), None)
    return {
        "n_scored": len(hn),
        "ppl_headcount": hc["perplexity"],
        "ppl_headcount_from_tokens": ppl_hc_tokens,
        "ppl_llama_cpp": ppl_lc,
        "rel_diff": (ppl_lc - hc["perplexity"]) / hc["perplexity"],
        "max_abs_nll_diff": max(abs(a - b) for a, b in zip(hn, ln)),
        "mean_abs_nll_diff": math.fsum(abs(a - b) for a, b in zip(hn, ln)) / len(hn),
        "argmax_agree": sum(a == b for a, b in zip(ha, la)) / len(ha),
        "argmax_disagree_max_margin": max(gaps) if gaps else None,
        "greedy_equal": first is None and len(hc["greedy"]) == len(lc["greedy"]),
        "greedy_first_diff": first,
        "nll_headcount": hn,
        "nll_llama_cpp": [v if math.isfinite(v) else None for v in ln],
        "greedy_headcount": hc["greedy"],
        "greedy_llama_cpp": lc["greedy"],
    }


def table(rows: list[dict], greedy: int) -> str:
    head = ["case", "GGUF", "KV heads", "BOS", "tokens", "ppl headcount", "ppl llama.cpp", "rel diff", "max |dNLL|",
            "argmax agree", "(max margin)", f"greedy {greedy} equal"]
    body = []
    for r in rows:
        if "skip" in r:
            body.append([r["case"], "skipped: " + r["skip"]])
            continue
        c, f = r["compare"], r["gguf"]
        greedy_cell = "yes" if c["greedy_equal"] else f"no (from token {c['greedy_first_diff']})"
        body.append([r["case"], f"{f['architecture']} {'/'.join(f['tensor_types'])}", str(f["kv_heads"]),
                     "yes" if r["bos"] is not None else "no", str(c["n_scored"]), f"{c['ppl_headcount']:.4f}", f"{c['ppl_llama_cpp']:.4f}",
                     f"{c['rel_diff']:+.1e}", f"{c['max_abs_nll_diff']:.1e}", f"{100 * c['argmax_agree']:.1f}%",
                     "-" if c["argmax_disagree_max_margin"] is None else f"{c['argmax_disagree_max_margin']:.1e}",
                     greedy_cell])
    widths = [max(len(head[i]), *(len(b[i]) for b in body if len(b) > 2)) if any(len(b) > 2 for b in body)
              else len(head[i]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i])  # noqa: E731
                                   for i, c in enumerate(cells))
    out = [line(head), "  ".join("-" * w for w in widths)]
    for b in body:
        out.append(line(b) if len(b) > 2 else f"{b[0].ljust(widths[0])}  {b[1]}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(ALL_CASES))
    ap.add_argument("--quick", action="store_true", help="256 tokens in one window (default: 2,048 in windows of 1,024)")
    ap.add_argument("--tokens", type=int, help="tokens of the held-out text to score")
    ap.add_argument("--window", type=int, help="tokens per window (each from an empty context)")
    ap.add_argument("--greedy", type=int, default=32, help="greedy tokens compared (default 32)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt of the greedy run: the first N ids (default 32)")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated (see below)")
    ap.add_argument("--bos", choices=("auto", "on", "off"), default="auto",
                    help="open every window with the BOS token: auto = where the GGUF says tokenizer.ggml.add_bos_token "
                         "(Gemma; what llama.cpp's own tools do), on, off (`headcount perplexity` adds none)")
    ap.add_argument("--kv", choices=("f32", "f16"), default="f32", help="llama.cpp's KV cache type (default f32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=ROOT / "out" / "llamacpp", help="built models and GGUFs")
    ap.add_argument("--rebuild", action="store_true", help="redo the surgery even when --workdir has it")
    ap.add_argument("--json", type=Path, help="also write every number (and the greedy tokens) here")
    ap.add_argument("--require", action="store_true", help="exit 2 instead of 0 when llama.cpp is unavailable")
    args = ap.parse_args(argv)
    tokens = args.tokens or (256 if args.quick else 2048)
    window = args.window or min(tokens, 256 if args.quick else 1024)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ALL_CASES]
    if unknown:
        print(f"llamacpp_compare: unknown case {unknown[0]!r}; cases: {', '.join(ALL_CASES)}", file=sys.stderr)
        return 2
    if window < 2 or tokens < 2 or args.prompt < 1:
        print("llamacpp_compare: --tokens and --window need at least 2, --prompt at least 1", file=sys.stderr)
        return 2

    reason = check_node()
    if reason:
        print(f"llamacpp_compare: skipped, llama.cpp is unavailable: {reason}", file=sys.stderr)
        return 2 if args.require else 0

    import torch

    torch.set_num_threads(args.threads)
    from headcount.data import default_corpus
    from headcount.models.evaluation import token_stream, windows as split

    texts = default_corpus().texts("held_out")
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"headcount vs llama.cpp (node-llama-cpp {NODE_LLAMA_CPP}, CPU): held-out corpus, first {tokens} tokens "
          f"in windows of {window} (BOS: {args.bos}), greedy {args.greedy} after the first {args.prompt} ids, KV cache {args.kv}, "
          f"{args.threads} threads; {started}", flush=True)
    rows = []
    for name in cases:
        t0 = time.perf_counter()
        try:
            case = build_case(name, args.workdir, args.rebuild)
            bos = bos_token(case.gguf, args.bos)
            ids = token_stream(case.model, texts)[:tokens]
            if bos is None:
                wins, prompt = split(ids, window), ids[: args.prompt]
            else:  # BOS opens every window (and is its unscored first token) and the greedy prompt
                wins, prompt = [[bos] + w for w in split(ids, window - 1)], [bos] + ids[: args.prompt]
            hc = headcount_score(case.model, wins, prompt, args.greedy)
            t1 = time.perf_counter()
            lc = llama_cpp_score(case.gguf, wins, prompt, args.greedy, threads=args.threads, kv=args.kv)
            row = {"case": name, "what": case.what, "notes": case.notes, "gguf_path": str(case.gguf), "bos": bos,
                   "gguf": gguf_facts(case.gguf), "compare": compare(hc, lc), "llama_cpp": lc["versions"],
                   "llama_cpp_renormalisation": lc.get("max_renormalisation"),
                   "seconds": {"headcount": t1 - t0, "llama_cpp": lc["seconds"]}}
            c = row["compare"]
            print(f"  {name}: {case.what}; ppl {c['ppl_headcount']:.4f} / {c['ppl_llama_cpp']:.4f} "
                  f"(headcount / llama.cpp), greedy equal: {'yes' if c['greedy_equal'] else 'no'} "
                  f"[{time.perf_counter() - t0:.0f} s]" + (f"; {'; '.join(case.notes)}" if case.notes else ""),
                  flush=True)
        except Skip as e:
            row = {"case": name, "skip": str(e)}
            print(f"  {name}: skipped: {e}", flush=True)
        rows.append(row)
        case = None
    print()
    print(table(rows, args.greedy))
    if args.json:
        args.json.write_text(json.dumps({"date": started, "tokens": tokens, "window": window, "kv": args.kv, "bos": args.bos,
                                         "threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
