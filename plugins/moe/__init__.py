"""``deepspeed.moe``: mixture of experts. ``deepspeed.moe.layer.MoE`` is the layer; the gate and
the token exchange are in ``sharded_moe`` (routing arithmetic in ``gating``), the experts
container in ``experts``, the optimizer helpers in ``utils`` and the engine-side checks in
``plugin``."""
