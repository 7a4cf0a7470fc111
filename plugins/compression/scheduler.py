"""The compression schedule: what every compressed layer does at a given optimizer step.

``init_compression`` applies step 0 (techniques with ``schedule_offset`` 0 start at once); the
engine applies ``engine.global_steps`` after every optimizer step through this plugin's
``deepspeed_after_step``. Called by hand (``compression_scheduler(model).step(n)``) it drives a
training loop that has no engine.
"""
import torch

from .basic_layer import CompressionState


def compressed_layers(model):
    return [m for m in model.modules() if isinstance(m, CompressionState)]


class compression_scheduler:  # DeepSpeed's name
    """Advances every compressed layer of ``model`` to step ``n``: switches on the techniques
    whose offset is reached, sets the weight bits, and (for fixed masks and quantization outside
    forward) rewrites the stored weights."""

    def __init__(self, model):
        self.layers = compressed_layers(model)
        self.training_steps = 0

    def step(self, step=None):
        self.training_steps = self.training_steps + 1 if step is None else int(step)
        for layer in self.layers:
            apply_step(layer, self.training_steps)

    def weight_bits(self):
        return {id(layer): layer.weight_bits for layer in self.layers}


@torch.no_grad()
def apply_step(layer, step):
    layer.update_schedule(step)
    layer.quantize_weight_in_place()
    layer.zero_pruned_weights()
