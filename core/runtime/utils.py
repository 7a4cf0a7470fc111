"""`deepspeed.runtime.utils`, the path user scripts (Accelerate's ALST example) import from."""
from deepspeed.utils.nested import move_to_device

__all__ = ["move_to_device"]
