"""Benchmark: headcount.MultiHeadAttention vs inline SDPA vs torch.nn.MultiheadAttention (CPU fp32).

    python benchmarks/attention.py          # same as `headcount bench attention`
"""

from headcount.bench.attention import main

if __name__ == "__main__":
    main()
