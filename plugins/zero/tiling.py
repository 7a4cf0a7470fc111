"""Memory-centric tiling: ``deepspeed.zero.TiledLinear`` (and ``TiledLinearReturnBias``).

One large linear layer becomes ``out_splits x in_splits`` smaller linear modules ("tiles") that
run one after another. ZeRO-3 gathers parameters per module, so only one tile's weight needs to
be whole at a time: the working memory of the layer shrinks with the number of tiles, and a
layer larger than one device's memory can still run.

Tile ``[o][i]`` maps input columns ``in_parts[i]`` to output rows ``out_parts[o]`` (uniform
splits, the first ones one larger when the features do not divide). The partial results of an
output row are summed over the input splits; only the row's last tile carries the bias, so it is
added once. The rows are concatenated along the last dimension (``combine_out_splits``) or
returned as a list.
"""
import torch

from deepspeed.zero.gathered_parameters import GatheredParameters


def split_sizes(features, splits):
    """``features`` cut into ``splits`` uniform parts, the first ``features % splits`` parts one
    larger (``split_sizes(10, 3) == [4, 3, 3]``)."""
    base, extra = divmod(features, splits)
    return [base + 1 if index < extra else base for index in range(splits)]


def split_tensor_along_last_dim(tensor, partitions, contiguous_split_chunks=False):
    """``tensor`` split along its last dimension into pieces of the sizes ``partitions``."""
    chunks = torch.split(tensor, list(partitions), dim=-1)
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks


def _check_splits(name, splits, features, features_name):
    if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= features:
        raise RuntimeError(f"TiledLinear: {name}={splits!r} must be an integer in [1, "
                           f"{features_name}={features}]")


class TiledLinear(torch.nn.Module):
    """A ``linear_cls(in_features, out_features, bias)`` computed as ``out_splits x in_splits``
    tiles, each a ``linear_cls`` module of its own (``**kwargs`` go to every tile).

    ``input_is_already_split``: ``forward`` takes a list of ``in_splits`` tensors (the input's
    last dimension already cut as ``split_sizes(in_features, in_splits)``).
    ``combine_out_splits=False``: ``forward`` returns the ``out_splits`` output pieces as a list.
    ``init_linear``: a ``torch.nn.Linear``-like module whose weight and bias the tiles start
    from (``copy_params_from``)."""

    def __init__(self, in_features, out_features, bias=True, in_splits=1, out_splits=1,
                 input_is_already_split=False, combine_out_splits=True,
                 linear_cls=torch.nn.Linear, init_linear=None, **kwargs):
        super().__init__()
        _check_splits("in_splits", in_splits, in_features, "in_features")
        _check_splits("out_splits", out_splits, out_features, "out_features")
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        self.in_splits = in_splits
        self.out_splits = out_splits
        self.input_is_already_split = input_is_already_split
        self.combine_out_splits = combine_out_splits
        self.in_parts = split_sizes(in_features, in_splits)
        self.out_parts = split_sizes(out_features, out_splits)
        # linears[o][i]: input part i -> output part o; the bias on the last input part only
        self.linears = torch.nn.ModuleList(
            torch.nn.ModuleList(
                linear_cls(in_size, out_size, bias=bias and index == in_splits - 1, **kwargs)
                for index, in_size in enumerate(self.in_parts))
            for out_size in self.out_parts)
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_):
        if self.input_is_already_split:
            inputs = list(input_)
            if len(inputs) != self.in_splits:
                raise AssertionError(f"TiledLinear: input_is_already_split expects a list of "
                                     f"in_splits={self.in_splits} tensors, got {len(inputs)}")
        else:
            inputs = split_tensor_along_last_dim(input_, self.in_parts)
        outputs = [self._row(row, inputs) for row in self.linears]
        return self._combine(outputs)

    def _row(self, row, inputs):
        """One output part: the tiles' partial products summed over the input parts."""
        total = None
        for tile, piece in zip(row, inputs):
            total = self._reduce_local_output(total, tile(piece))
        return total

    def _reduce_local_output(self, total, partial):
        """Add one tile's output to the running sum of its row (``total`` None: the first)."""
        return partial if total is None else total + partial

    def _combine(self, outputs):
        return torch.cat(outputs, dim=-1) if self.combine_out_splits else outputs

    def _tiles(self):
        for o, row in enumerate(self.linears):
            for i, tile in enumerate(row):
                yield o, i, tile

    @torch.no_grad()
    def copy_params_from(self, other):
        """Copy ``other.weight`` (``[out_features, in_features]``) and ``other.bias`` into the
        tiles. Under ZeRO-3 this is a collective: every rank must call it, and data-parallel
        rank 0's values are what every rank keeps."""
        if tuple(other.weight.shape if not hasattr(other.weight, "ds_shape")
                 else other.weight.ds_shape) != (self.out_features, self.in_features):
            raise AssertionError(f"TiledLinear.copy_params_from: the weight's shape "
                                 f"{tuple(getattr(other.weight, 'ds_shape', other.weight.shape))}"
                                 f" is not ({self.out_features}, {self.in_features})")
        other_bias = getattr(other, "bias", None)
        if (other_bias is not None) != bool(self.use_bias):
            raise AssertionError(f"TiledLinear.copy_params_from: bias={self.use_bias} here, but "
                                 f"the source {'has' if other_bias is not None else 'has no'} "
                                 f"bias")
        sources = [other.weight] + ([other_bias] if other_bias is not None else [])
        with GatheredParameters(sources, modifier_rank=None):
            weight = other.weight.detach()
            bias = other_bias.detach() if other_bias is not None else None
            out_starts = _starts(self.out_parts)
            in_starts = _starts(self.in_parts)
            for o, i, tile in self._tiles():
                with GatheredParameters(list(tile.parameters()), modifier_rank=0):
                    block = weight.narrow(0, out_starts[o], self.out_parts[o]) \
                        .narrow(1, in_starts[i], self.in_parts[i])
                    tile.weight.copy_(block)
                    if getattr(tile, "bias", None) is not None and bias is not None:
                        tile.bias.copy_(bias.narrow(0, out_starts[o], self.out_parts[o]))


def _starts(sizes):
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += size
    return starts


class TiledLinearReturnBias(TiledLinear):
    """``TiledLinear`` over tiles that return ``(output, bias)`` (Megatron-LM's delayed-bias
    layers): the outputs are summed over input parts as usual, the bias is passed through
    (not added) and returned next to the output."""

    def _row(self, row, inputs):
        total, bias = None, None
        for tile, piece in zip(row, inputs):
            result = tile(piece)
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise AssertionError("TiledLinearReturnBias: each tile must return "
                                     "(output, bias); use TiledLinear for plain layers")
            output, tile_bias = result
            total = self._reduce_local_output(total, output)
            if tile_bias is not None:
                bias = tile_bias if bias is None else bias + tile_bias
        return total, bias

    def _combine(self, outputs):
        values = [o for o, _ in outputs]
        biases = [b for _, b in outputs]
        if not self.combine_out_splits:
            return values, biases
        bias = torch.cat(biases, dim=-1) if all(b is not None for b in biases) else None
        return torch.cat(values, dim=-1), bias
