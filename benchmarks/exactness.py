"""minilm and smollm2 against transformers on the same weights (same as `headcount bench exactness`).

    python benchmarks/exactness.py
"""

from headcount.models.exactness import render, run

if __name__ == "__main__":
    render(run())
