"""The two tensor-parallel Linear layers AutoTP puts in place of ``nn.Linear``.

``LinearLayer`` holds a slice of the output features (column parallel): its output is this
rank's part of the activations and needs no communication. ``LinearAllreduce`` holds the
matching slice of the input features (row parallel): it multiplies this rank's part of the
activations and sums the partial results over the tensor-parallel group, then adds the bias
once. A block whose Linears are column parallel up to the one writing into the residual
stream, which is row parallel, computes exactly what the unsplit block computes, with one
all-reduce per such Linear.
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist


class LinearAllreduce(nn.Module):
    """Row-parallel Linear: ``all_reduce(x_part @ weight_part.T) + bias``.

    ``weight`` is this rank's ``[out_features, in_features / tp]`` slice, ``bias`` the whole
    bias (or None), ``mp_group`` the tensor-parallel group (None: the world group)."""

    def __init__(self, weight, bias=None, mp_group=None):
        super().__init__()
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = (None if bias is None else
                     bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias, requires_grad=False))
        self.mp_group = mp_group

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def forward(self, input):
        output = F.linear(input, self.weight)
        if self.mp_group is not False:
            dist.inference_all_reduce(output, group=self.mp_group)
        if self.bias is not None:
            output = output + self.bias
        return output

    def extra_repr(self):
        return f"in_features={self.in_features} (this rank), out_features={self.out_features}"


class LinearLayer(nn.Module):
    """Column-parallel Linear: ``x @ weight_part.T + bias_part``. ``weight`` is this rank's
    ``[out_features / tp, in_features]`` slice, ``bias`` its matching slice (or None).
    ``weight_shape`` / ``dtype`` build an empty layer instead (upstream's signature)."""

    def __init__(self, weight_shape=None, dtype=torch.half, weight=None, bias=None):
        super().__init__()
        if weight is None:
            if weight_shape is None:
                raise ValueError("LinearLayer needs a weight or a weight_shape")
            weight = torch.empty(weight_shape, dtype=dtype)
            bias = torch.empty(weight_shape[0], dtype=dtype)
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = (None if bias is None else
                     bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias, requires_grad=False))

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features} (this rank)"
