"""``init_inference(checkpoint=...)``: load weights straight into this rank's shards.

``checkpoint`` is one of

- a JSON descriptor (a path, or the same dict): ``{"type": "ds_model", "version": 0.0,
  "checkpoints": [file, ...] | "file or directory", "base_dir": optional}``; relative paths
  are taken from ``base_dir`` (the descriptor's, else ``init_inference(base_dir=...)``, else the
  JSON file's directory);
- a tensor-parallel checkpoint, one file per rank of the run that wrote it, merged into whole
  tensors as they are read (``deepspeed.inference.merge``): ``{"type": "Megatron",
  "checkpoints": [rank 0's file, rank 1's, ...], "mp_size": optional}`` (or any descriptor with
  ``init_inference(training_mp_size=N)``), and the ``{"parallelization": "tp", "tp_size": N,
  "checkpoints": {"tp": [...]}}`` descriptor ``save_mp_checkpoint_path`` writes;
- a Hugging Face index (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``);
- a directory (its ``*.safetensors``, else ``*.bin`` / ``*.pt`` files) or a single file.

Each file is a (possibly partial: sharded) state dict, optionally under a ``"module"`` key as
DeepSpeed's ``mp_rank_00_model_states.pt`` holds it; ``.pt`` / ``.bin`` files are memory-mapped
and safetensors files read one tensor at a time, so a rank reads each tensor, keeps the slice
AutoTP cut for it (``sharding.shard_of``) and drops the rest. Build the model with
``empty_init()`` (parameters on the meta device, buffers real; see ``torch_patches``) and no
rank ever holds the whole model: the loader materialises each parameter at its shard size as
its tensor arrives, and records the peak of real parameter bytes it saw (``peak_param_bytes``).

Missing files are one ``FileNotFoundError`` naming all of them; a parameter left on the meta
device after the last file is an error naming its key.
"""
import glob
import json
import os

import torch
from torch import nn

from deepspeed.tensor_parallel import CHECKPOINT_KEY, SHARD_FN, parameter_bytes, shard_of
from deepspeed.inference.merge import merged_tensors
from deepspeed.inference.torch_patches import empty_init  # noqa: F401  (its documented path)
from deepspeed.utils import logging as ds_logging

logger = ds_logging.logger

SUPPORTED_TYPES = ("ds_model", "Megatron")


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model; the message names the key or file."""


def checkpoint_files(checkpoint, base_dir=""):
    """The list of state-dict files ``checkpoint`` names (see the module docstring)."""
    return checkpoint_source(checkpoint, base_dir)[0]


def _split_count(descriptor, files, training_mp_size, where):
    """How many tensor-parallel ranks wrote ``files`` (1: each file holds whole tensors)."""
    declared = {n for n in (descriptor.get("mp_size"), descriptor.get("tp_size")) if n}
    if descriptor.get("type") == "Megatron" or descriptor.get("parallelization") == "tp":
        declared.add(len(files))
    if training_mp_size > 1:
        declared.add(training_mp_size)
    if len(declared) > 1 or (declared and max(declared) != len(files) and max(declared) > 1):
        raise CheckpointError(
            f"checkpoint {where}: {len(files)} files for a tensor-parallel size of "
            f"{sorted(declared)} (mp_size / tp_size / training_mp_size); a tensor-parallel "
            f"checkpoint lists one file per rank of the run that wrote it")
    return max(declared) if declared else 1


def checkpoint_source(checkpoint, base_dir="", training_mp_size=1):
    """``(files, split, descriptor, where)``: the state-dict files ``checkpoint`` names, how many
    tensor-parallel ranks wrote them (``split`` > 1: merge them, ``deepspeed.inference.merge``),
    the JSON descriptor (``{}`` for none) and where it came from (for errors)."""
    where, descriptor = "checkpoint", {}
    files = _descriptor_files(checkpoint, base_dir)
    if isinstance(files, tuple):
        files, descriptor, where = files
    return files, _split_count(descriptor, files, training_mp_size, where), descriptor, where


def _descriptor_files(checkpoint, base_dir):
    """The files, or ``(files, descriptor, where)`` for a JSON descriptor."""
    where = "checkpoint"
    if isinstance(checkpoint, (str, os.PathLike)):
        path = os.fspath(checkpoint)
        if os.path.isdir(path):
            return _files_in(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint {path!r} does not exist")
        if not path.endswith(".json"):
            return [path]
        with open(path) as handle:
            descriptor = json.load(handle)
        where, base_dir = path, base_dir or os.path.dirname(path)
        if "weight_map" in descriptor:  # a Hugging Face index
            names = list(dict.fromkeys(descriptor["weight_map"].values()))
            return _existing([os.path.join(os.path.dirname(path), n) for n in names], where)
    elif isinstance(checkpoint, dict):
        descriptor = checkpoint
    else:
        raise CheckpointError(f"checkpoint must be a path or a descriptor dict, got "
                              f"{type(checkpoint).__name__}")
    kind = descriptor.get("type", "ds_model")
    if kind not in SUPPORTED_TYPES:
        raise CheckpointError(f"checkpoint type {kind!r} in {where} is not supported; supported "
                              f"types: {', '.join(SUPPORTED_TYPES)} (state dicts by file name)")
    if "checkpoints" not in descriptor:
        raise CheckpointError(f"checkpoint descriptor {where} has no 'checkpoints' entry (a list "
                              f"of state-dict files, or one file or directory)")
    base_dir = descriptor.get("base_dir") or base_dir
    listed = descriptor["checkpoints"]
    if isinstance(listed, dict):  # save_mp_checkpoint_path's {"tp": [...], "non_tp": [...]}
        if listed.get("non_tp"):
            raise CheckpointError(f"checkpoint descriptor {where} lists 'non_tp' files; only "
                                  f"the 'tp' files (every tensor in each) are read")
        listed = listed.get("tp") or []
    if isinstance(listed, str):
        full = os.path.join(base_dir, listed)
        files = _files_in(full) if os.path.isdir(full) else _existing([full], where)
    else:
        files = _existing([os.path.join(base_dir, f) for f in listed], where)
    return files, descriptor, where


def _files_in(directory):
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth"):
        found = sorted(glob.glob(os.path.join(directory, pattern)))
        if found:
            return found
    raise FileNotFoundError(f"checkpoint directory {directory!r} holds no *.safetensors, *.bin, "
                            f"*.pt or *.pth file")


def _existing(files, where):
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of the {len(files)} checkpoint files listed in "
                                f"{where} are missing: {', '.join(missing)}")
    return files


def _tensors(path):
    """``(key, tensor)`` pairs of one file, read lazily where the format allows it."""
    if path.endswith(".safetensors"):
        from deepspeed.checkpoint.engines.safetensors_format import safetensors_module

        with safetensors_module().safe_open(path, framework="pt") as handle:
            for key in handle.keys():
                yield key, handle.get_tensor(key)
        return
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("module", "state_dict", "model"):
        if isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
    yield from _flat(state, "")


def _flat(state, prefix):
    """A state dict's tensors; nested dicts (Megatron's ``language_model`` -> ``encoder`` ->
    ...) under their keys joined with dots."""
    for key, value in state.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        elif torch.is_tensor(value):
            yield prefix + key, value


def _owners(model):
    """``{key: (tensor, [(module, attribute), ...])}`` of every parameter and persistent
    buffer, tied ones listed under each of their keys with all their owners."""
    by_id, keys = {}, {}
    for mname, module in model.named_modules(remove_duplicate=False):
        prefix = mname + "." if mname else ""
        for attr, p in module._parameters.items():
            if p is not None:
                by_id.setdefault(id(p), []).append((module, attr))
                keys[getattr(p, CHECKPOINT_KEY, prefix + attr)] = p
        for attr, b in module._buffers.items():
            if b is not None and attr not in module._non_persistent_buffers_set:
                by_id.setdefault(id(b), []).append((module, attr))
                keys[prefix + attr] = b
    return {k: (t, by_id[id(t)]) for k, t in keys.items()}


def empty_parameters(model):
    """``set_empty_params=True``: move every parameter to the meta device (same shape,
    ``requires_grad`` and sharding marks), so ``load_into`` materialises each from the
    checkpoint and none keeps the values it was built with; a tied parameter stays tied."""
    replaced = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            new = replaced.get(id(param))
            if new is None:
                new = nn.Parameter(torch.empty_like(param, device="meta"),
                                   requires_grad=param.requires_grad)
                for attr in (SHARD_FN, CHECKPOINT_KEY):
                    if hasattr(param, attr):
                        setattr(new, attr, getattr(param, attr))
                replaced[id(param)] = new
            module._parameters[name] = new
    return len(replaced)


def load_into(model, files, split=1, shapes=None, fused=None):
    """Copy ``files`` into ``model`` (already split) shard by shard; returns
    ``{"files", "loaded", "peak_param_bytes", "kept"}``. ``split`` > 1: the files are the
    tensor-parallel ranks of one checkpoint, merged with ``shapes`` (the unsplit model's);
    ``fused`` (``deepspeed.inference.merge.fused_qkv_plan``): Megatron fused projections
    reordered, one file or several."""
    owners = _owners(model)
    done, peak = set(), parameter_bytes(model)
    sources = [(path, _tensors(path)) for path in files] if split == 1 and not fused else \
        [(", ".join(files), merged_tensors(files, _tensors, shapes or {}, fused))]
    for path, tensors in sources:
        for key, full in tensors:
            if key not in owners:
                continue
            tensor, places = owners[key]
            if id(tensor) in done:
                continue
            shard = shard_of(tensor, full)
            if tuple(shard.shape) != tuple(tensor.shape):
                raise CheckpointError(f"checkpoint tensor {key!r} in {path} has shape "
                                      f"{tuple(full.shape)}; this rank's part of it is "
                                      f"{tuple(shard.shape)} but the model expects "
                                      f"{tuple(tensor.shape)}")
            if tensor.device.type == "meta":
                new = shard.to(tensor.dtype).clone()
                if isinstance(tensor, nn.Parameter):
                    new = nn.Parameter(new, requires_grad=False)
                    for attr in (SHARD_FN, CHECKPOINT_KEY):
                        if hasattr(tensor, attr):
                            setattr(new, attr, getattr(tensor, attr))
                for module, attr in places:
                    store = module._parameters if attr in module._parameters else module._buffers
                    store[attr] = new
                for other in owners:  # tied keys see the new tensor too
                    if owners[other][0] is tensor:
                        owners[other] = (new, places)
                done.add(id(new))
            else:
                with torch.no_grad():
                    tensor.copy_(shard)
            done.add(id(tensor))
            del full, shard
        peak = max(peak, parameter_bytes(model))
    left = sorted(k for k, (t, _) in owners.items() if t.device.type == "meta")
    if left:
        raise CheckpointError(f"{len(left)} parameters were in none of the checkpoint files "
                              f"({', '.join(files)}): {', '.join(left[:10])}"
                              f"{' ...' if len(left) > 10 else ''}")
    meta = [n for n, b in model.named_buffers() if b.device.type == "meta"]
    if meta:
        raise CheckpointError(f"buffers {', '.join(meta[:10])} are on the meta device and not in "
                              f"the checkpoint; build the model under "
                              f"deepspeed.inference.checkpoint.empty_init(), which keeps buffers "
                              f"real")
    kept = sorted(k for k, (t, _) in owners.items() if id(t) not in done)
    if kept:
        logger.info(f"init_inference: {len(kept)} tensors not in the checkpoint keep their "
                    f"values: {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}")
    return {"files": len(files), "loaded": len(done), "peak_param_bytes": peak, "kept": kept}


def checkpoint_shapes(model):
    """``{checkpoint key: shape}`` of the (unsplit) model's parameters and persistent buffers:
    what merging a tensor-parallel checkpoint joins the pieces into."""
    return {key: list(tensor.shape) for key, (tensor, _) in _owners(model).items()}
