"""A thin tokenizer over the `tokenizers` library: encode, batch with padding, decode.

Built from a tokenizer.json (MiniLM, local checkpoints) or from the vocabulary and merges inside a
GGUF file (SmolLM2: `byte_level_bpe`). The tokenizer.json of a qwen2 / gemma3 GGUF's cache directory
is written by transformers' own offline GGUF converter (`save_gguf_tokenizer`), so its ids equal
AutoTokenizer.from_pretrained(dir, gguf_file=...)'s; Gemma's adds <bos> through its post-processor,
Qwen2's adds nothing. The tokenizer.json's own truncation and padding settings are switched off
(sentence-transformers ships MiniLM's with "pad everything to 128"): `batch` pads to the longest
text and nothing is ever silently truncated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from tokenizers import Tokenizer as _Backend

from headcount.arguments import one_of

Tensor = torch.Tensor


class Tokenizer:
    """Encode / decode text for one model.

    add_special_tokens: what `encode` does by default ([CLS] ... [SEP] for BERT; nothing for
    SmolLM2, whose GGUF says add_bos_token = False).
    """

    def __init__(self, backend: _Backend, *, bos_token_id: int | None = None, eos_token_id: int | None = None,
                 pad_token_id: int | None = None, add_special_tokens: bool = True):
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
        self.add_special_tokens = add_special_tokens
        self.chat_template: str | None = None  # Jinja text, set by the loaders (models/chat.py)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token_id}, eos={self.eos_token_id}, "
                f"pad={self.pad_token_id})")

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "Tokenizer":
        path = Path(path)
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None
        return cls(backend, **kwargs)

    def encode(self, text: str, *, add_special_tokens: bool | None = None) -> list[int]:
        special = self.add_special_tokens if add_special_tokens is None else add_special_tokens
        return self.backend.encode(text, add_special_tokens=special).ids

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool | None = None) -> list[list[int]]:
        special = self.add_special_tokens if add_special_tokens is None else add_special_tokens
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=special)]

    def batch(self, texts: Sequence[str], *, add_special_tokens: bool | None = None,
              padding_side: str = "right") -> tuple[Tensor, Tensor]:
        """(input_ids [B, T] long, attention_mask [B, T] bool, True = real token), padded to the longest."""
        if isinstance(texts, str):
            texts = [texts]
        one_of("padding_side", padding_side, ("right", "left"), expected="'right' or 'left'")
        ids = self.encode_batch(texts, add_special_tokens=add_special_tokens)
        length = max((len(i) for i in ids), default=0)
        input_ids = torch.full((len(ids), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), length), dtype=torch.bool)
        for row, seq in enumerate(ids):
            sl = slice(0, len(seq)) if padding_side == "right" else slice(length - len(seq), length)
            input_ids[row, sl] = torch.tensor(seq, dtype=torch.long)
            mask[row, sl] = True
        return input_ids, mask

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @property
    def special_tokens(self) -> dict[str, str | None]:
        """bos_token / eos_token / pad_token as strings: what a chat template reads."""
        def text(i):
            return None if i is None else self.token(i)
        return {"bos_token": text(self.bos_token_id), "eos_token": text(self.eos_token_id),
                "pad_token": text(self.pad_token_id)}

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True, tokenize: bool = True,
                            **variables) -> list[int] | str:
        """The checkpoint's chat template over `messages` ([{"role", "content"}, ...]): token ids, or the text
        with tokenize=False, as transformers' apply_chat_template gives them (the template writes its own
        special tokens, so encoding adds none)."""
        from headcount.models.chat import ChatTemplateError, render

        if self.chat_template is None:
            raise ChatTemplateError("chat: this model's tokenizer has no chat template (none in its GGUF file or "
                                    "checkpoint directory); give a plain prompt instead")
        text = render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      **{**self.special_tokens, **variables})
        return self.encode(text, add_special_tokens=False) if tokenize else text


def byte_level_bpe(tokens: Sequence[str], merges: Sequence[str], *, special_ids: Sequence[int] = (),
                   split_digits: bool = True) -> _Backend:
    """A GPT-2 style byte-level BPE tokenizer from a GGUF vocabulary (tokens in id order) and merges.

    split_digits: every digit is its own pre-token first (SmolLM2's tokenizer.json, and llama.cpp's
    "smollm" pre-tokenizer: "\\p{N}" before the GPT-2 pattern).
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = _Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if split_digits:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    if special_ids:
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special_ids])
    return backend


def save_gguf_tokenizer(gguf_path: str | Path, out_dir: str | Path, model_type: str) -> None:
    """Write tokenizer.json (+ tokenizer_config.json, and the chat template when the file has one) for
    a qwen2 or gemma3 GGUF into `out_dir`, exactly as transformers would save it.

    Built by transformers' own offline converter from the GGUF's tokenizer fields
    (transformers.integrations: byte-level BPE with Qwen2's pre-tokenizer regex for `gpt2` vocabularies,
    Gemma's SentencePiece-style vocabulary with merges recovered from the token order), through the
    tokenizer class AutoTokenizer picks for `model_type`, so the ids equal those of
    AutoTokenizer.from_pretrained(dir, gguf_file=...) — and `<bos>` is added where the GGUF says
    add_bos_token (Gemma), through the tokenizer.json's post-processor.
    """
    gguf_path = Path(gguf_path)
    try:
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
    except ImportError as e:
        raise ImportError(f"{gguf_path.name}: building the {model_type} tokenizer from a GGUF file needs transformers "
                          f"(pip install 'transformers>=5'): {e}") from None
    names = TOKENIZER_MAPPING_NAMES.get(model_type)
    if isinstance(names, (tuple, list)):  # transformers 4: (slow, fast)
        names = next((n for n in reversed(names) if n), None)
    cls = tokenizer_class_from_name(names) if names else None
    if cls is None:
        raise ValueError(f"{gguf_path}: transformers has no tokenizer class for model_type {model_type!r}")
    try:
        tok = cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True)
    except Exception as e:  # transformers raises many kinds; one line naming the file
        raise ValueError(f"{gguf_path}: transformers cannot build the tokenizer from the GGUF's fields "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    tok.save_pretrained(str(out_dir))
