"""`torchrun --nproc-per-node N -m headcount.parallel.check --model smollm2 [--json]`: the sharded model
against the same model in one process. `--prompt-tokens 600` takes the prompt from the held-out corpus
instead (past gemma3-270m's 512-token sliding window).

Every rank loads the model, computes the one-process reference itself (logits of the prompt, and greedy
tokens with the KV cache), shards the model with tensor_parallel (which first checks that every rank
loaded the same weights), and computes both again. The worst |diff| over the ranks and whether every
rank's tokens equal its reference are reduced over the group; rank 0 prints. For an encoder (minilm)
the hidden states are compared and there are no tokens (tokens_equal is null).

Without torchrun it runs as a world of one (and says so). Exit status: 0 when the logits agree to
1e-5 of their scale and the tokens are equal, 1 when they do not, 2 on bad input (every rank).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import typer

DEFAULT_PROMPT = "Heads are the natural unit to split a model across devices: each rank owns whole query heads"


@dataclass
class CheckResult:
    world_size: int
    max_abs_diff: float
    tokens_equal: bool | None  # None for an encoder
    model: str = ""
    backend: str = ""
    scale: float = 0.0  # max |reference|
    prompt_tokens: int = 0
    new_tokens: int = 0
    ranks: list[dict] = field(default_factory=list)  # per rank: query_heads, kv_heads, kv_cache_bytes

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= 1e-5 * max(1.0, self.scale) and self.tokens_equal is not False

    def to_json(self) -> dict:
        return {"world_size": self.world_size, "max_abs_diff": self.max_abs_diff, "tokens_equal": self.tokens_equal}


def _held_out_prompt(model, n: int) -> list[int]:
    """The first n tokens of the default corpus's held-out part (with the tokenizer's BOS, where it adds one)."""
    from headcount.data import default_corpus

    ids = model.tokenizer.encode("\n\n".join(default_corpus().texts("held_out")))
    if len(ids) < n:
        raise ValueError(f"--prompt-tokens: the held-out corpus has only {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def _compare(out, ref, lm_head=None, chunk: int = 64) -> tuple[float, float]:
    """(max |out - ref|, max |ref|); with lm_head (replicated on every rank, so the same on both sides) the
    logits of the hidden states, `chunk` positions at a time: gemma3-270m's 600 x 262,144 fp32 logits would
    be 630 MB on every rank, several times over with the temporaries."""
    import torch

    if lm_head is None:
        return float((out - ref).abs().max()), float(ref.abs().max())
    diff = scale = 0.0
    with torch.inference_mode():
        for i in range(0, ref.shape[0], chunk):
            want = lm_head(ref[i:i + chunk])
            diff = max(diff, float((lm_head(out[i:i + chunk]) - want).abs().max()))
            scale = max(scale, float(want.abs().max()))
    return diff, scale


def run(name: str = "smollm2", *, prompt: str = DEFAULT_PROMPT, new_tokens: int = 16, group=None,
        prompt_tokens: int | None = None) -> CheckResult:
    """Run the check on every rank of `group` (initialised); every rank returns the same CheckResult.

    prompt_tokens: use the first N tokens of the held-out corpus as the prompt instead of `prompt` (a prompt
    longer than a sliding window, e.g. 600 tokens on gemma3-270m, exercises the window's mask and cache)."""
    import torch
    import torch.distributed as dist

    from headcount.models import generate, load
    from headcount.models.decoder import Decoder
    from headcount import distributed as runtime
    from headcount.parallel.model import tensor_parallel

    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens: expected a positive int, got {new_tokens!r}")
    if prompt_tokens is not None and (isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int)
                                      or prompt_tokens < 1):
        raise ValueError(f"prompt_tokens: expected a positive int or None, got {prompt_tokens!r}")
    group, rank, world = runtime.resolve(group)
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    model = load(name).to(device)
    if model.tokenizer is None:
        raise ValueError(f"model {name!r} has no tokenizer; the check needs one to encode its prompt")
    is_decoder = isinstance(model, Decoder)
    if prompt_tokens is not None and prompt_tokens + new_tokens > model.max_position:
        raise ValueError(f"--prompt-tokens: {prompt_tokens} + {new_tokens} new tokens is past the model's context of "
                         f"{model.max_position}")
    encoded = model.tokenizer.encode(prompt) if prompt_tokens is None else _held_out_prompt(model, prompt_tokens)
    ids = torch.tensor([encoded], device=device)[:, : model.max_position - new_tokens]

    def forward():  # a decoder's final hidden states: the logits are built from them chunk by chunk below
        with torch.inference_mode():
            return model(ids, compute_logits=False).hidden_states[0] if is_decoder else model(ids).last_hidden_state

    ref = forward()
    ref_tokens = generate(model, ids[0], new_tokens, stop_at_eos=False).new_ids if is_decoder else None
    tensor_parallel(model, group)
    out = forward()
    tokens = generate(model, ids[0], new_tokens, stop_at_eos=False).new_ids if is_decoder else None

    diff, scale = _compare(out, ref, model.lm_head if is_decoder else None)
    stats = torch.tensor([diff, scale, 0.0 if tokens == ref_tokens else 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    attn = model.layers[0].attn
    cache_bytes = sum(c.nbytes for c in model.new_cache(1, ids.shape[1] + new_tokens)) if is_decoder else 0
    mine = {"rank": rank, "query_heads": list(attn.kept_heads), "kv_heads": list(attn.shard_plan.kv_heads),
            "kv_cache_bytes": cache_bytes}
    ranks: list = [None] * world
    dist.all_gather_object(ranks, mine, group=group)
    return CheckResult(world, float(stats[0]), bool(stats[2] == 0) if is_decoder else None, name, backend,
                       float(stats[1]), ids.shape[1], new_tokens if is_decoder else 0, ranks)


def render(result: CheckResult) -> str:
    from headcount.cost.format import human_bytes

    lines = [f"{result.model} on {result.world_size} rank{'s' * (result.world_size > 1)} ({result.backend}): "
             f"prompt of {result.prompt_tokens} tokens"
             + (f", {result.new_tokens} greedy tokens with the KV cache" if result.new_tokens else "")]
    for r in result.ranks:
        q, kv = r["query_heads"], r["kv_heads"]
        lines.append(f"  rank {r['rank']}: query heads {q[0]}-{q[-1]} ({len(q)}), KV heads {kv}"
                     + (f", KV cache {human_bytes(r['kv_cache_bytes'])}" if r["kv_cache_bytes"] else ""))
    rel = result.max_abs_diff / result.scale if result.scale else 0.0
    lines.append(f"  max |diff| vs one process: {result.max_abs_diff:.3g} (outputs up to {result.scale:.3g}: "
                 f"{rel:.2g} relative)")
    if result.tokens_equal is not None:
        lines.append(f"  tokens equal: {'yes' if result.tokens_equal else 'NO'}")
    lines.append(f"  {'ok' if result.ok else 'MISMATCH'}")
    return "\n".join(lines)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(
    model: str = typer.Option("smollm2", "--model", "-m", help="zoo name (smollm2, minilm, gemma3-270m, "
                              "qwen2.5-coder-0.5b, ...) or a checkpoint directory"),
    prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", help="the text whose logits are compared"),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="instead of --prompt, the first N "
                                                "tokens of the held-out corpus (e.g. 600 on gemma3-270m: past its "
                                                "512-token sliding window)"),
    new_tokens: int = typer.Option(16, "--new-tokens", "-n", help="greedy tokens generated with the KV cache"),
    timeout: float = typer.Option(120.0, "--timeout", help="seconds any rank waits for the others"),
    json_out: bool = typer.Option(False, "--json", help='print {"world_size", "max_abs_diff", "tokens_equal"}'),
) -> None:
    """The sharded model against one process: max |diff| of the logits, and whether greedy tokens agree."""
    from headcount.cli_errors import rank_errors

    with rank_errors("parallel.check"):
        import torch.distributed as dist

        from headcount import distributed as runtime

        if new_tokens < 1:
            raise ValueError(f"--new-tokens: expected a positive number, got {new_tokens}")
        if prompt_tokens is not None and prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens: expected a positive number, got {prompt_tokens}")
        if not timeout > 0:
            raise ValueError(f"--timeout: expected a positive number of seconds, got {timeout}")
        group = runtime.init_or_single(timeout_s=timeout, log=lambda m: typer.echo(f"headcount: {m}", err=True))
        rank = dist.get_rank(group)
        try:
            result = run(model, prompt=prompt, new_tokens=new_tokens, group=group, prompt_tokens=prompt_tokens)
        finally:
            runtime.shutdown()
    if rank == 0:
        typer.echo(json.dumps(result.to_json()) if json_out else render(result))
    raise typer.Exit(0 if result.ok else 1)


if __name__ == "__main__":
    app(prog_name="python -m headcount.parallel.check")
