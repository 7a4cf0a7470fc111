"""Checkpoint engines: how checkpoint files reach storage (``checkpoint.checkpoint_engine``).

    "torch"        torch.save, atomically (the default)
    "safetensors"  tensors in safetensors files, the rest as JSON beside each one
    "async"        host snapshot at save time, files written in the background,
                   ``latest`` moved by commit(tag) (``{"type": "async", "format": ...}``)

The documented ``datastates_ckpt`` and ``nebula`` sections ask for asynchronous checkpointing
through external packages; without those packages the built-in "async" engine does the job.
``checkpoint_engine_for(engine)`` gives the engine a ``DeepSpeedEngine`` saves through, kept as
``engine.checkpoint_engine``.
"""
import importlib.util

from deepspeed.checkpoint.engines.async_engine import AsyncCheckpointEngine
from deepspeed.checkpoint.engines.base import (CheckpointEngine, SafetensorsCheckpointEngine,
                                               TorchCheckpointEngine)
from deepspeed.utils.logging import logger

FILE_ENGINES = {"torch": TorchCheckpointEngine, "safetensors": SafetensorsCheckpointEngine}


def build_checkpoint_engine(checkpoint_config, datastates=None, nebula=None):
    """The engine for a validated ``checkpoint`` section plus the optional ``datastates_ckpt``
    / ``nebula`` sections (validated models or None). An explicit
    ``checkpoint.checkpoint_engine`` wins over both."""
    choice = checkpoint_config.checkpoint_engine
    explicit = "checkpoint_engine" in checkpoint_config.model_fields_set
    kind, file_format = choice.type, choice.file_format
    external = None
    if datastates is not None:
        external = ("datastates_ckpt", "DataStates-LLM", "datastates")
    elif nebula is not None and nebula.enabled:
        external = ("nebula", "Nebula", "torch_nebula")
    if external is not None:
        key, product, package = external
        if explicit and kind != "async":
            logger.warning(f"'{key}' asks for asynchronous checkpointing but "
                           f"checkpoint.checkpoint_engine is '{kind}'; using '{kind}'")
        elif not explicit:
            kind = "async"
            installed = importlib.util.find_spec(package) is not None
            state = "is installed but not integrated" if installed else "is not installed"
            logger.warning(f"'{key}': {product} {state}; using the built-in asynchronous checkpoint engine "
                           f"(checkpoint.checkpoint_engine: \"async\"), which gives the same "
                           f"guarantees: save returns after a host snapshot, 'latest' moves on "
                           f"commit")
    writer = FILE_ENGINES[file_format]()
    return AsyncCheckpointEngine(writer) if kind == "async" else writer


def _optional_section(config, key):
    try:
        return config.section(key)
    except KeyError:  # neither a core key nor an installed plugin's section: not configured
        return None


def checkpoint_engine_for(engine):
    """``engine.checkpoint_engine``, built from the engine's config on first use."""
    existing = getattr(engine, "checkpoint_engine", None)
    if existing is not None:
        return existing
    config = engine.config
    built = build_checkpoint_engine(config.core.checkpoint,
                                    datastates=_optional_section(config, "datastates_ckpt"),
                                    nebula=_optional_section(config, "nebula"))
    engine.checkpoint_engine = built
    return built


__all__ = ["CheckpointEngine", "TorchCheckpointEngine", "SafetensorsCheckpointEngine",
           "AsyncCheckpointEngine", "build_checkpoint_engine", "checkpoint_engine_for"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
