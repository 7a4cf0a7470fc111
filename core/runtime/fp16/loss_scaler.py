"""`deepspeed.runtime.fp16.loss_scaler` -> `deepspeed.precision.loss_scaler`."""
from deepspeed.precision.loss_scaler import DynamicLossScaler, LossScaler

__all__ = ["LossScaler", "DynamicLossScaler"]
