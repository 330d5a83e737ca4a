"""Real pretrained models on headcount.MultiHeadAttention (issue 4)."""
