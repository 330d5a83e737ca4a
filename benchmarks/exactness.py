"""headcount against transformers on the same weights (same as `headcount bench exactness`): the
embedded minilm and smollm2, qwen2.5-coder-0.5b and gemma3-270m (models people ship), and a random small model of
every family headcount reads (llama, qwen2, qwen3, mistral, gemma3_text causal and bidirectional,
gemma3's language model; no download).

    python benchmarks/exactness.py                  # everything (minutes: the two GGUF models dominate)
    python benchmarks/exactness.py --models qwen2.5-coder-0.5b,gemma3-270m   # just those rows
    python benchmarks/exactness.py --families-only  # the random families (no model packages needed)
    python benchmarks/exactness.py --gguf-window 512 --gguf-windows 4 --json
"""

from headcount.models.exactness import main

if __name__ == "__main__":
    raise SystemExit(main())
