"""The checkpointing switch: decoder layers recomputed in backward (torch.utils.checkpoint, non-reentrant).

    with layer_checkpointing(model.layers[3:]):
        loss = ...; loss.backward()       autograd keeps each layer's input, one layer's activations at a time

It sets each layer's own `gradient_checkpointing` flag (models.decoder.DecoderLayer: with the flag and gradients
on, the layer runs itself through torch.utils.checkpoint) for the block and puts the flags back after. The price is
one more forward of those layers per backward; the numbers are the same.
"""

from __future__ import annotations

import contextlib

FLAG = "gradient_checkpointing"


@contextlib.contextmanager
def layer_checkpointing(layers, on: bool = True):
    """Each of `layers` recomputed in backward while the block runs (on=False: the block changes nothing)."""
    layers = list(layers)
    lacking = [type(layer).__name__ for layer in layers if not hasattr(layer, FLAG)]
    if lacking:
        raise ValueError(f"layers: expected layers with a {FLAG} flag (models.decoder.DecoderLayer), got "
                         f"{lacking[0]}")
    own = [vars(layer).get(FLAG) if FLAG in vars(layer) else None for layer in layers]
    if on:
        for layer in layers:
            setattr(layer, FLAG, True)
    try:
        yield
    finally:
        if on:
            for layer, value in zip(layers, own):
                if value is None:
                    delattr(layer, FLAG)  # back to the class's default
                else:
                    setattr(layer, FLAG, value)
