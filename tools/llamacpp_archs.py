#!/usr/bin/env python
"""Which head layouts llama.cpp's `qwen2`, `gemma3` and `deci` graphs run: tiny random headcount models,
written by export_gguf (and, to probe what export_gguf refuses, the same tensors under the model's own
architecture with per-layer head-count arrays), run in llama.cpp (tools/llamacpp/score.mjs, node-llama-cpp
3.21.1) against headcount on the same ids.

    .venv/bin/python tools/llamacpp_archs.py            # ~1 min on 2 CPU cores; --json FILE for every number

Self-contained: the models are random (seeded), their tokenizers tiny GGUF vocabularies written here (a
byte-level BPE with qwen2's pre-tokenizer; a SentencePiece vocabulary with byte pieces, as Gemma's). Each row:
the architecture written, whether llama.cpp loads it (else its error), the largest |log p| difference over the
next-token log-probabilities of 40 ids (past the 8-token sliding window of the gemma3 models), and whether 8
greedy tokens are equal. headcount.models.load(file) is checked against the model on the way.
Needs what tools/llamacpp_compare.py needs (it prints one line and exits 0 without it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_compare import SCORE, check_node  # noqa: E402

N_IDS, N_PROMPT, N_GREEDY = 40, 8, 8


def _byte_chars() -> list[str]:
    """GPT-2's bytes -> printable characters table (bytes_to_unicode), in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


def tokenizer_gguf(path: Path, kind: str) -> int:
    """A GGUF holding only a tokenizer (qwen2: byte-level BPE; gemma3: SentencePiece with byte pieces);
    returns its vocabulary size."""
    import gguf

    w = gguf.GGUFWriter(str(path), kind)
    if kind == "qwen2":
        tokens = _byte_chars() + ["\u0120t", "he", "<|endoftext|>"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types([1] * (len(tokens) - 1) + [3])
        w.add_token_merges(["\u0120 t", "h e"])
        for add in (w.add_bos_token_id, w.add_eos_token_id, w.add_pad_token_id):
            add(len(tokens) - 1)
        w.add_add_bos_token(False)
    else:
        pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "  "]
        tokens = pieces + [f"<0x{i:02X}>" for i in range(256)]
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([3, 3, 3, 2] + [1] * (len(pieces) - 4) + [6] * 256)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(tokens)


def tiny(family: str, vocab: int, seed: int = 0):
    """A random float32 headcount Decoder shaped like Qwen2.5 (GQA, q/k/v biases, tied) or Gemma 3 (MQA,
    head_dim decoupled from d_model, q/k norms, sandwich norms, 5 sliding-window layers of 8 then 1 global)."""
    import torch

    from headcount.models import Decoder, DecoderConfig

    if family == "qwen2":
        cfg = DecoderConfig(vocab_size=vocab, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=192,
                            max_position=256, rope_theta=1e6, norm_eps=1e-6, qkv_bias=True, family="qwen2")
    else:
        cfg = DecoderConfig(vocab_size=vocab, d_model=64, n_layers=6, n_heads=4, n_kv_heads=1, head_dim=32, d_ff=96,
                            max_position=256, norm="rms_float", norm_eps=1e-6, mlp="gated_gelu_tanh", rope_theta=1e6,
                            rope_local_theta=1e4, qk_norm=True, softmax_scale=32 ** -0.5, sliding_window=8,
                            layer_types=("sliding_attention",) * 5 + ("full_attention",), embed_scale=64 ** 0.5,
                            post_norms=True, family="gemma3")
    g = torch.Generator().manual_seed(seed)
    model = Decoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def cases():
    """(name, family, surgery on the model, force): force writes the model's own architecture with per-layer
    head_count arrays (what export_gguf does not write), to see what llama.cpp does with it."""
    from headcount.head_surgery import merge_kv_heads

    def prune(layers):
        def run(model):
            for i, heads in layers.items():
                model.layers[i].attn.prune_heads(heads)
        return run

    def merge(model):
        for layer in model.layers:
            merge_kv_heads(layer.attn, 1)

    return [
        ("qwen2 unmodified", "qwen2", None, False),
        ("qwen2 KV merged to 1 (every layer)", "qwen2", merge, False),
        ("qwen2 query heads 4/3/2 (per layer)", "qwen2", prune({1: [1], 2: [0, 3]}), False),
        ("qwen2 query heads 3 (every layer)", "qwen2", prune({0: [1], 1: [1], 2: [1]}), False),
        ("qwen2 per-layer, forced as qwen2", "qwen2", prune({1: [1], 2: [0, 3]}), True),
        ("qwen2 3 heads, forced as qwen2", "qwen2", prune({0: [1], 1: [1], 2: [1]}), True),
        ("gemma3 unmodified", "gemma3", None, False),
        ("gemma3 query heads 3 (every layer)", "gemma3", prune({i: [1] for i in range(6)}), False),
        ("gemma3 query heads 4/3/4/2/4/4, forced", "gemma3", prune({1: [1], 3: [0, 2]}), True),
        ("gemma3 query heads 4/3/4/2/4/4, zero-padded", "gemma3", prune({1: [1], 3: [0, 2]}), False),
    ]


def forced_file(model, path: Path, tok: Path) -> None:
    """The model's own architecture with head_count / head_count_kv as per-layer arrays."""
    from headcount.models.formats.gguf_own import _layers, own_file
    from headcount.models.formats.gguf_write import tokenizer_fields, write_gguf

    arch = model.config.family
    meta, tensors = own_file(model, arch, "f32", pad=False)
    layers = _layers(model)
    arrays = {f"{arch}.attention.head_count": [q for q, _ in layers],
              f"{arch}.attention.head_count_kv": [k for _, k in layers]}
    meta = [(k, arrays.get(k, v), *rest) for k, v, *rest in meta]
    write_gguf(path, arch, meta, tokenizer_fields(model, tok), tensors, model=model, dtype="f32")


def llama_cpp(path: Path, ids: list[int]) -> dict:
    request = {"windows": [ids], "prompt": ids[:N_PROMPT], "greedy": N_GREEDY, "threads": 2, "kv": "f32"}
    proc = subprocess.run(["nice", "-n", "10", "node", str(SCORE), str(path)], input=json.dumps(request),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        why = next((line for line in lines if "error loading model" in line), lines[-1] if lines else "?")
        return {"error": why.strip()}
    return json.loads(proc.stdout)


def run_case(name, family, surgery, force, work: Path) -> dict:
    import torch

    from headcount.models import generate, load
    from headcount.models.formats.gguf_deci import choose_architecture, export_gguf

    tok = work / f"vocab-{family}.gguf"
    vocab = tokenizer_gguf(tok, family) if not tok.exists() else tiny_vocab[family]
    tiny_vocab[family] = vocab
    model = tiny(family, vocab)
    if surgery is not None:
        surgery(model)
    path = work / (name.replace(" ", "_").replace("/", "-") + ".gguf")
    row = {"case": name, "query_heads": [l.attn.n_heads for l in model.layers],
           "kv_heads": [l.attn.n_kv_heads for l in model.layers]}
    if force:
        forced_file(model, path, tok)
        row["architecture"] = f"{family} (per-layer arrays, forced)"
        try:
            row["export_gguf"] = "writes " + choose_architecture(model)[0]
        except ValueError as e:
            row["export_gguf"] = "refuses it: " + str(e)[:90] + "..."
    else:
        arch, why = choose_architecture(model)
        export_gguf(model, path, tokenizer_from=tok)
        row["architecture"], row["why"] = arch, why
    ids = torch.randint(4, vocab - 1, (N_IDS,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        want = [logp[j, ids[j + 1]].item() for j in range(N_IDS - 1)]
        greedy = generate(model, ids[:N_PROMPT], N_GREEDY, stop_at_eos=False).new_ids
        if not force:  # headcount reads its own file back
            back = load(path, cache_dir=work / "cache")
            row["headcount_reload_max_abs_logit_diff"] = (back(torch.tensor([ids])).logits
                                                          - model(torch.tensor([ids])).logits).abs().max().item()
    got = llama_cpp(path, ids)
    if "error" in got:
        row["llama_cpp"] = "does not load: " + got["error"]
        return row
    lc = got["logprobs"][0]
    row["llama_cpp"] = "runs"
    row["max_abs_logprob_diff"] = max(abs(a - b) for a, b in zip(want, lc))
    row["greedy_equal"] = got["greedy"] == list(greedy)
    return row


tiny_vocab: dict[str, int] = {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args(argv)
    reason = check_node()
    if reason:
        print(f"llamacpp_archs: skipped, llama.cpp is unavailable: {reason}", file=sys.stderr)
        return 0
    import torch

    torch.set_num_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # the GGUFs and headcount's caches of them
        for name, family, surgery, force in cases():
            row = run_case(name, family, surgery, force, Path(tmp))
            rows.append(row)
            diff = (f"max |d log p| {row['max_abs_logprob_diff']:.1e}, greedy {N_GREEDY} equal: "
                    f"{'yes' if row['greedy_equal'] else 'no'}" if "max_abs_logprob_diff" in row else "")
            back = row.get("headcount_reload_max_abs_logit_diff")
            print(f"{name:40s} q {row['query_heads']} kv {row['kv_heads']} -> {row['architecture']}: "
                  f"llama.cpp {row['llama_cpp']}" + (f"; {diff}" if diff else "")
                  + (f"; headcount reload max |d logit| {back:.1e}" if back is not None else "")
                  + (f"; export_gguf {row['export_gguf']}" if "export_gguf" in row else ""), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
