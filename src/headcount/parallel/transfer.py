"""Hand a loaded headcount model to processes started by `runtime.spawn` without reading it again.

`share(model)` returns a picklable payload (the model's kind, its config and its state dict); the
tensors travel through torch.multiprocessing's shared memory, so every rank maps the parent's weights
instead of copying them, and `rebuild(payload)` assembles the same model on the other side. Ranks
then shard it (tensor_parallel copies only their own slices). For tests and benchmarks; under torchrun
every rank loads the checkpoint itself.
"""

from __future__ import annotations

from dataclasses import asdict

import torch


def share(model: torch.nn.Module) -> tuple[str, dict, dict]:
    from headcount.models.decoder import Decoder
    from headcount.models.encoder import Encoder

    if isinstance(model, Decoder):
        kind = "decoder"
    elif isinstance(model, Encoder):
        kind = "encoder"
    else:
        raise TypeError(f"model: expected a headcount Decoder or Encoder, got {type(model).__name__}")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return kind, asdict(model.config), state


def rebuild(payload: tuple[str, dict, dict]) -> torch.nn.Module:
    from headcount.models.formats.tensors import no_init
    from headcount.models.decoder import Decoder, DecoderConfig
    from headcount.models.encoder import Encoder, EncoderConfig

    kind, config, state = payload
    with no_init():
        model = Decoder(DecoderConfig(**config)) if kind == "decoder" else Encoder(EncoderConfig(**config))
    model.load_state_dict(state, assign=True)
    if kind == "decoder" and model.config.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.eval()
