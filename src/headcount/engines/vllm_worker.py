"""vLLM's side of `headcount bench serve` and of the vLLM tests: run by `.venv-vllm/bin/python` (vLLM pins its
own torch and transformers, so it never shares headcount's environment) and imports nothing from headcount.

    .venv-vllm/bin/python src/headcount/engines/vllm_worker.py REQUEST.json

REQUEST: {"model": DIR, "dtype": "float32", "kv_cache_bytes": 1073741824, "max_model_len": N, "max_num_seqs": B,
          "threads": 2, "trust_remote_code": true,
          "tokenizer": false,
          "jobs": [{"kind": "greedy", "prompts": [[ids]], "max_tokens": 32, "logprobs": 1},
                   {"kind": "serve", "prompt": [ids], "batch": B, "new_tokens": 33},
                   {"kind": "generate", "prompts": [[ids]], "max_tokens": 2048, "stop": ["\n```"]}]}

"tokenizer": true loads the directory's tokenizer (a "generate" job's stop strings are matched on the text).

Prints one JSON line on stdout (vLLM's logs go to stderr):
  kv_cache_tokens   vLLM's own "KV cache size: N tokens" (cache_config.kv_cache_size_tokens: group-aware)
  max_concurrency   requests of max_model_len tokens at once (its "Maximum concurrency" log line)
  num_blocks, block_size, kv_bytes_per_block, kv_bytes_per_token, kv_cache_bytes
                    from the engine core's KV cache config (it runs in this process): the bytes of one block of
                    every layer (per-layer K/V heads show here), and of all blocks
  jobs[i]           greedy: tokens and logprobs of each prompt; serve: prefill_s (until every row holds its first
                    new token), decode_s (the rest), timed in one pass of the engine's step loop; peak_rss_bytes;
                    generate: each prompt's text (cut before its stop string), new tokens and finish reason, and
                    generate_s, the wall time of the one llm.generate call over all prompts (max_num_seqs at once)
  threads           torch's intra-op threads in the engine (vLLM's auto binding keeps one core for its scheduler:
                    the request's threads are bound explicitly, VLLM_CPU_OMP_THREADS_BIND)
  peak_rss_bytes    VmHWM of this process and every process it started (vLLM's engine core among them)
Errors: one line on stderr naming what failed, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _fail(message: str) -> None:
    sys.stderr.write(f"vllm_worker: {message}\n")
    sys.exit(2)


def _hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
    return out


def peak_rss() -> int:
    """Peak resident bytes of this process plus its live descendants (each one's VmHWM)."""
    me = os.getpid()
    return sum(_hwm(p) for p in [me, *_descendants(me)])


def _capacity(llm) -> dict:
    """The KV cache vLLM allocated, as the engine reports it: capacity in tokens (group-aware, its log line's
    "KV cache size"), requests of max_model_len at once, blocks, and the bytes of one block of every layer."""
    engine = llm.llm_engine
    cache = engine.vllm_config.cache_config
    out = {"kv_cache_tokens": getattr(cache, "kv_cache_size_tokens", None),
           "max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
           "num_blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
           "kv_cache_bytes": None, "kv_bytes_per_token": None}
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # in-process engine core only
    try:
        config = core.scheduler.kv_cache_config
    except AttributeError:
        return out
    # each tensor is one pool the listed layers share, each layer taking block_stride bytes of every block
    per_block = sum(t.block_stride * len(t.layers) for t in config.kv_cache_tensors)
    size = config.kv_cache_groups[0].kv_cache_spec.block_size
    out.update(num_blocks=config.num_blocks, block_size=size, kv_cache_bytes=per_block * config.num_blocks,
               kv_bytes_per_token=per_block / size, kv_bytes_per_block=per_block)
    if os.environ.get("HEADCOUNT_VLLM_DEBUG"):
        sys.stderr.write(f"kv_cache_config: {config}\n")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        _fail("usage: vllm_worker.py REQUEST.json")
    try:
        request = json.loads(open(argv[0]).read())
    except (OSError, ValueError) as e:
        _fail(f"cannot read the request {argv[0]}: {e}")
    # the KV budget in bytes (vLLM's kv_cache_memory_bytes); VLLM_CPU_KVCACHE_SPACE takes whole GiB only
    kv_bytes = int(request.get("kv_cache_bytes", 2**30))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, kv_bytes // 2**30)))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its KV tensors seen
    threads = int(request.get("threads", 2))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # vLLM's "auto" binding reserves a core for its scheduler: on 2 cores the model would run on one thread
    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cores))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception as e:  # noqa: BLE001 - any import failure is "vLLM is not usable here"
        _fail(f"vLLM does not import: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    try:
        llm = LLM(model=request["model"], dtype=request.get("dtype", "float32"),
                  max_model_len=int(request["max_model_len"]), max_num_seqs=int(request.get("max_num_seqs", 1)),
                  trust_remote_code=bool(request.get("trust_remote_code", True)),
                  skip_tokenizer_init=not request.get("tokenizer", False), enable_prefix_caching=False, enforce_eager=True,
                  load_format=request.get("load_format", "auto"), kv_cache_memory_bytes=kv_bytes, seed=0)
    except Exception as e:  # noqa: BLE001
        text = " ".join(str(e).split())
        _fail(f"vLLM could not load {request['model']}: {type(e).__name__}: {text[:400]}")
    import torch

    out = {"versions": {"vllm": vllm.__version__}, "max_model_len": int(request["max_model_len"]),
           "threads": torch.get_num_threads(), **_capacity(llm), "jobs": []}
    try:
        _run_jobs(llm, request.get("jobs", []), out, SamplingParams, TokensPrompt)
    except Exception as e:  # noqa: BLE001
        text = " ".join(str(e).split())
        _fail(f"vLLM failed on {request['model']}: {type(e).__name__}: {text[:400]}")
    out["peak_rss_bytes"] = peak_rss()
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM's shutdown can hang on 2 cores; the answer is out


def _serve(llm, job, SamplingParams, TokensPrompt) -> dict:
    """`batch` copies of the prompt through the engine's own step loop: prefill_s until every request holds its
    first new token, decode_s from there to the last (one run: the two times never come from different calls)."""
    engine, batch, n = llm.llm_engine, int(job["batch"]), int(job["new_tokens"])
    params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
    ids = [f"serve-{len(job['prompt'])}-{batch}-{i}-{time.monotonic_ns()}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, TokensPrompt(prompt_token_ids=job["prompt"]), params)
    counts = dict.fromkeys(ids, 0)
    t0 = time.perf_counter()
    first = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id in counts:
                counts[o.request_id] = max(counts[o.request_id], len(o.outputs[0].token_ids))
        if first is None and all(counts.values()):
            first = time.perf_counter()
    end = time.perf_counter()
    if first is None or min(counts.values()) != n:
        raise RuntimeError(f"the engine returned {sorted(set(counts.values()))} tokens per request, not {n}")
    return {"prefill_s": first - t0, "decode_s": end - first, "generate_s": end - t0, "batch": batch,
            "new_tokens": n, "context": len(job["prompt"]), "peak_rss_bytes": peak_rss()}


def _generate(llm, job, SamplingParams, TokensPrompt) -> dict:
    """Greedy answers to every prompt, stopping at eos or a stop string, the engine scheduling max_num_seqs at
    once; generate_s is the one call's wall time (prefill and decode together, as an eval spends them)."""
    params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), stop=list(job.get("stop", [])))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up, not timed
    t0 = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    rows = [{"text": r.outputs[0].text, "new_tokens": len(r.outputs[0].token_ids),
             "finish_reason": r.outputs[0].finish_reason} for r in results]
    return {"generate_s": seconds, "rows": rows, "peak_rss_bytes": peak_rss()}


def _run_jobs(llm, jobs, out, SamplingParams, TokensPrompt) -> None:
    for job in jobs:
        if job["kind"] == "greedy":
            params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=True,
                                    logprobs=int(job.get("logprobs", 1)), detokenize=False)
            results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
            rows = []
            for r in results:
                c = r.outputs[0]
                lps = [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)] if c.logprobs else None
                rows.append({"tokens": list(c.token_ids), "logprobs": lps})
            out["jobs"].append({"kind": "greedy", "rows": rows})
        elif job["kind"] == "generate":
            out["jobs"].append({"kind": "generate", **_generate(llm, job, SamplingParams, TokensPrompt)})
        elif job["kind"] == "serve":
            out["jobs"].append({"kind": "serve", **_serve(llm, job, SamplingParams, TokensPrompt)})
        else:
            _fail(f"job kind {job['kind']!r}: expected greedy, serve or generate")


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may run at import
    sys.exit(main(sys.argv[1:]))
