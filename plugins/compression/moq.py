"""Mixture-of-quantization (MoQ, the ``quantize_training`` section): quantization-aware training
whose precision steps down on a schedule.

After every optimizer step from ``schedule_offset`` on, each weight matrix (every parameter of
two or more dimensions) is replaced by its fake-quantized value at the current bits, per group
(``quantize_groups``). Counting steps from the offset, once they reach ``quantize_period`` the
bits drop by one and the period doubles (DeepSpeed's ``q_period <<= 1``), until
``target_bits``: with period 2 the drops come at steps 2, 4, 8, 16. At 2 bits the quantizer is
ternary, at 1 bit binary. With ``fp16_mixed_quantize`` the stored weight is ``r·w + (1-r)·q(w)``,
``r`` starting at 1 after each bit change and falling by ``quantize_change_ratio`` per step.
"""
import torch

from .quantizers import quantize_tensor


class MoQQuantizer:
    def __init__(self, config):
        self.config = config
        self.bits = config.quantize_bits.start_bits
        self.target_bits = config.quantize_bits.target_bits
        self.period = config.quantize_schedule.quantize_period
        self.offset = config.quantize_schedule.schedule_offset
        self.mixed = config.fp16_mixed_quantize
        self.real_ratio = 1.0

    def advance(self, step):
        """Move the schedule to optimizer step ``step``; returns whether weights are quantized
        at this step."""
        if step < self.offset:
            return False
        if self.bits > self.target_bits and step - self.offset >= self.period:
            self.bits -= 1
            self.period <<= 1
            self.real_ratio = 1.0
        elif self.mixed.enabled:
            self.real_ratio = max(0.0, self.real_ratio - self.mixed.quantize_change_ratio)
        return True

    @torch.no_grad()
    def quantize_module(self, module):
        cfg = self.config
        for name, param in module.named_parameters():
            if param.dim() < 2:
                continue
            if param.numel() % cfg.quantize_groups:
                raise ValueError(f"quantize_training.quantize_groups={cfg.quantize_groups} does "
                                 f"not divide the {param.numel()} elements of {name}")
            q = quantize_tensor(param.data, self.bits, cfg.quantize_groups, self.quantize_type,
                                cfg.quantize_algo.rounding)
            if self.mixed.enabled:
                q = self.real_ratio * param.data + (1 - self.real_ratio) * q
            param.data.copy_(q)

    @property
    def quantize_type(self):
        """``quantize-algo.q_type`` (the tutorial's spelling) when given, else
        ``quantize_type``."""
        algo = self.config.quantize_algo
        return algo.q_type if "q_type" in algo.model_fields_set else self.config.quantize_type

    def step(self, module, step):
        if self.advance(step):
            self.quantize_module(module)

    def state_dict(self):
        return {"bits": self.bits, "period": self.period, "real_ratio": self.real_ratio}

    def load_state_dict(self, state):
        self.bits, self.period = int(state["bits"]), int(state["period"])
        self.real_ratio = float(state["real_ratio"])
