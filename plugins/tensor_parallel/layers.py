"""The tensor-parallel Linear layers, for inference and training, and the two communication
ops that make autograd through the training ones exact (Megatron's conjugate pair "f" and "g").

Every split Linear holds this rank's slice of the weight (``SplitLinear``: ``in_features`` /
``out_features`` are this rank's). AutoTP puts the inference pair in place of ``nn.Linear``:
``LinearLayer`` holds a slice of the output features (column parallel): its output is this
rank's part of the activations and needs no communication. ``LinearAllreduce`` holds the
matching slice of the input features (row parallel): it multiplies this rank's part of the
activations and sums the partial results over the tensor-parallel group, then adds the bias
once. A block whose Linears are column parallel up to the one writing into the residual
stream, which is row parallel, computes exactly what the unsplit block computes, with one
all-reduce per such Linear. Their weights are frozen, their all-reduce plain.

A transformer block split by AutoTP runs, on each rank of the tensor-parallel group,

    x (whole) -> f -> column-parallel Linears (q/k/v, gate/up: this rank's output slice)
              -> ...  (attention over this rank's heads, the activation)
              -> row-parallel Linear (o_proj, down_proj: this rank's input slice) -> g -> out

- ``g`` (``reduce_from_tensor_parallel``): forward all-reduces the partial sums, so ``out`` is
  the unsplit block's output on every rank; backward passes the gradient through unchanged
  (every rank's partial sum contributed with weight 1).
- ``f`` (``copy_to_tensor_parallel``): forward is the identity; backward all-reduces the input
  gradient, since each rank's column slice only saw part of the use of ``x``. After it, the
  gradient reaching the replicated layers (norms, embeddings) is the whole one on every rank.

``ColumnParallelLinear`` / ``RowParallelLinear`` train: ``from_inference_layer`` turns an
inference pair AutoTP made into them.
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist
from deepspeed.hooks import UNIVERSAL_CHECKPOINT_SLICE
from deepspeed.tensor_parallel.sharding import frozen

#: set on a parameter split over the tensor-parallel group (Megatron's attribute names):
#: ``tensor_model_parallel`` True and ``partition_dim`` the dimension it was cut along
TENSOR_MODEL_PARALLEL = "tensor_model_parallel"
PARTITION_DIM = "partition_dim"


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _OverlappedColumnParallelLinear(torch.autograd.Function):
    """"f" and a column-parallel Linear in one op (``tensor_parallel.tp_overlap_comm``):
    backward starts the all-reduce of the input gradient asynchronously, computes the weight
    and bias gradients while it runs, and waits for it only before handing the input gradient
    on, which is when autograd needs it. Megatron's async tensor-parallel all-reduce; each
    Linear then reduces its own input gradient (q, k and v: three all-reduces, each hidden
    behind a matmul, instead of one exposed)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = group, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_input = work = None
        if ctx.needs_input_grad[0]:
            grad_input = grad.matmul(weight)
            work = dist.all_reduce(grad_input, group=ctx.group, async_op=True)
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = rows.t().matmul(x.reshape(-1, x.shape[-1])) \
            if ctx.needs_input_grad[1] else None
        grad_bias = rows.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if work is not None:
            work.wait()
        return grad_input, grad_weight, grad_bias, None


def copy_to_tensor_parallel(x, group):
    """Identity forward, gradient all-reduced over ``group`` backward ("f")."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x, group):
    """All-reduce over ``group`` forward, identity backward ("g")."""
    return _ReduceFromTensorParallel.apply(x, group)


class SharedInputCopy:
    """One "f" per input tensor: the column-parallel Linears reading the same activation (q, k
    and v; gate and up) share its copy, so autograd sums their input gradients first and the
    backward all-reduces once instead of once per Linear. Holds the last input seen (by
    identity, per grad mode) until a row-parallel Linear of the model ends the region."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.input = self.output = self.grad_enabled = None

    def __call__(self, x, group):
        grad_enabled = torch.is_grad_enabled()
        if self.input is not x or self.grad_enabled != grad_enabled:
            self.input, self.grad_enabled = x, grad_enabled
            self.output = copy_to_tensor_parallel(x, group)
        return self.output


def _mark(param, dim, group):
    """Megatron's attributes, and the piece this rank holds for checkpoints
    (``UNIVERSAL_CHECKPOINT_SLICE``: ``ds_to_universal`` joins the ranks' pieces, a universal
    load cuts them again at any tensor-parallel size)."""
    setattr(param, TENSOR_MODEL_PARALLEL, True)
    setattr(param, PARTITION_DIM, dim)
    if dist.is_initialized():
        setattr(param, UNIVERSAL_CHECKPOINT_SLICE,
                (dim, dist.get_world_size(group=group), dist.get_rank(group=group)))
    return param


class SplitLinear(nn.Module):
    """What every split Linear shares: this rank's ``weight`` slice and ``bias`` (Parameters as
    given; plain tensors become frozen Parameters), cut along ``split_dim`` (0: output
    features, column parallel; 1: input features, row parallel)."""

    split_dim = None

    def __init__(self, weight, bias=None):
        super().__init__()
        self.weight = frozen(weight)
        self.bias = None if bias is None else frozen(bias)

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def extra_repr(self):
        split = ("in_features", "out_features")[self.split_dim == 0]
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({split} of this rank)")


class LinearAllreduce(SplitLinear):
    """Row-parallel Linear for inference: ``all_reduce(x_part @ weight_part.T) + bias``.

    ``weight`` is this rank's ``[out_features, in_features / tp]`` slice, ``bias`` the whole
    bias (or None), ``mp_group`` the tensor-parallel group (None: the world group; False: no
    all-reduce)."""

    split_dim = 1

    def __init__(self, weight, bias=None, mp_group=None):
        super().__init__(weight, bias)
        self.mp_group = mp_group

    def forward(self, input):
        output = F.linear(input, self.weight)
        if self.mp_group is not False:
            dist.inference_all_reduce(output, group=self.mp_group)
        if self.bias is not None:
            output = output + self.bias
        return output


class LinearLayer(SplitLinear):
    """Column-parallel Linear for inference: ``x @ weight_part.T + bias_part``. ``weight`` is
    this rank's ``[out_features / tp, in_features]`` slice, ``bias`` its matching slice (or
    None). ``weight_shape`` / ``dtype`` build an empty layer instead (upstream's signature)."""

    split_dim = 0

    def __init__(self, weight_shape=None, dtype=torch.half, weight=None, bias=None):
        if weight is None:
            if weight_shape is None:
                raise ValueError("LinearLayer needs a weight or a weight_shape")
            weight = torch.empty(weight_shape, dtype=dtype)
            bias = torch.empty(weight_shape[0], dtype=dtype)
        super().__init__(weight, bias)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)


class _TensorParallelLinear(SplitLinear):
    """What both training Linears share: the weight slice marked with its split dimension,
    the bias cut along 0 (and marked) when ``split_bias``, the tensor-parallel group, the
    model's ``SharedInputCopy``."""

    split_bias = False

    def __init__(self, weight, bias, group, shared_copy=None):
        super().__init__(_mark(weight, self.split_dim, group),
                         bias if bias is None or not self.split_bias else _mark(bias, 0, group))
        self.group = group
        self.shared_copy = shared_copy


class ColumnParallelLinear(_TensorParallelLinear):
    """``f(x) @ weight.T + bias`` with this rank's ``[out / tp, in]`` weight slice and
    ``[out / tp]`` bias slice; the output is this rank's slice of the features. With
    ``overlap_comm`` (``tensor_parallel.tp_overlap_comm``) backward overlaps the input
    gradient's all-reduce with the weight gradient (``_OverlappedColumnParallelLinear``)."""

    split_dim, split_bias = 0, True
    overlap_comm = False

    def forward(self, input):
        if self.overlap_comm and torch.is_grad_enabled():
            return _OverlappedColumnParallelLinear.apply(input, self.weight, self.bias,
                                                         self.group)
        copied = (copy_to_tensor_parallel(input, self.group) if self.shared_copy is None
                  else self.shared_copy(input, self.group))
        return F.linear(copied, self.weight, self.bias)


class RowParallelLinear(_TensorParallelLinear):
    """``g(x_slice @ weight.T) + bias`` with this rank's ``[out, in / tp]`` weight slice and
    the whole bias (added once, after the sum); the output is whole on every rank."""

    split_dim, split_bias = 1, False

    def forward(self, input):
        if self.shared_copy is not None:
            self.shared_copy.clear()  # the column-parallel region that fed this layer ends
        output = reduce_from_tensor_parallel(F.linear(input, self.weight), self.group)
        return output if self.bias is None else output + self.bias


def _reuse(original, shard):
    """``original`` (the unsplit layer's Parameter) now holding ``shard``'s slice: the same
    Parameter object, so references taken before the split (``model.parameters()`` handed to
    ``deepspeed.initialize``, an optimizer's param groups) step the split weights."""
    if shard is None:
        return None
    if original is None:
        return nn.Parameter(shard.data)
    original.data = shard.data
    return original


def from_inference_layer(layer, group, original=None, shared_copy=None):
    """The training layer for an inference ``LinearAllreduce`` (row parallel) or
    ``LinearLayer`` (column parallel), holding its slices in ``original``'s Parameters (the
    ``nn.Linear`` it replaced) when given and sharing ``shared_copy`` (a
    ``SharedInputCopy``) with the model's other layers; None for any other module."""
    if isinstance(layer, LinearAllreduce):
        cls = RowParallelLinear
    elif isinstance(layer, LinearLayer):
        cls = ColumnParallelLinear
    else:
        return None
    return cls(_reuse(getattr(original, "weight", None), layer.weight),
               _reuse(getattr(original, "bias", None), layer.bias), group, shared_copy)
