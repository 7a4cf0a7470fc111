"""The safetensors file format, written and read without the ``safetensors`` package.

A checkpoint is more than a flat ``{name: tensor}`` dict: nested optimizer state, counters,
RNG tuples, ``torch.Size`` shapes. The tensors go into the safetensors body (one entry per
distinct tensor, named ``t<i>``); everything else is the *skeleton*: the same structure with each
tensor replaced by a scalar int64 placeholder holding its index, ``torch.save``d and stored
base64-encoded in the header's ``__metadata__``. The skeleton is read back with
``weights_only=True``, so loading still never runs code. The files open with the
``safetensors`` library too (its tensors, plus our metadata entry).

Layout: 8-byte little-endian header length, a JSON header (padded with spaces to a multiple
of 8), then the raw little-endian tensor bytes.
"""
import base64
import io
import json
import struct
import sys
from collections.abc import Mapping

import torch

SKELETON_KEY = "deepspeed_skeleton"
FORMAT_KEY = "format"
FORMAT_VALUE = "deepspeed-checkpoint"

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _name, _code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                     ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code
_CODES = {code: dtype for dtype, code in _DTYPES.items()}


def _rebuild(mapping, items):
    if type(mapping) is dict:
        return dict(items)
    rebuilt = type(mapping)()  # OrderedDict and friends; weights-only loading allows no others
    rebuilt.update(items)
    # a state_dict's OrderedDict carries ``_metadata`` (module versions) as an attribute
    rebuilt.__dict__.update(getattr(mapping, "__dict__", {}))
    return rebuilt


def _split(obj, tensors, seen, path):
    """``obj`` with tensors replaced by index placeholders; ``tensors`` collects them. The
    same tensor object twice (tied weights) is stored once and comes back as one object."""
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.layout != torch.strided:
            raise TypeError(f"{path}: safetensors stores dense tensors only, got layout "
                            f"{obj.layout}")
        if obj.dtype not in _DTYPES:
            raise TypeError(f"{path}: dtype {obj.dtype} cannot be stored in safetensors "
                            f"(supported: {sorted(str(d) for d in _DTYPES)})")
        index = seen.get(id(obj))
        if index is None:
            index = seen[id(obj)] = len(tensors)
            tensors.append(obj)
        return torch.tensor(index, dtype=torch.int64)
    if isinstance(obj, Mapping):
        return _rebuild(obj, [(k, _split(v, tensors, seen, f"{path}[{k!r}]"))
                              for k, v in obj.items()])
    if type(obj) is list:
        return [_split(v, tensors, seen, f"{path}[{i}]") for i, v in enumerate(obj)]
    if type(obj) is tuple:
        return tuple(_split(v, tensors, seen, f"{path}[{i}]") for i, v in enumerate(obj))
    return obj


def _join(skeleton, tensors):
    if isinstance(skeleton, torch.Tensor):
        return tensors[f"t{int(skeleton)}"]
    if isinstance(skeleton, Mapping):
        return _rebuild(skeleton, [(k, _join(v, tensors)) for k, v in skeleton.items()])
    if type(skeleton) is list:
        return [_join(v, tensors) for v in skeleton]
    if type(skeleton) is tuple:
        return tuple(_join(v, tensors) for v in skeleton)
    return skeleton


def _little_endian_bytes(tensor):
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if sys.byteorder != "little":
        raise RuntimeError("the safetensors checkpoint engine needs a little-endian host")
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def write(state, f):
    """Write ``state`` (any weights-only-loadable structure) to the binary file ``f``."""
    tensors = []
    skeleton = _split(state, tensors, {}, "state")
    buffer = io.BytesIO()
    torch.save(skeleton, buffer)
    header, offset = {}, 0
    for i, tensor in enumerate(tensors):
        size = tensor.numel() * tensor.element_size()
        header[f"t{i}"] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                           "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {FORMAT_KEY: FORMAT_VALUE,
                              SKELETON_KEY: base64.b64encode(buffer.getvalue()).decode("ascii")}
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for tensor in tensors:
        f.write(_little_endian_bytes(tensor))


def is_safetensors(head):
    """Whether the first bytes of a file look like a safetensors header (length, then ``{``)."""
    return len(head) >= 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def read(path):
    """The structure ``write`` stored (tensors on CPU). A plain safetensors file (no skeleton,
    e.g. a Hugging Face model) reads as its ``{name: tensor}`` dict."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length).decode("utf-8"))
        body_start = 8 + length
        metadata = header.pop("__metadata__", None) or {}
        tensors = {}
        for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = _CODES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(f"'{path}': tensor '{name}' has dtype {entry['dtype']}, which "
                                 f"this torch cannot represent")
            begin, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=dtype)
            if end > begin:
                f.seek(body_start + begin)
                target = tensor.view(-1).view(torch.uint8).numpy()
                if f.readinto(memoryview(target)) != end - begin:
                    raise ValueError(f"'{path}' is truncated: tensor '{name}' is incomplete")
            tensors[name] = tensor
    if SKELETON_KEY not in metadata:
        return tensors
    skeleton = torch.load(io.BytesIO(base64.b64decode(metadata[SKELETON_KEY])),
                          map_location="cpu", weights_only=True)
    return _join(skeleton, tensors)
