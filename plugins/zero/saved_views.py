"""Let ZeRO-3 actually free a gathered weight between a module's forward and its backward.

A module's forward hook releases its parameters, but autograd may still hold their full data:
``F.linear`` on a 3-D input runs ``addmm``/``matmul`` on ``weight.t()`` and saves that *view*
for backward, and a view keeps the whole gathered buffer alive. So every layer's full weights
stayed resident from its forward to its backward, the whole model at the activation peak
(measured on the 3.2 M-parameter GPT of ``tools/bench/zero_bench.py``: 11 MiB per rank of
heap in use at the end of forward, of a 512 MiB peak RSS).

Upstream DeepSpeed avoids this with its own ``LinearFunctionForZeroStage3``, which saves the
parameter instead; that would change the backward kernels (and the bits of the gradients). Here
the saved tensors of a module with gathered (non-persistent) parameters go through a
``saved_tensors_hooks`` pair instead: a saved tensor that views a gathered parameter's buffer is
kept as ``(parameter, size, stride, offset)``, and rebuilt in backward as the same view of the
parameter's data, which the coordinator has gathered again before that module's backward runs
(``_GatherBeforeBackward``; the unpack gathers it itself if not). Torch's own backward kernels
run on the same values, so gradients are bit-identical. Every other saved tensor is kept as is.

The hooks stand aside when someone else's saved-tensor hooks are active (activation
checkpointing, CPU offload of activations): torch applies only the innermost pair, and theirs
must see every tensor.
"""
import torch

from deepspeed.zero.partition_parameters import ZeroParamStatus

# torch's own saved_tensors_hooks context manager is built on these; the "whose hooks are on top"
# query is what lets ours stand aside. A torch without them keeps the old behaviour (weights held
# by saved views until backward): memory only, never the numerics.
_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
_push_hooks = getattr(torch._C._autograd, "_push_saved_tensors_default_hooks", None)
_pop_hooks = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
AVAILABLE = None not in (_top_hooks, _push_hooks, _pop_hooks)


class _ParamView:
    __slots__ = ("param", "size", "stride", "offset")

    def __init__(self, param, size, stride, offset):
        self.param, self.size, self.stride, self.offset = param, size, stride, offset


class SavedWeightViews:
    """The saved-tensor hooks of one ``ParameterCoordinator``: ``enter(module, params)`` in a
    module's forward pre-hook, ``exit(module)`` in its forward hook (properly nested);
    ``unwind()`` drops whatever a forward that raised left entered."""

    def __init__(self):
        self._entered = []  # (module, storage pointers it registered), innermost last
        self._spans = {}  # storage data_ptr -> [(first element, end, param)] gathered now

    def enter(self, module, params):
        if not AVAILABLE or not torch.is_grad_enabled():
            return
        top = _top_hooks(False)
        if top is not None and top[0] != self._pack:  # someone else's hooks: theirs apply
            return
        added = []
        for param in params:
            if param.ds_persist or param.ds_status is not ZeroParamStatus.AVAILABLE:
                continue
            data = param.data
            ptr = data.untyped_storage().data_ptr()
            self._spans.setdefault(ptr, []).append(
                (data.storage_offset(), data.storage_offset() + data.numel(), param))
            added.append(ptr)
        if not added:
            return  # nothing of its own gathered (an enclosing module's hooks may cover it)
        _push_hooks(self._pack, self._unpack)
        self._entered.append((module, added))

    def exit(self, module):
        if self._entered and self._entered[-1][0] is module:
            self._pop()

    def unwind(self):
        while self._entered:
            self._pop()

    def _pop(self):
        _, added = self._entered.pop()
        _pop_hooks()
        for ptr in added:
            spans = self._spans[ptr]
            spans.pop()
            if not spans:
                del self._spans[ptr]

    def _pack(self, tensor):
        if not self._spans or tensor.layout is not torch.strided:
            return tensor
        spans = self._spans.get(tensor.untyped_storage().data_ptr())
        if spans is None:
            return tensor
        offset = tensor.storage_offset()
        for first, end, param in spans:
            if first <= offset < end:
                if tensor is param:
                    return tensor  # the parameter itself follows its data anyway
                return _ParamView(param, tensor.size(), tensor.stride(), offset - first)
        return tensor

    @staticmethod
    def _unpack(packed):
        if type(packed) is not _ParamView:
            return packed
        param = packed.param
        if param.ds_status is not ZeroParamStatus.AVAILABLE:
            param.ds_partitioner.gather([param])
        data = param.data
        return data.as_strided(packed.size, packed.stride, data.storage_offset() + packed.offset)
