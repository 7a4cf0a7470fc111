"""The public pieces of AutoTP training: the TP x DP groups in ``deepspeed.utils.groups``
(layout, getters, registration, bad sizes) on 4 ranks, and the upstream import paths."""
import pytest

from deepspeed.testing import run_distributed


def _groups_layout():
    import torch

    import deepspeed.comm as dist
    from deepspeed.utils import groups

    previous = groups.mpu
    try:
        unit = groups.init_tensor_parallel_groups(2)
        assert groups.init_tensor_parallel_groups(2) is unit  # built once per size and world
        assert groups._init_tp_mesh_device(2, data_parallel_size=2) is unit
        rank = dist.get_rank()
        assert unit.tp_ranks == [rank - rank % 2, rank - rank % 2 + 1]
        assert unit.dp_ranks == [rank % 2, rank % 2 + 2]
        assert groups.get_tensor_model_parallel_world_size() == 2
        assert groups.get_tensor_model_parallel_rank() == rank % 2
        assert groups.get_tensor_model_parallel_src_rank() == rank - rank % 2
        assert groups._get_data_parallel_world_size() == 2
        assert groups._get_data_parallel_rank() == rank // 2
        # the groups really are those ranks: a sum over each equals the sum of its ranks
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=groups.get_tensor_model_parallel_group())
        d = torch.tensor([float(rank)])
        dist.all_reduce(d, group=groups._get_data_parallel_group())
        with pytest.raises(ValueError, match="tensor parallel size 3 does not divide the world "
                                             "size 4"):
            groups.init_tensor_parallel_groups(3)
        with pytest.raises(ValueError, match="data_parallel_size=4 does not match"):
            groups._init_tp_mesh_device(2, data_parallel_size=4)
        return float(t), float(d)
    finally:
        groups.set_mpu(previous)


def test_tp_dp_groups_on_four_ranks():
    got = run_distributed(_groups_layout, world_size=4, timeout=120)
    assert got == [(1.0, 2.0), (1.0, 4.0), (5.0, 2.0), (5.0, 4.0)]


def test_upstream_paths():
    import deepspeed
    from deepspeed.runtime.tensor_parallel import TPTrainingConfig
    from deepspeed.runtime.tensor_parallel.config import TPConfig
    from deepspeed.tensor_parallel.config import TensorParallelTrainingConfig
    from deepspeed.utils.groups import TensorParallelGroups, init_tensor_parallel_groups  # noqa

    assert TPTrainingConfig is TensorParallelTrainingConfig and TPConfig().tp_size == 1
    assert TPTrainingConfig().autotp_size == 0
    assert callable(deepspeed.tp_model_init)


def _all_reduces_per_step():
    import torch

    import deepspeed
    import deepspeed.tensor_parallel.layers as layers
    from tp_train_helpers import registered_groups_restored, tiny_llama

    with registered_groups_restored():
        model = deepspeed.tp_model_init(tiny_llama(), tp_size=2, dtype=torch.float32)
        calls = []
        real = layers.dist.all_reduce

        def counting(tensor, *args, **kwargs):
            calls.append(tuple(tensor.shape))
            return real(tensor, *args, **kwargs)

        layers.dist.all_reduce = counting
        try:
            ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
            loss = model(input_ids=ids, labels=ids).loss
            forward = len(calls)
            loss.backward()
        finally:
            layers.dist.all_reduce = real
        return forward, len(calls) - forward


def test_one_all_reduce_per_region_each_way():
    # 2 layers x (attention + MLP): forward sums o_proj and down_proj; backward all-reduces
    # the input gradient once per region (q/k/v share one, gate/up share one)
    assert run_distributed(_all_reduces_per_step, world_size=2, timeout=120) == [(4, 4)] * 2


def _uneven_gather():
    import torch
    from torch import nn

    from deepspeed.tensor_parallel.gather import full_state_dict
    from deepspeed.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from deepspeed.utils import groups

    previous = groups.mpu
    try:
        unit = groups.init_tensor_parallel_groups(2)
        full_up, full_down = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)), \
            torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
        rows = (0, 3) if unit.tp_rank == 0 else (3, 2)  # 5 rows cut 3 + 2
        model = nn.Sequential(
            ColumnParallelLinear(nn.Parameter(full_up.narrow(0, *rows).clone()), None,
                                 unit.tp_group),
            RowParallelLinear(nn.Parameter(full_down.narrow(1, *rows).clone()), None,
                              unit.tp_group))
        state = full_state_dict(model, unit)
        if state is None:
            return None
        return torch.equal(state["0.weight"], full_up) and torch.equal(state["1.weight"],
                                                                       full_down)
    finally:
        groups.set_mpu(previous)


def test_gather_joins_uneven_slices():
    assert run_distributed(_uneven_gather, world_size=2, timeout=120) == [True, None]
