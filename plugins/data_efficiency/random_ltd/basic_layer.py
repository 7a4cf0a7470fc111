"""``RandomLayerTokenDrop``: runs the wrapped layer on a random, sorted subset of token positions
and scatters its outputs back, so dropped tokens pass through unchanged and the next layer sees
the full sequence again.

Identity (the plain layer) in eval mode, before the engine configured it, for layers the config
does not list in ``random_ltd_layer_id``, and when the kept length covers the sequence. Every
argument but ``hidden_states`` must be a keyword argument (the documented requirement), so the
mask named ``model_mask_name`` can be found: decoders slice the causal mask to ``[:r, :r]``,
encoders gather its rows and columns at the kept positions.
"""
import torch
from torch import nn


def sample_positions(batch, seq_len, reserved, generator):
    """``(batch, reserved)`` sorted positions, uniform without replacement per sample."""
    scores = torch.rand(batch, seq_len, generator=generator)
    return scores.argsort(dim=1)[:, :reserved].sort(dim=1).values


def _gather_mask(mask, idx, seq_len):
    """Gather the mask's query and key axes (those of length ``seq_len``) at ``idx``."""
    batch, reserved = idx.shape
    if mask.size(0) == 1 and batch > 1:
        mask = mask.expand(batch, *mask.shape[1:])
    for dim in (mask.dim() - 2, mask.dim() - 1):
        if mask.size(dim) != seq_len:
            continue
        shape = [batch] + [1] * (mask.dim() - 1)
        shape[dim] = reserved
        index = idx.view(shape).expand(*[mask.size(d) if d != dim else reserved
                                         for d in range(mask.dim())])
        mask = mask.gather(dim, index.to(mask.device))
    return mask


class RandomLayerTokenDrop(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.random_ltd_layer = layer
        self.scheduler = None
        self.layer_index = None  # position among the converted layers
        self.active = False  # listed in random_ltd_layer_id
        self.last_indices = None  # the kept positions of the last training forward

    def init_config(self, config, scheduler, layer_index):
        self.scheduler = scheduler
        self.layer_index = layer_index
        self.active = layer_index in config.random_ltd_layer_id
        self.mask_name = config.model_mask_name
        self.model_type = config.model_type
        self.batch_first = config.hidden_state_order == "batch_seq_dim"

    def forward(self, hidden_states, *args, **kwargs):
        if args:
            raise TypeError(f"random-LTD wraps {type(self.random_ltd_layer).__name__}, whose "
                            f"forward got {len(args)} positional argument(s) after "
                            f"hidden_states; pass them as keyword arguments")
        if not (self.training and self.active and self.scheduler is not None):
            return self.random_ltd_layer(hidden_states, **kwargs)
        x = hidden_states if self.batch_first else hidden_states.transpose(0, 1)
        batch, seq_len = x.shape[:2]
        reserved = self.scheduler.get_current_seq()
        if reserved >= seq_len:
            self.last_indices = None
            return self.random_ltd_layer(hidden_states, **kwargs)
        idx = sample_positions(batch, seq_len, reserved, self.scheduler.generator).to(x.device)
        self.last_indices = idx
        expand = idx.view(batch, reserved, *([1] * (x.dim() - 2))).expand(
            batch, reserved, *x.shape[2:])
        part = x.gather(1, expand)
        mask = kwargs.get(self.mask_name) if self.mask_name else None
        if torch.is_tensor(mask):
            kwargs[self.mask_name] = (mask[..., :reserved, :reserved]
                                      if self.model_type == "decoder"
                                      else _gather_mask(mask, idx, seq_len))
        out = self.random_ltd_layer(part if self.batch_first else part.transpose(0, 1), **kwargs)
        rest = None
        if isinstance(out, (tuple, list)):
            out, rest = out[0], out[1:]
        out = out if self.batch_first else out.transpose(0, 1)
        merged = x.scatter(1, expand, out)
        merged = merged if self.batch_first else merged.transpose(0, 1)
        return merged if rest is None else (merged, *rest)
