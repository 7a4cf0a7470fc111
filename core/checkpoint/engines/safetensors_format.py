"""Checkpoint files in the safetensors format, through the ``safetensors`` library.

A checkpoint is more than a flat ``{name: tensor}`` dict: nested optimizer state, counters, RNG
tuples, ``torch.Size`` shapes, int keys. So one file becomes two:

- ``<path>``: a plain safetensors file holding every distinct tensor under a name made of its
  key path (``module.fc.weight``, ``optimizer.state.0.exp_avg``), readable by every safetensors
  tool. Its metadata (strings only) says where the rest is and which save it belongs to.
- ``<path>.state.json``: the *skeleton*, the same structure as JSON with each tensor replaced by
  ``{"$tensor": name}``; tuples, ``torch.Size``, dtypes, devices, non-string keys, ordered
  dicts and non-finite floats are spelled as small tagged objects (see ``_encode``).

Nothing is pickled, so loading runs no code from the files; a safetensors file whose metadata
holds a pickled skeleton (the format before this one) is refused with that reason. The
skeleton is written first and both files carry one random save id, so a crash between the two
writes is detected on load instead of pairing a new skeleton with old tensors.
"""
import base64
import importlib
import json
import math
import os
import uuid
from collections import OrderedDict

import torch

from deepspeed.checkpoint.errors import CheckpointFormatError

FORMAT_KEY = "format"
FORMAT_VALUE = "pt"  # what Hugging Face tools expect in a torch-written safetensors file
STATE_KEY = "deepspeed_state"  # metadata: the skeleton's file name, next to the tensors
SAVE_ID_KEY = "deepspeed_save_id"
STATE_SUFFIX = ".state.json"
SKELETON_FORMAT = "deepspeed-checkpoint-skeleton"
PICKLED_SKELETON_KEY = "deepspeed_skeleton"  # the earlier format: a pickle in the metadata

SUPPORTED_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
SUPPORTED_DTYPES |= {getattr(torch, name) for name in ("uint16", "uint32", "uint64",
                                                       "float8_e4m3fn", "float8_e5m2")
                     if hasattr(torch, name)}


class SafetensorsStateError(CheckpointFormatError):
    """A state cannot be written to, or read back from, the safetensors checkpoint format."""


def state_path(path):
    """Where the non-tensor part of the checkpoint file ``path`` lives."""
    return os.fspath(path) + STATE_SUFFIX


def is_state_file(name):
    return name.endswith(STATE_SUFFIX)


# ------------------------------------------------------------------ the skeleton as JSON
class _Tensors:
    """Collects the distinct tensors of a state under key-path names; the same tensor object
    twice (tied weights) is stored once and comes back as one object."""

    def __init__(self):
        self.by_id = {}
        self.tensors = OrderedDict()

    def add(self, tensor, where):
        if tensor.is_sparse or tensor.layout != torch.strided:
            raise SafetensorsStateError(f"{where}: safetensors stores dense tensors only, got "
                                        f"layout {tensor.layout}")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise SafetensorsStateError(
                f"{where}: dtype {tensor.dtype} cannot be stored in safetensors (supported: "
                f"{', '.join(sorted(str(d) for d in SUPPORTED_DTYPES))})")
        name = self.by_id.get(id(tensor))
        if name is None:
            name = base = where
            count = 1
            while name in self.tensors:
                count += 1
                name = f"{base}#{count}"
            self.by_id[id(tensor)] = name
            self.tensors[name] = tensor
        return name


def _key_name(key):
    return key if isinstance(key, str) else repr(key)


def _encode(obj, tensors, where):
    """``obj`` as JSON values; tensors go to ``tensors``. ``where`` is the dotted key path
    (the tensor's name in the safetensors file, and the place named in errors)."""
    if isinstance(obj, torch.Tensor):
        return {"$tensor": tensors.add(obj, where or "tensor")}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"$float": repr(obj)}
    if isinstance(obj, torch.Size):
        return {"$size": list(obj)}
    if isinstance(obj, torch.dtype):
        return {"$dtype": str(obj).replace("torch.", "")}
    if isinstance(obj, torch.device):
        return {"$device": str(obj)}
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    child = (lambda key: f"{where}.{_key_name(key)}" if where else _key_name(key))
    if type(obj) is list:
        return [_encode(v, tensors, child(i)) for i, v in enumerate(obj)]
    if type(obj) is tuple:
        return {"$tuple": [_encode(v, tensors, child(i)) for i, v in enumerate(obj)]}
    if type(obj) is dict and all(isinstance(k, str) and not k.startswith("$") for k in obj):
        return {k: _encode(v, tensors, child(k)) for k, v in obj.items()}
    if type(obj) in (dict, OrderedDict):
        items = [[_encode(k, tensors, child("key")), _encode(v, tensors, child(k))]
                 for k, v in obj.items()]
        if type(obj) is dict:
            return {"$dict": items}
        # a state_dict's OrderedDict carries ``_metadata`` (module versions) as an attribute
        attrs = {k: _encode(v, tensors, child(k)) for k, v in vars(obj).items()}
        return {"$odict": items, "$attrs": attrs} if attrs else {"$odict": items}
    raise SafetensorsStateError(
        f"state.{where or ''}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be "
        f"stored in a safetensors checkpoint (tensors, numbers, strings, None, bytes, dtypes, "
        f"devices, torch.Size and lists/tuples/dicts of those)")


_DECODERS = {
    "$tensor": None,  # needs the tensors: handled in _decode
    "$float": float,
    "$size": torch.Size,
    "$dtype": lambda name: getattr(torch, name),
    "$device": torch.device,
    "$bytes": base64.b64decode,
}


def _decode(value, tensors):
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "$tensor" in value:
        return tensors[value["$tensor"]]
    for tag, decode in _DECODERS.items():
        if tag in value and decode is not None:
            return decode(value[tag])
    if "$tuple" in value:
        return tuple(_decode(v, tensors) for v in value["$tuple"])
    if "$dict" in value:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["$dict"]}
    if "$odict" in value:
        rebuilt = OrderedDict((_decode(k, tensors), _decode(v, tensors))
                              for k, v in value["$odict"])
        for name, attr in value.get("$attrs", {}).items():
            setattr(rebuilt, name, _decode(attr, tensors))
        return rebuilt
    return {k: _decode(v, tensors) for k, v in value.items()}


# ------------------------------------------------------------------ files
def _storable(tensor, seen_storages):
    """A CPU tensor safetensors accepts: contiguous, owning its bytes (a view into a larger
    buffer or a storage already stored under another name is copied)."""
    tensor = tensor.detach().to("cpu")
    storage = tensor.untyped_storage()
    whole = tensor.is_contiguous() and tensor.storage_offset() == 0 and \
        storage.nbytes() == tensor.numel() * tensor.element_size()
    if not whole or storage.data_ptr() in seen_storages:
        tensor = tensor.contiguous().clone()
    if tensor.numel():
        seen_storages.add(tensor.untyped_storage().data_ptr())
    return tensor


def split(state):
    """``(tensors by name, JSON skeleton)`` of a checkpoint state."""
    tensors = _Tensors()
    skeleton = _encode(state, tensors, "")
    seen = set()
    return OrderedDict((n, _storable(t, seen)) for n, t in tensors.tensors.items()), skeleton


def safetensors_module(name="safetensors"):
    """Import ``safetensors`` (or its submodule ``name``), or say how to install it: it is an
    extra (``pip install 'deepspeed[safetensors]'``), as upstream does not depend on it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError("the safetensors checkpoint format needs the 'safetensors' package: "
                          "pip install safetensors  (or pip install 'deepspeed[safetensors]'); "
                          "the default checkpoint_engine 'torch' needs nothing more") from exc


def write(state, path, write_atomically):
    """Write ``state`` as ``path`` (safetensors) plus ``state_path(path)`` (JSON), each with
    ``write_atomically(target, write_to_temporary_path)``."""
    save_file = safetensors_module("safetensors.torch").save_file

    tensors, skeleton = split(state)
    save_id = uuid.uuid4().hex
    document = {"format": SKELETON_FORMAT, "version": 1, "save_id": save_id,
                "skeleton": skeleton}
    text = json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
    write_atomically(state_path(path), lambda tmp: _write_bytes(tmp, text))
    metadata = {FORMAT_KEY: FORMAT_VALUE, STATE_KEY: os.path.basename(state_path(path)),
                SAVE_ID_KEY: save_id}
    write_atomically(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _write_bytes(path, data):
    with open(path, "wb") as handle:
        handle.write(data)


def is_safetensors(head):
    """Whether the first bytes of a file look like a safetensors header (length, then ``{``)."""
    return len(head) >= 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def read(path):
    """The structure ``write`` stored (tensors on CPU). A plain safetensors file (no skeleton,
    e.g. a Hugging Face model) reads as its ``{name: tensor}`` dict."""
    safe_open = safetensors_module().safe_open

    path = os.fspath(path)
    with safe_open(path, framework="pt", device="cpu") as handle:
        metadata = handle.metadata() or {}
        if PICKLED_SKELETON_KEY in metadata:
            raise SafetensorsStateError(
                f"'{path}' keeps its non-tensor state as a pickle inside the safetensors "
                f"metadata (the format of earlier versions of this package); loading refuses "
                f"pickles. Its tensors are readable with safetensors.torch.load_file; save "
                f"the checkpoint again to get the pickle-free format")
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    if STATE_KEY not in metadata:
        return tensors
    sidecar = os.path.join(os.path.dirname(path), metadata[STATE_KEY])
    if not os.path.isfile(sidecar):
        raise SafetensorsStateError(f"'{path}' names its non-tensor state '{sidecar}', which "
                                    f"does not exist; copy both files of a checkpoint together")
    with open(sidecar, encoding="utf-8") as handle:
        document = json.load(handle)
    if document.get("format") != SKELETON_FORMAT:
        raise SafetensorsStateError(f"'{sidecar}' is not a checkpoint skeleton (format "
                                    f"{document.get('format')!r})")
    if document.get("save_id") != metadata.get(SAVE_ID_KEY):
        raise SafetensorsStateError(f"'{sidecar}' and '{path}' come from different saves (a "
                                    f"save was interrupted between them); load an earlier tag")
    return _decode(document["skeleton"], tensors)
