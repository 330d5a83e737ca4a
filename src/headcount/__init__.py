"""headcount: multi-head attention you can build, measure and dissect."""

from headcount.attention import AttentionOutput, MultiHeadAttention
from headcount.cache import KVCache

__all__ = ["AttentionOutput", "KVCache", "MultiHeadAttention"]
__version__ = "0.1.0"
