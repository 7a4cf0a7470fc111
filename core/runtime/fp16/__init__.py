"""Upstream package ``deepspeed.runtime.fp16``: the fp16 optimizer wrapper and loss scalers
under their upstream paths (``fused_optimizer``, ``loss_scaler``); the real homes are in
``deepspeed.precision``. ``deepspeed.runtime.fp16.onebit`` is the onebit plugin's shim."""
