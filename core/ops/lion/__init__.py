"""Lion for DeepSpeed (`deepspeed.ops.lion`): the multi-tensor FusedLion and ZeRO-Offload's
DeepSpeedCPULion."""
from deepspeed.ops.lion.cpu_lion import DeepSpeedCPULion
from deepspeed.ops.lion.fused_lion import FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
