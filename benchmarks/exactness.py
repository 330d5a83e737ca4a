"""headcount against transformers on the same weights (same as `headcount bench exactness`): the
embedded minilm and smollm2, and a random small model of every family headcount reads (llama, qwen2,
qwen3, mistral, gemma3_text causal and bidirectional, gemma3's language model; no download).

    python benchmarks/exactness.py                  # everything
    python benchmarks/exactness.py --families-only  # the random families (no model packages needed)
    python benchmarks/exactness.py --json
"""

import argparse
import json

from headcount.models.exactness import render, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=1024, help="smollm2 perplexity window")
    parser.add_argument("--families-only", action="store_true", help="only the random small families")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    result = run(args.window, real=not args.families_only)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        render(result)
