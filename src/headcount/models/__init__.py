"""Real pretrained models on headcount.MultiHeadAttention.

    load("minilm") / load("smollm2") / load(path)      the zoo (zoo.py)
    Decoder, DecoderConfig                             Llama / Qwen2 / Qwen3 / Mistral / Gemma 3 / GPT-2 (decoder.py)
    BidirectionalEncoder                               a decoder stack without the causal mask (encoder.py)
    chunked_nll                                        the loss from hidden states, never a [T, vocab] tensor
    Encoder, EncoderConfig                             BERT / MiniLM (encoder.py)
    from_transformers, load_checkpoint, save, export_*  every format in and out (formats/)
    attention_copy                                     a copy for an attention edit: only attn is copied
    generate, perplexity                               (generation.py, evaluation.py: modules named
                                                       so they never shadow the functions)

Every model keeps its attention modules public: `model.layers[i].attn` is a MultiHeadAttention.
Submodules are imported lazily so `import headcount.models` stays cheap.
"""

from __future__ import annotations

from headcount import lazy

_EXPORTS = {
    "load": "zoo", "known_models": "zoo", "ModelNotFoundError": "zoo",
    "Decoder": "decoder", "DecoderConfig": "decoder", "DecoderOutput": "decoder",
    "BidirectionalEncoder": "encoder", "chunked_nll": "decoder",
    "Encoder": "encoder", "EncoderConfig": "encoder", "EncoderOutput": "encoder",
    "from_transformers": "headcount.models.formats.hf", "from_state_dict": "headcount.models.formats.hf", "load_checkpoint": "headcount.models.formats.hf",
    "to_transformers": "headcount.models.formats.hf", "export_transformers": "headcount.models.formats.hf",
    "CheckpointError": "headcount.models.formats.errors", "GGUFError": "headcount.models.formats.errors",
    "save": "headcount.models.formats.native", "export_gguf": "headcount.models.formats.gguf_deci",
    "Tokenizer": "tokenizer",
    "RotaryEmbedding": "rotary",
    "generate": "generation", "stream_tokens": "generation", "GenerationResult": "generation",
    "generate_batch": "batched", "is_batch": "batched",
    "perplexity": "evaluation", "evaluate_perplexity": "evaluation", "PerplexityResult": "evaluation",
    "demo_tour": "tour", "packed": "packing", "attention_copy": "copying",
}

__getattr__, __dir__, __all__ = lazy.exports(__name__, _EXPORTS)
