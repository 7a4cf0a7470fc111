"""``deepspeed.checkpoint``: the engine's checkpoints, written crash-safely and read safely.

    save_checkpoint(engine, save_dir, tag=None, client_state={}, save_latest=True,
                    exclude_frozen_parameters=False)                       -> True
    load_checkpoint(engine, load_dir, tag=None, load_module_strict=True,
                    load_optimizer_states=True, load_lr_scheduler_states=True,
                    load_module_only=False, custom_load_fn=None)           -> (path, client_state)
    save_16bit_model(engine, save_dir, save_filename="pytorch_model.bin",
                     exclude_frozen_parameters=False)                      -> bool

``DeepSpeedEngine.save_checkpoint`` / ``load_checkpoint`` / ``save_16bit_model`` delegate here.
The on-disk layout is described in ``deepspeed.checkpoint.layout``; the guarantees are:

- every file is written under a temporary name and atomically renamed, and ``latest`` moves to
  a new tag only after every rank finished writing, so an interrupted save never damages the
  checkpoint ``latest`` names;
- every file loads with ``torch.load(weights_only=True)`` (checked before writing), so loading
  a checkpoint never runs code;
- plugins add their own state through the checkpoint hooks in ``deepspeed.hooks``, using
  ``atomic_torch_save`` for their own files;
- ``DeepSpeedCheckpoint`` (upstream's folder reader) is the ZeRO plugin's, exported here through
  the entry-point group ``deepspeed.exports.checkpoint``; file and key names are in
  ``deepspeed.checkpoint.constants``;
- how files are written is the checkpoint engine's choice (``checkpoint.checkpoint_engine``:
  torch, safetensors or async, see ``deepspeed.checkpoint.engines``); inside a save,
  ``atomic_torch_save`` writes through it, and ``load_file`` reads what any engine wrote.
"""
from deepspeed.checkpoint.atomic import (CheckpointFormatError, atomic_torch_save,
                                         atomic_write_text, ensure_weights_only_loadable,
                                         load_file)
from deepspeed.checkpoint.engines import (AsyncCheckpointEngine, CheckpointEngine,
                                          SafetensorsCheckpointEngine, TorchCheckpointEngine,
                                          build_checkpoint_engine, checkpoint_engine_for)
from deepspeed.checkpoint.collective import CheckpointTagMismatchError, CheckpointWriteError
from deepspeed.checkpoint.layout import (LATEST_FILENAME, default_tag, list_tags,
                                         model_states_filename, read_latest,
                                         rng_state_filename)
from deepspeed.checkpoint.load import load_checkpoint
from deepspeed.checkpoint.save import save_16bit_model, save_checkpoint
from deepspeed.utils.lazy_exports import plugin_exports

__all__ = [
    "save_checkpoint", "load_checkpoint", "save_16bit_model",
    "atomic_torch_save", "atomic_write_text", "ensure_weights_only_loadable", "load_file",
    "CheckpointFormatError", "CheckpointTagMismatchError", "CheckpointWriteError",
    "LATEST_FILENAME", "default_tag", "list_tags", "model_states_filename", "read_latest",
    "rng_state_filename", "CheckpointEngine", "TorchCheckpointEngine",
    "SafetensorsCheckpointEngine", "AsyncCheckpointEngine", "build_checkpoint_engine",
    "checkpoint_engine_for",
]

from deepspeed.utils.lazy_exports import import_submodule  # noqa: E402

_plugin_names, __dir__ = plugin_exports(__name__)


def __getattr__(name):
    """A submodule first (`deepspeed.checkpoint.x` after a plain `import deepspeed`), else a
    name an installed plugin exports here (`DeepSpeedCheckpoint` is ZeRO's)."""
    submodule = import_submodule(__name__, name)
    return submodule if submodule is not None else _plugin_names(name)
