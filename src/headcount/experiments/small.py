"""Small models and data for the experiments: a byte-level decoder on headcount's own model code.

    byte_decoder(d_model, n_heads, n_layers, seq_len)   headcount.models.Decoder, vocab 256 (bytes)
    ByteCorpus.load()                                   the default corpus as bytes: calibration / held-out
    corpus.batch(gen, batch_size, seq_len)              random training windows from calibration
    held_out_nll(model, corpus, seq_len)                mean NLL per byte on held-out windows

Why bytes: a 256-entry vocabulary keeps the embedding and logits small (SmolLM2's 49,152 tokens
would spend most of a 2-core budget on the lm_head), every byte of text is scored, and no
tokenizer choice favours one head count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from headcount.arguments import positive_int
from headcount.models.decoder import Decoder, DecoderConfig

Tensor = torch.Tensor
VOCAB = 256


def check_heads(heads, d_model: int, *, name: str = "heads") -> tuple[int, ...]:
    """Head counts as a tuple of positive ints that each divide d_model (head_dim = d_model / n_heads)."""
    if isinstance(heads, int):
        heads = (heads,)
    try:
        heads = tuple(heads)
    except TypeError:
        raise TypeError(f"{name}: expected a list of head counts, got {heads!r}") from None
    if not heads:
        raise ValueError(f"{name}: expected at least one head count, got none")
    for h in heads:
        positive_int(name, h, expected="positive whole numbers")
        if d_model % h:
            divisors = ", ".join(str(i) for i in range(1, d_model + 1) if d_model % i == 0)
            raise ValueError(f"{name}: {h} heads do not divide d_model={d_model} (head_dim = d_model / n_heads); "
                             f"divisors that work: {divisors}")
    return heads


def byte_decoder(d_model: int, n_heads: int, n_layers: int, seq_len: int, *, d_ff: int | None = None) -> Decoder:
    """A GPT-2-style decoder (LayerNorm, GELU MLP, learned positions, tied embeddings) over bytes.

    Learned positions rather than rotary: rotary's frequencies depend on head_dim, which would make the
    position code itself change with the head count; with learned positions only the heads change.
    """
    check_heads((n_heads,), d_model, name="n_heads")
    cfg = DecoderConfig(vocab_size=VOCAB, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                        d_ff=4 * d_model if d_ff is None else d_ff, max_position=seq_len, norm="layer",
                        mlp="gelu", position="learned", tie_embeddings=True, family="gpt2")
    model = Decoder(cfg)
    init_weights(model)
    return model


def init_weights(model: torch.nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation: N(0, 0.02) for every Linear and Embedding weight, zero biases (torch's
    default N(0, 1) embeddings, tied to the lm_head, would start at a perplexity in the millions)."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)


@dataclass(frozen=True)
class ByteCorpus:
    """The default corpus (headcount.data) as UTF-8 bytes: train on calibration, score on held-out."""

    calibration: Tensor  # uint8 -> long [N_cal]
    held_out: Tensor  # [N_held]

    @classmethod
    def load(cls) -> "ByteCorpus":
        from headcount.data import default_corpus
        corpus = default_corpus()

        def as_ids(text: str) -> Tensor:
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

        return cls(as_ids(corpus.calibration_text), as_ids(corpus.held_out_text))

    def batch(self, gen: torch.Generator, batch_size: int, seq_len: int) -> Tensor:
        """[batch_size, seq_len + 1] random windows of the calibration bytes (inputs and next bytes)."""
        starts = torch.randint(0, len(self.calibration) - seq_len - 1, (batch_size,), generator=gen)
        return torch.stack([self.calibration[s:s + seq_len + 1] for s in starts.tolist()])

    def held_out_windows(self, seq_len: int, max_windows: int | None = None) -> Tensor:
        """Non-overlapping [N, seq_len + 1] windows of the held-out bytes; each scores seq_len bytes."""
        n = (len(self.held_out) - 1) // seq_len
        if max_windows is not None:
            n = min(n, max_windows)
        idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
        return self.held_out[idx]

    def unigram_nll(self) -> float:
        """Held-out NLL per byte of the calibration byte frequencies (add-one smoothed): a floor to beat."""
        counts = torch.bincount(self.calibration, minlength=VOCAB).double() + 1.0
        logp = (counts / counts.sum()).log()
        return float(-logp[self.held_out].mean())


def lm_loss(model: Decoder, window: Tensor) -> Tensor:
    """Mean next-byte cross-entropy over a [B, T + 1] batch of windows."""
    logits = model(window[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


@torch.no_grad()
def held_out_nll(model: Decoder, windows: Tensor, batch_size: int = 64) -> float:
    """Mean NLL per byte over the windows (every byte after the first of each window is scored)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        w = windows[i:i + batch_size]
        logits = model(w[:, :-1]).logits
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                       reduction="sum"))
        count += w[:, 1:].numel()
    return total / count


def ppl(nll: float) -> float:
    return math.exp(nll)


def attention_accounts(d_model: int, n_heads: int, seq: int, *, head_dim: int | None = None) -> dict:
    """headcount.cost's three accounts for one attention module (no biases), one sequence of `seq` tokens."""
    from headcount.cost import ModelShape, attention_flops, attention_params, score_memory
    shape = ModelShape(d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_layers=1)
    return {"attention_params": attention_params(shape)["total"],
            "attention_flops": attention_flops(shape, 1, seq)["total"],
            "score_elements": score_memory(shape, 1, seq, 4)["elements_per_layer"]}
