"""Compression-aware layers: ``LinearLayer_Compress``, ``Conv2dLayer_Compress``,
``Embedding_Compress`` and ``BNLayer_Compress``, DeepSpeed's names.

Each is a subclass of its torch layer (same parameters, same state-dict keys) plus
``CompressionState``: the techniques ``init_compression`` assigned to it, each switched on when
the schedule reaches its offset (``update_schedule(step)``). The forward pass applies the active
ones to the weight before the usual op: sparse, row, head or channel masks, then weight
quantization (in forward, with a straight-through gradient), and quantizes the input activations.
``redundancy_clean`` later bakes all of it into plain, smaller torch layers.
"""
import torch
import torch.nn.functional as F

from . import masks as M
from . import snip
from .quantizers import quantize, quantize_activation, quantize_tensor

#: technique -> which layer types may carry it
SUPPORTED = {
    "weight_quantization": ("linear", "conv2d", "embedding"),
    "activation_quantization": ("linear", "conv2d"),
    "sparse_pruning": ("linear", "conv2d"),
    "row_pruning": ("linear",),
    "head_pruning": ("linear",),
    "channel_pruning": ("conv2d",),
}
STATIC_RANGE_MOMENTUM = 0.95


class CompressionState:
    """Mixin: the per-layer plan and state of every technique. ``plan`` maps a technique to its
    settings (offset included); ``active`` holds those already switched on."""

    kind = None

    def _init_compression(self):
        self.plan = {}
        self.active = set()
        self.weight_bits = None

    def add_technique(self, technique, **settings):
        """Assign ``technique`` to this layer. Learnable scores and masks are created now, before
        the engine builds its optimizer, and filled in when the schedule switches them on."""
        if self.kind not in SUPPORTED[technique]:
            raise ValueError(f"{technique} cannot be applied to a {type(self).__name__}")
        self.plan[technique] = settings
        weight, method = self.weight, settings.get("method")
        if technique == "sparse_pruning":
            if method == "topk":
                self.sparse_mask_scores = torch.nn.Parameter(weight.detach().abs().clone())
            else:
                self.register_buffer("sparse_pruning_mask", torch.ones_like(weight))
            if method == "snip_momentum":
                self.register_buffer("snip_scores", torch.zeros_like(weight))
        elif technique in ("row_pruning", "channel_pruning"):
            scores = M.row_scores(weight)
            if method == "topk":
                self.row_mask_scores = torch.nn.Parameter(scores.clone())
            else:
                self.register_buffer("row_pruning_mask", torch.ones_like(scores))
        elif technique == "head_pruning":
            self.head_mask_scores = torch.nn.Parameter(M.head_scores(weight, settings["num_heads"]))
        elif technique == "activation_quantization" and settings["range_calibration"] == "static":
            self.register_buffer("activation_range", torch.zeros(2, device=weight.device))
            self.register_buffer("activation_range_seen", torch.zeros((), device=weight.device))

    # ------------------------------------------------------------------ schedule
    def update_schedule(self, step):
        """Switch on the techniques whose offset ``step`` reached and set this step's bits."""
        for technique, cfg in self.plan.items():
            if step < cfg["schedule_offset"]:
                continue
            if technique not in self.active:
                self.active.add(technique)
                self._enable(technique, cfg)
            if technique == "sparse_pruning" and cfg["method"] == "snip_momentum":
                self._snip_prune(step, cfg)
            if technique == "weight_quantization":
                done = (step - cfg["schedule_offset"]) // cfg["quantization_period"]
                self.weight_bits = max(cfg["target_bits"], cfg["start_bits"] - done)

    def _enable(self, technique, cfg):
        """Fill in the masks / scores from the weights as they are when the technique starts."""
        weight = self.weight.detach()
        with torch.no_grad():
            if technique == "sparse_pruning":
                if hasattr(self, "sparse_mask_scores"):
                    self.sparse_mask_scores.copy_(weight.abs())
                elif cfg["method"] == "snip_momentum":
                    pass  # its mask comes from the scores training gathers (_snip_prune)
                else:
                    self.sparse_pruning_mask.copy_(M.topk_mask(weight.abs(), cfg["dense_ratio"]))
            elif technique in ("row_pruning", "channel_pruning"):
                if hasattr(self, "row_mask_scores"):
                    self.row_mask_scores.copy_(M.row_scores(weight))
                else:
                    self.row_pruning_mask.copy_(M.topk_mask(M.row_scores(weight),
                                                            cfg["dense_ratio"]))
            elif technique == "head_pruning":
                self.head_mask_scores.copy_(M.head_scores(weight, cfg["num_heads"]))

    @torch.no_grad()
    def _snip_prune(self, step, cfg):
        ratio = snip.target_ratio(step, cfg)
        if ratio is None or not self.snip_scores.any():
            return
        self.sparse_pruning_mask.copy_(snip.block_mask(self.snip_scores, cfg["block_pattern"],
                                                       ratio, type(self).__name__))

    def _gather_snip_scores(self, effective_weight):
        """On training forwards, fold ``|w · grad|`` into the momentum scores when autograd
        reaches the weight this forward computed with."""
        if not (self.training and effective_weight.requires_grad
                and "sparse_pruning" in self.active and hasattr(self, "snip_scores")):
            return
        weight = self.weight.detach()

        def update(grad):
            with torch.no_grad():
                self.snip_scores.mul_(snip.SCORE_MOMENTUM).add_(
                    (1 - snip.SCORE_MOMENTUM) * (weight * grad).abs())
        effective_weight.register_hook(update)

    # ------------------------------------------------------------------ masks
    def row_mask(self):
        """(out,) mask of kept output rows / channels, or None."""
        for technique in ("row_pruning", "channel_pruning"):
            if technique in self.active:
                if hasattr(self, "row_mask_scores"):
                    return M.TopKMask.apply(self.row_mask_scores, self.plan[technique]["dense_ratio"])
                return self.row_pruning_mask
        return None

    def column_mask(self):
        """(in_features,) mask of kept input columns from head pruning, or None."""
        if "head_pruning" not in self.active:
            return None
        heads = M.TopKMask.apply(self.head_mask_scores, self.plan["head_pruning"]["dense_ratio"])
        return M.expand_heads(heads, self.weight.shape[1])

    def sparse_mask(self):
        if "sparse_pruning" not in self.active:
            return None
        if hasattr(self, "sparse_mask_scores"):
            return M.TopKMask.apply(self.sparse_mask_scores,
                                    self.plan["sparse_pruning"]["dense_ratio"])
        return self.sparse_pruning_mask

    def masked_weight_and_bias(self):
        weight, bias = self.weight, getattr(self, "bias", None)
        dtype = weight.dtype  # masks stay in the weight's precision (bf16/fp16 engines)
        sparse = self.sparse_mask()
        if sparse is not None:
            weight = weight * sparse.to(dtype)
            self._gather_snip_scores(weight)
        rows = self.row_mask()
        if rows is not None:
            rows = rows.to(dtype)
            weight = weight * rows.reshape(-1, *([1] * (weight.dim() - 1)))
            bias = bias * rows if bias is not None else None
        columns = self.column_mask()
        if columns is not None:
            weight = weight * columns.to(dtype).reshape(1, -1)
        return weight, bias

    def weight_quantizing_in_forward(self):
        cfg = self.plan.get("weight_quantization")
        return ("weight_quantization" in self.active and cfg["in_forward"]
                and self.weight_bits is not None and self.weight_bits < 16)

    def effective_weight_and_bias(self):
        """The weight and bias this layer computes with now (masked, then quantized)."""
        weight, bias = self.masked_weight_and_bias()
        if self.weight_quantizing_in_forward():
            cfg = self.plan["weight_quantization"]
            weight = quantize(weight, self.weight_bits, cfg["num_groups"],
                              cfg["quantization_type"], cfg["rounding"])
        return weight, bias

    def quantize_weight_in_place(self):
        """Quantization outside forward (DeepSpeed's fp16 path): the stored weight itself is put
        on the grid after every optimizer step, as MoQ does."""
        cfg = self.plan.get("weight_quantization")
        if cfg is None or cfg["in_forward"] or "weight_quantization" not in self.active \
                or self.weight_bits is None or self.weight_bits >= 16:
            return
        with torch.no_grad():
            self.weight.copy_(quantize_tensor(self.weight, self.weight_bits, cfg["num_groups"],
                                              cfg["quantization_type"], cfg["rounding"]))

    def zero_pruned_weights(self):
        """Keep fixed-mask pruned weights at exactly zero in the stored parameter too (optimizer
        momentum or weight decay would otherwise move them while the mask hides them)."""
        with torch.no_grad():
            if hasattr(self, "sparse_pruning_mask") and "sparse_pruning" in self.active:
                self.weight.mul_(self.sparse_pruning_mask)
            if hasattr(self, "row_pruning_mask") and self.active & {"row_pruning",
                                                                    "channel_pruning"}:
                self.weight.mul_(self.row_pruning_mask.reshape(-1, *([1] * (self.weight.dim() - 1))))
                if getattr(self, "bias", None) is not None:
                    self.bias.mul_(self.row_pruning_mask)

    # ------------------------------------------------------------------ activations
    def quantize_input(self, x):
        if "activation_quantization" not in self.active:
            return x
        cfg = self.plan["activation_quantization"]
        if cfg["range_calibration"] == "dynamic":
            return quantize_activation(x, cfg["bits"], cfg["quantization_type"])
        if self.training:
            low, high = x.detach().min(), x.detach().max()
            with torch.no_grad():
                if self.activation_range_seen.item() == 0:
                    self.activation_range.copy_(torch.stack([low, high]))
                    self.activation_range_seen.fill_(1)
                else:
                    m = STATIC_RANGE_MOMENTUM
                    self.activation_range.mul_(m).add_((1 - m) * torch.stack([low, high]))
        low, high = self.activation_range
        return quantize_activation(x, cfg["bits"], cfg["quantization_type"], (low, high))


def _copy_into(new, old):
    new.load_state_dict(old.state_dict())
    new.train(old.training)
    return new.to(old.weight.device)


class LinearLayer_Compress(CompressionState, torch.nn.Linear):
    kind = "linear"

    @classmethod
    def from_module(cls, linear):
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  dtype=linear.weight.dtype)
        new._init_compression()
        return _copy_into(new, linear)

    def forward(self, x):
        weight, bias = self.effective_weight_and_bias()
        return F.linear(self.quantize_input(x), weight, bias)


class Conv2dLayer_Compress(CompressionState, torch.nn.Conv2d):
    kind = "conv2d"

    @classmethod
    def from_module(cls, conv):
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                  bias=conv.bias is not None, padding_mode=conv.padding_mode,
                  dtype=conv.weight.dtype)
        new._init_compression()
        return _copy_into(new, conv)

    def forward(self, x):
        weight, bias = self.effective_weight_and_bias()
        return self._conv_forward(self.quantize_input(x), weight, bias)


class Embedding_Compress(CompressionState, torch.nn.Embedding):
    kind = "embedding"

    @classmethod
    def from_module(cls, emb):
        new = cls(emb.num_embeddings, emb.embedding_dim, padding_idx=emb.padding_idx,
                  max_norm=emb.max_norm, norm_type=emb.norm_type,
                  scale_grad_by_freq=emb.scale_grad_by_freq, sparse=emb.sparse,
                  dtype=emb.weight.dtype)
        new._init_compression()
        return _copy_into(new, emb)

    def forward(self, ids):
        weight, _ = self.effective_weight_and_bias()
        return F.embedding(ids, weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)


class BNLayer_Compress(torch.nn.BatchNorm2d):
    """A BatchNorm2d that channel pruning shrinks along with the conv before it (DeepSpeed's
    name; it carries no technique of its own)."""

    @classmethod
    def from_module(cls, bn):
        new = cls(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                  track_running_stats=bn.track_running_stats)
        new.load_state_dict(bn.state_dict())
        new.train(bn.training)
        return new.to(bn.weight.device if bn.weight is not None else "cpu")


def compress_class_for(module):
    """The compression-aware class for a torch layer, or None."""
    if isinstance(module, CompressionState):
        return type(module)
    if isinstance(module, torch.nn.Linear):
        return LinearLayer_Compress
    if isinstance(module, torch.nn.Conv2d):
        return Conv2dLayer_Compress
    if isinstance(module, torch.nn.Embedding):
        return Embedding_Compress
    return None
