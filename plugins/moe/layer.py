"""``deepspeed.moe.layer.MoE``: a mixture-of-experts block that replaces a dense MLP.

The layer owns its process groups: with ``ep_size > 1`` it builds (once per size, as the
expert dimensions of the topology: ``deepspeed.moe.groups``) the expert-parallel group its
tokens are exchanged over and the expert-data-parallel group its experts' gradients are
averaged over, and tags every expert parameter with the latter (``deepspeed.hooks.GRADIENT_GROUP``) so the engine reduces expert
gradients there and dense gradients over the whole data-parallel group. Building a group is
collective, so it happens in ``__init__`` when the distributed backend is up (every rank
builds the same layers in the same order), else at the first forward; the engine needs
nothing from the layer beyond the tags.

With tensor parallelism (a registered mpu, ``deepspeed.initialize(mpu=...)``) the groups are
laid out over the data-parallel ranks of each tensor-parallel slice (even at ``ep_size`` 1).
``enable_expert_tensor_parallelism=False``: the experts are replicated over the
tensor-parallel ranks, each runs its ``1/tp`` slice of the slots (``deepspeed.moe.mappings``),
so their gradients are summed over every tensor-parallel rank's copies too, and they are
marked ``tensor_model_parallel = False``. ``True``: the expert given is itself tensor parallel
(e.g. column- then row-parallel linear), every rank runs all slots through its pieces, and
the parameters keep the expert's own tensor-parallel marks; those marked
``tensor_model_parallel`` declare their piece (``partition_dim``, default 0) as
``deepspeed.hooks.UNIVERSAL_CHECKPOINT_SLICE``, so ``ds_to_universal`` joins the pieces.
"""
import copy

import torch
from torch import nn

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import GRADIENT_GROUP, GRADIENT_NORM_GROUP, UNIVERSAL_CHECKPOINT_SLICE
from deepspeed.moe import groups as moe_groups
from deepspeed.moe.experts import Experts
from deepspeed.moe.groups import ensure_expert_groups
from deepspeed.moe.sharded_moe import MOELayer, TopKGate, check_noisy_gate_policy


def _check_arguments(hidden_size, num_experts, ep_size, k):
    for name, value in (("hidden_size", hidden_size), ("num_experts", num_experts),
                        ("ep_size", ep_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            hint = (" (a PR-MoE pyramid gives each MoE layer its own int)"
                    if name == "num_experts" and isinstance(value, (list, tuple)) else "")
            raise TypeError(f"MoE {name} must be a positive int, got {value!r}{hint}")
    if num_experts % ep_size != 0:
        raise AssertionError(f"Number of experts ({num_experts}) should be divisible by expert "
                             f"parallel size ({ep_size})")
    if k not in (1, 2):
        raise ValueError("Only top-1 and top-2 gatings are supported.")


class MoE(nn.Module):
    """Initialize an MoE layer: ``num_experts`` copies of ``expert`` split over ``ep_size``
    ranks, a top-``k`` gate, and with ``use_residual`` a dense copy of ``expert`` mixed in by
    a learned ``coefficient = Linear(hidden_size, 2)`` (Residual-MoE, arXiv 2201.05596).
    ``forward(hidden_states, used_token=None)`` returns ``(output, l_aux, exp_counts)``."""

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False,
                 noisy_gate_policy=None, drop_tokens=True, use_rts=True, use_tutel=False,
                 enable_expert_tensor_parallelism=False, top2_2nd_expert_sampling=True):
        super().__init__()
        _check_arguments(hidden_size, num_experts, ep_size, k)
        check_noisy_gate_policy(noisy_gate_policy)
        self.hidden_size = hidden_size
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        self.k = k
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor,
                        min_capacity, noisy_gate_policy, drop_tokens, use_rts, None,
                        top2_2nd_expert_sampling)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size,
                                      self.num_local_experts, use_tutel=use_tutel)
        if self.use_residual:
            self.mlp = copy.deepcopy(expert)
            self.coefficient = nn.Linear(hidden_size, 2)
        self._groups_ready, self._groups_unit, self._groups_world = False, None, None
        if dist.is_initialized():
            self.set_deepspeed_parallelism()

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """Build (or reuse) this layer's process groups and tag the expert parameters.
        Collective when the groups do not exist yet: call it on every rank. Done again when
        the current topology answers from another model-parallel unit than the one the groups
        were laid out under (``deepspeed.initialize(mpu=...)`` after the model was built)."""
        topo = topology.current()
        if self._groups_ready and self._groups_unit is topo.unit \
                and self._groups_world is topo.world_group:
            return
        tp = topo.size(moe_groups.tensor_dim(topo))
        experts = self.deepspeed_moe.experts
        if self.ep_size == 1 and tp == 1:  # the experts are replicated like any dense weight
            self.deepspeed_moe._set_tp_group(None, 1)
            for param in experts.parameters():
                for attr in (GRADIENT_GROUP, GRADIENT_NORM_GROUP):
                    if hasattr(param, attr):
                        delattr(param, attr)
            self._remember(topo)
            return
        what = (f"MoE ep_size={self.ep_size}" if tp == 1 else
                f"MoE ep_size={self.ep_size} with tensor parallelism (model-parallel size {tp})")
        if not dist.is_initialized():
            raise RuntimeError(f"{what} needs the distributed backend: call "
                               f"deepspeed.init_distributed() before building or running it")
        dp = topo.size("data")
        if dp % self.ep_size != 0:
            where = "world size" if dp == dist.get_world_size() else "data-parallel world size"
            raise ValueError(f"MoE ep_size={self.ep_size} must divide the {where} {dp}")
        ensure_expert_groups(self.ep_size, use_data_before_expert_parallel_)
        name = self.expert_group_name
        self.deepspeed_moe._set_ep_group(moe_groups._get_expert_parallel_group(name))
        if tp > 1 and not self.enable_expert_tensor_parallelism:
            # replicated over the TP ranks, each running its slice of the slots: the gradient
            # sums every TP rank's slice; the ranks with other experts are this slice's
            self.deepspeed_moe._set_tp_group(topo.group(moe_groups.tensor_dim(topo)), tp)
            gradient_group = moe_groups._get_expert_replica_group(name)
            norm_group = moe_groups._get_expert_parallel_group(name)
        else:
            # tensor-parallel experts (or none): each TP rank its own pieces, all slots
            self.deepspeed_moe._set_tp_group(None, 1)
            gradient_group = moe_groups._get_expert_data_parallel_group(name)
            norm_group = moe_groups._get_expert_model_parallel_group(name)
        tp_rank = topo.rank(moe_groups.tensor_dim(topo)) if tp > 1 else 0
        for param in experts.parameters():
            setattr(param, GRADIENT_GROUP, gradient_group)  # summed over the same expert's copies
            setattr(param, GRADIENT_NORM_GROUP, norm_group)  # norm: over the other experts'
            if tp > 1 and not self.enable_expert_tensor_parallelism:
                param.tensor_model_parallel = False  # Megatron's mark: a replicated weight
            elif tp > 1 and getattr(param, "tensor_model_parallel", False) and \
                    not hasattr(param, UNIVERSAL_CHECKPOINT_SLICE):
                # a tensor-parallel expert's piece (Megatron's marks), for universal checkpoints
                setattr(param, UNIVERSAL_CHECKPOINT_SLICE,
                        (int(getattr(param, "partition_dim", 0)), tp, tp_rank))
        self._remember(topo)

    def _remember(self, topo):
        """The unit and world the groups were set up for (another of either: set up again)."""
        self._groups_ready, self._groups_unit, self._groups_world = True, topo.unit, \
            topo.world_group

    def expert_parallel_rank(self):
        """This rank's index in the layer's expert-parallel group (0 with ``ep_size`` 1): its
        local experts are the experts ``rank * num_local_experts`` onwards of the model."""
        if self.ep_size == 1:
            return 0
        return moe_groups._get_expert_parallel_rank(self.expert_group_name)

    # upstream's private name, called by Megatron-DeepSpeed
    _create_process_groups = set_deepspeed_parallelism

    def forward(self, hidden_states, used_token=None):
        """Returns ``(output, l_aux, exp_counts)``: the output has the input's shape, ``l_aux``
        is the scalar load-balancing loss (add it, scaled, to the training loss) and
        ``exp_counts`` the tokens routed to each expert before capacity dropping."""
        if hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"MoE hidden_size is {self.hidden_size} but the input's last "
                             f"dimension is {hidden_states.shape[-1]} (shape "
                             f"{tuple(hidden_states.shape)})")
        self.set_deepspeed_parallelism()
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]
            coef = torch.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
