"""The checkpoint package's error type, in a module of its own so that every file format
(``atomic`` for torch files, ``engines.safetensors_format``) raises it without importing the
others."""


class CheckpointFormatError(ValueError):
    """A state cannot be stored in, or read from, a checkpoint file."""
