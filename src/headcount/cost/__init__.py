"""The three accounts (parameters, FLOPs, score memory) and the KV cache. Pure Python: no torch."""
