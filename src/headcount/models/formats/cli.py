"""`headcount export`: write a (pruned, merged or untouched) model in another format — a transformers
checkpoint directory, or a llama.cpp GGUF file. Registered by models/cli.py; no torch at module level."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from headcount.models.options import DTYPE_HELP, MODEL_HELP

from headcount.paths import check_out_dir

EXPORT_TARGETS = ("transformers", "gguf", "gguf-f16", "vllm")


def register(app) -> None:
    """Add `headcount export`."""
    from headcount.arguments import one_of
    from headcount.cli_errors import one_line_errors as _one_line_errors

    @app.command("export")
    def export_cmd(
        model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
        dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
        to: str = typer.Option("transformers", "--to", help="target format: transformers (a checkpoint directory), "
                               "gguf or gguf-f16 (a llama.cpp file: qwen2 / gemma3 as themselves where llama.cpp's "
                               "graph holds the heads, else deci, per-layer head counts; it says which), or vllm (a "
                               "directory vLLM serves: the family's own checkpoint, or Nemotron-NAS / DeciLM with "
                               "per-layer K/V head counts and its configuration code)"),
        out: Optional[Path] = typer.Option(None, "--out", help="directory (transformers) or FILE.gguf to write"),
        force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
        groups: Optional[str] = typer.Option(None, "--groups", help="gguf: how a layer with unequal GQA groups (a "
                                             "query-mode prune) is written, both exact: copy (default: K/V heads "
                                             "copied, the KV cache grows), pad (zero query heads added, the KV cache "
                                             "stays the model's) or auto (per layer, the smaller KV cache)"),
    ) -> None:
        """Write a checkpoint that transformers loads with no headcount code (LlamaForCausalLM / BertModel), or a
        llama.cpp GGUF file: the model's own architecture (qwen2, gemma3) where llama.cpp's graph can hold its head
        counts, else deci (per-layer head counts); the printout says which and why."""
        with _one_line_errors("export"):
            one_of("--to", to, EXPORT_TARGETS)
            if groups is not None:
                from headcount.models.formats.gguf_write import GROUPS

                one_of("--groups", groups, GROUPS)
                if not to.startswith("gguf"):
                    raise ValueError(f"--groups: applies to --to gguf / gguf-f16 only, got --to {to}")
            if to in ("transformers", "vllm"):
                out = check_out_dir(out, force)
            else:
                from headcount.models.formats.gguf_deci import check_gguf_path
                out = check_gguf_path(out, force, "--out")
            from headcount.models.options import load_model

            lm = load_model(model, dtype)
            if to == "vllm":
                from headcount.models.formats.vllm_deci import export_vllm

                summary = export_vllm(lm, out, force=force)
            elif to == "transformers":
                from headcount.models.formats.hf import export_transformers

                export_transformers(lm, out, force=force)
                summary = _transformers_summary(lm, out)
            else:
                from headcount.models.formats.gguf_deci import export_gguf, plan_gguf_export

                summary = plan_gguf_export(lm, "f16" if to == "gguf-f16" else "f32", groups=groups or "copy")
                export_gguf(lm, out, dtype=summary["dtype"], force=force, groups=summary["groups"])
        _print_summary(to, out, summary)


def _transformers_summary(model, out: Path) -> dict:
    """What transformers will see: its config's attention_bias switch and the parameters it will count."""
    import json
    import math

    from safetensors import safe_open

    cfg = json.loads((out / "config.json").read_text())
    params = 0
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        for name in f.keys():
            params += math.prod(f.get_slice(name).get_shape())
    tied = bool(cfg.get("tie_word_embeddings"))
    model_params = sum(p.numel() for p in model.parameters())
    note = None
    if cfg.get("attention_bias") and all(l.attn.qkv_proj.bias is None for l in model.layers):
        note = ("attention_bias is on because a refit gave o_proj a bias and Llama has ONE switch for q, k, v and o: "
                "q/k/v biases are written as zeros (exact, but transformers counts them)")
    return {"format": "transformers", "model_type": cfg.get("model_type"), "params_model": model_params,
            "params_transformers": params, "tied_embeddings": tied, "note": note,
            "file_bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}


def _print_summary(to: str, out: Path, summary: dict) -> None:
    if to == "vllm":
        kv = summary["kv_heads"]
        what = (f"{summary['family']} checkpoint" if summary["form"] == "family"
                else "Nemotron-NAS DeciLMForCausalLM checkpoint")
        typer.echo(f"wrote {out} (vLLM: {what}; {summary['query_heads']} query heads, K/V heads per layer "
                   f"{min(kv)}..{max(kv)}, {summary['kv_bytes_per_token_fp32']:,} KV bytes per token in fp32)")
        typer.echo(f"  why: {summary['reason']}")
        if summary["form"] == "deci":
            typer.echo("  serve it with trust_remote_code=True: vLLM runs the configuration code written beside the "
                       "weights (configuration_decilm.py): `vllm serve DIR --trust-remote-code` / "
                       "LLM(DIR, trust_remote_code=True)")
        return
    if to == "transformers":
        typer.echo(f"wrote {out} (transformers from_pretrained): {summary['params_transformers']:,} parameters as "
                   f"transformers counts them (headcount: {summary['params_model']:,}), "
                   f"{summary['file_bytes'] / 2**20:,.1f} MiB")
        if summary["note"]:
            typer.echo(f"note: {summary['note']}")
        return
    size = out.stat().st_size
    typer.echo(f"wrote {out} (llama.cpp {summary['architecture']} GGUF, {summary['dtype']}, {size / 2**20:,.1f} MiB; "
               "headcount.models.load reads it back)")
    typer.echo(f"  why {summary['architecture']}: {summary['reason']}")
    before, after = summary["kv_bytes_per_token_model"], summary["kv_bytes_per_token_llama_cpp"]
    change = f"{(after / before - 1) * 100:+.1f}%" if before else "n/a"
    window = summary.get("sliding_window")
    where = f" on the {len(summary['kv_heads_written']) - summary['sliding_layers']} full-attention layers" \
        if window else ""
    typer.echo(f"  llama.cpp will hold: KV cache {after:,} bytes/token in f16{where} (this model's own: {before:,}, "
               f"{change}), "
               f"{sum(summary['kv_heads_written'])} KV heads (model: {sum(summary['kv_heads_model'])}), "
               f"{summary['params_written']:,} parameters (model: {summary['params_model']:,})")
    if window:
        typer.echo(f"  plus {summary['kv_bytes_window_llama_cpp'] / 2**20:,.2f} MiB in f16 for the "
                   f"{summary['sliding_layers']} sliding-window layers once {window:,} tokens fill their window "
                   f"(this model's own: {summary['kv_bytes_window_model'] / 2**20:,.2f} MiB; llama.cpp allocates "
                   "the window plus one batch of cells)")
    if summary["architecture"] == "gemma3" and summary.get("zero_query_heads"):
        typer.echo(f"note: {summary['zero_query_heads']} query heads are written as exact zeros so that every layer has "
                   f"{max(summary['query_heads_written'])}: llama.cpp runs them, so the GGUF saves no compute for the "
                   "heads pruned (its logits are this model's); `headcount prune --uniform` gives one that does")
    elif summary["architecture"] != "gemma3" and "pad" in summary["layouts"]:
        cache = "equal to" if after == before else ("smaller than" if after < before else "larger than")
        padded = sum(kind == "pad" for kind in summary["layouts"])
        typer.echo(f"groups {summary['groups']}: {summary['zero_query_heads']} zero query heads written to even out "
                   f"the GQA groups of {padded} layer(s) (exact: their o_proj columns are zero), KV cache {cache} "
                   "the model's")
    if summary["grows"]:
        typer.echo(f"warning: llama.cpp needs contiguous equal GQA groups, so {summary['kv_heads_copied']} KV heads are "
                   "written as copies: the exported KV cache is LARGER than the model's. `--groups pad` (or auto) keeps "
                   "the model's KV cache, padding the groups with zero query heads instead; or prune with --mode group "
                   "or --uniform (equal groups).", err=True)
