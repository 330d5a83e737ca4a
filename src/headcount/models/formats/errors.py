"""The errors every format reader raises: one line naming the file (and the tensor at fault)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message names the file and the tensor."""


class GGUFError(CheckpointError):
    """A GGUF file that cannot be read: the message names the file (and the tensor)."""
