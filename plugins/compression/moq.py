"""Mixture-of-quantization (MoQ, the ``quantize_training`` section): quantization-aware training
whose precision steps down on a schedule.

After every optimizer step from ``schedule_offset`` on, each weight matrix (every parameter of
two or more dimensions) is replaced by its fake-quantized value at the current bits, per group
(``quantize_groups``). Counting steps from the offset, once they reach ``quantize_period`` the
bits drop by one and the period doubles (DeepSpeed's ``q_period <<= 1``), until
``target_bits``: with period 2 the drops come at steps 2, 4, 8, 16. At 2 bits the quantizer is
ternary, at 1 bit binary. With ``fp16_mixed_quantize`` the stored weight is ``r·w + (1-r)·q(w)``,
``r`` starting at 1 after each bit change and falling by ``quantize_change_ratio`` per step.
With ``eigenvalue.enabled`` the layers it names keep schedules of their own, whose period also
grows by the layer's eigenvalue factor at each drop (``eigenvalue.py``).
"""
import torch

from .quantizers import quantize_tensor


class _Schedule:
    """The bits, period and fp16 blend ratio of one group of weights."""

    def __init__(self, bits, period):
        self.bits, self.period, self.real_ratio = bits, period, 1.0

    def advance(self, step, offset, target_bits, mixed, stretch=1):
        if self.bits > target_bits and step - offset >= self.period:
            self.bits -= 1
            self.period = (self.period << 1) * stretch
            self.real_ratio = 1.0
        elif mixed.enabled:
            self.real_ratio = max(0.0, self.real_ratio - mixed.quantize_change_ratio)

    def state(self):
        return {"bits": self.bits, "period": self.period, "real_ratio": self.real_ratio}

    def load(self, state):
        self.bits, self.period = int(state["bits"]), int(state["period"])
        self.real_ratio = float(state["real_ratio"])


class MoQQuantizer:
    """The plain schedule for every weight matrix, and with ``eigenvalue.enabled`` one schedule
    per sensitive layer (``layers``: their qualified names) whose period grows at each bit drop
    by the layer's factor (``set_eigenvalues``, see ``eigenvalue.py``)."""

    def __init__(self, config, layers=()):
        self.config = config
        start, period = config.quantize_bits.start_bits, config.quantize_schedule.quantize_period
        self.plain = _Schedule(start, period)
        self.layers = {name: _Schedule(start, period) for name in layers}
        self.factors = dict.fromkeys(self.layers, 1)
        self.target_bits = config.quantize_bits.target_bits
        self.offset = config.quantize_schedule.schedule_offset
        self.mixed = config.fp16_mixed_quantize

    # the plain schedule's state, as upstream's quantizer exposes it
    bits = property(lambda self: self.plain.bits)
    period = property(lambda self: self.plain.period)
    real_ratio = property(lambda self: self.plain.real_ratio)

    def set_eigenvalues(self, factors):
        """``{layer: period factor}`` from the latest eigenvalues."""
        self.factors.update(factors)

    def advance(self, step):
        """Move the schedules to optimizer step ``step``; returns whether weights are quantized
        at this step."""
        if step < self.offset:
            return False
        self.plain.advance(step, self.offset, self.target_bits, self.mixed)
        for name, schedule in self.layers.items():
            schedule.advance(step, self.offset, self.target_bits, self.mixed, self.factors[name])
        return True

    def schedule_of(self, param_name):
        """The schedule of the layer holding ``param_name``, else the plain one."""
        for name, schedule in self.layers.items():
            if param_name.startswith(name + "."):
                return schedule
        return self.plain

    @torch.no_grad()
    def quantize_module(self, module):
        cfg = self.config
        for name, param in module.named_parameters():
            if param.dim() < 2:
                continue
            if param.numel() % cfg.quantize_groups:
                raise ValueError(f"quantize_training.quantize_groups={cfg.quantize_groups} does "
                                 f"not divide the {param.numel()} elements of {name}")
            schedule = self.schedule_of(name)
            q = quantize_tensor(param.data, schedule.bits, cfg.quantize_groups,
                                self.quantize_type, cfg.quantize_algo.rounding)
            if self.mixed.enabled:
                q = schedule.real_ratio * param.data + (1 - schedule.real_ratio) * q
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
        state = self.plain.state()
        if self.layers:
            state["layers"] = {name: sched.state() for name, sched in self.layers.items()}
            state["factors"] = dict(self.factors)
        return state

    def load_state_dict(self, state):
        self.plain.load(state)
        for name, saved in state.get("layers", {}).items():
            if name in self.layers:
                self.layers[name].load(saved)
        self.factors.update({name: int(value) for name, value in state.get("factors", {}).items()
                             if name in self.layers})
