"""``deepspeed.moe``: mixture of experts. ``deepspeed.moe.layer.MoE`` is the layer; the gate and
the token exchange are in ``sharded_moe`` (routing arithmetic in ``gating``), the experts
container in ``experts``, the expert process groups in ``groups`` (the topology's expert
dimensions), the optimizer helpers in ``utils`` and the engine-side checks in ``plugin``.

Other plugins use this package through the names below only (loaded on first use)."""
from deepspeed.utils.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "MoE": "deepspeed.moe.layer",
    "capacity": "deepspeed.moe.gating",
    "ensure_expert_groups": "deepspeed.moe.groups",
})
__all__ = ["MoE", "capacity", "ensure_expert_groups"]
