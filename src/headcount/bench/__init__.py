"""Benchmarks measured side by side in one run; `headcount bench ...` and benchmarks/*.py call these."""
