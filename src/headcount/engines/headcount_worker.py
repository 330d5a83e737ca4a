"""headcount's own engine, as `headcount bench serve` runs it: in a fresh process per row, so that its peak
resident memory is this row's alone.

    python -m headcount.engines.headcount_worker REQUEST.json

REQUEST: {"model": NAME | DIR, "prompt": [ids], "batch": B, "new_tokens": N, "threads": T}
Prints one JSON line: kv_bytes (the KVCache tensors allocated: sum of every layer's .nbytes for B rows of prompt +
N positions), prefill_s (to the first new token of every row), decode_s (the other N - 1 tokens of every row),
tokens (row 0's), peak_rss_bytes (VmHWM). Batch > 1 runs models.generate's batched path (one KV cache, every row
decoded together); batch 1 its single-sequence path. Errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("headcount_worker: usage: python -m headcount.engines.headcount_worker REQUEST.json\n")
        return 2
    try:
        request = json.loads(open(argv[0]).read())
        prompt, batch, n = list(request["prompt"]), int(request["batch"]), int(request["new_tokens"])
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"headcount_worker: cannot read the request {argv[0]}: {e}\n")
        return 2
    import torch

    from headcount.engines.processes import peak_rss_self
    from headcount.models.generation import generate
    from headcount.models.options import load_model
    from headcount.models.packing import packed

    torch.set_num_threads(int(request.get("threads") or torch.get_num_threads()))
    try:
        model = load_model(request["model"], "fp32")
    except Exception as e:  # noqa: BLE001 - one line, whatever the loader says
        sys.stderr.write(f"headcount_worker: cannot load {request['model']}: {' '.join(str(e).split())[:300]}\n")
        return 2
    with packed(model):  # packed once: the prefill time is the model's, not the packing's
        if batch == 1:
            results = [generate(model, prompt, n, stop_at_eos=False)]
        else:
            results = generate(model, [prompt] * batch, n, stop_at_eos=False)
    peak = peak_rss_self()
    # the cache generate allocated for these rows (allocated again here, after the peak is read)
    kv_bytes = sum(c.nbytes for c in model.new_cache(batch, len(prompt) + n))
    out = {"kv_bytes": kv_bytes, "prefill_s": max(r.prefill_s for r in results),
           "decode_s": max(r.decode_s for r in results), "tokens": results[0].new_ids,
           "peak_rss_bytes": peak, "threads": torch.get_num_threads()}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
