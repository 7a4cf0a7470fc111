"""`deepspeed.utils.groups`, `deepspeed.runtime.utils.move_to_device`, `deepspeed.tp_model_init`:
the small public helpers integrations (Accelerate, Transformers) call by their upstream names."""
import collections

import pytest
import torch


class FakeUnit:
    """A Megatron-style model-parallel unit: model parallel over pairs, data parallel over
    the rest (world 2: one pair, so data parallel is each rank alone)."""

    def __init__(self, dp_group):
        self.dp_group = dp_group

    def get_data_parallel_group(self):
        return self.dp_group

    def get_model_parallel_world_size(self):
        return 2

    def get_model_parallel_rank(self):
        import deepspeed.comm as dist

        return dist.get_rank()

    def get_sequence_parallel_world_size(self):
        return 2


def _groups_answers():
    import deepspeed.comm as dist
    from deepspeed.utils import groups

    out = {"dp": (groups._get_data_parallel_world_size(), groups._get_data_parallel_rank()),
           "sp": (groups._get_sequence_parallel_world_size(),
                  groups._get_sequence_parallel_rank()),
           "mp": (groups._get_model_parallel_world_size(), groups._get_model_parallel_rank()),
           "sdp": groups._get_sequence_data_parallel_world_size()}
    try:
        groups._get_sequence_parallel_group()
    except RuntimeError as exc:
        out["sp_error"] = str(exc)
    rank = dist.get_rank()
    singles = [dist.new_group([r]) for r in range(dist.get_world_size())]
    previous = groups.set_mpu(FakeUnit(singles[rank]))
    try:
        out["with_unit"] = {
            "dp": (groups._get_data_parallel_world_size(), groups._get_data_parallel_rank()),
            "mp": (groups._get_model_parallel_world_size(), groups._get_model_parallel_rank()),
            "sp": groups._get_sequence_parallel_world_size(),
            "src": groups._get_broadcast_src_rank()}
    finally:
        groups.set_mpu(previous)
    out["restored"] = groups.mpu is previous
    return out


def test_groups_without_and_with_a_model_parallel_unit(dist_pool):
    for rank, out in enumerate(dist_pool.run(_groups_answers)):
        assert out["dp"] == (2, rank)  # pure data parallel: the world
        assert out["sp"] == (1, 0) and out["mp"] == (1, 0) and out["sdp"] == 2
        assert "sequence_parallel_size" in out["sp_error"]  # an error, never None (= world)
        assert out["with_unit"] == {"dp": (1, 0), "mp": (2, rank), "sp": 2, "src": rank}
        assert out["restored"]


Pair = collections.namedtuple("Pair", "a b")


def test_move_to_device_keeps_container_types():
    from transformers import BatchEncoding

    from deepspeed.runtime.utils import move_to_device

    batch = {"ids": torch.ones(2), "nested": [torch.zeros(1), (torch.ones(3), "text")],
             "pair": Pair(torch.ones(1), 7), "enc": BatchEncoding({"x": torch.ones(2)})}
    moved = move_to_device(batch, "meta")
    assert moved["ids"].device.type == "meta"
    assert isinstance(moved["nested"], list) and isinstance(moved["nested"][1], tuple)
    assert moved["nested"][1][0].device.type == "meta" and moved["nested"][1][1] == "text"
    assert isinstance(moved["pair"], Pair) and moved["pair"].b == 7
    assert isinstance(moved["enc"], BatchEncoding) and moved["enc"]["x"].device.type == "meta"
    assert batch["ids"].device.type == "cpu"  # the input is not modified
    only_big = move_to_device([torch.ones(1), torch.ones(5)], "meta", lambda t: t.numel() > 1)
    assert [t.device.type for t in only_big] == ["cpu", "meta"]


def test_tp_model_init(monkeypatch):
    import deepspeed
    import deepspeed.api
    from deepspeed.config import DeepSpeedConfigError
    from deepspeed.plugin_manager import PluginCatalog

    model = torch.nn.Linear(2, 2)
    assert deepspeed.tp_model_init(model, tp_size=1, dtype=torch.float32) is model
    # without a plugin answering deepspeed_tp_model_init (the tensor_parallel plugin does)
    monkeypatch.setattr(deepspeed.api, "PluginCatalog", lambda: PluginCatalog(specs={}))
    with pytest.raises(DeepSpeedConfigError, match="'tensor_parallel'.*no installed plugin"):
        deepspeed.tp_model_init(model=model, tp_size=2, dtype=torch.bfloat16, config={})
    with pytest.raises(ValueError, match="tp_size must be a positive integer, got 0"):
        deepspeed.tp_model_init(model, tp_size=0, dtype=torch.float32)


def test_utils_is_initialized_follows_comm():
    import deepspeed
    from deepspeed import comm

    assert deepspeed.utils.is_initialized() == comm.is_initialized()


# every name deepspeed.utils.groups had before the topology, and those the docs name
UPSTREAM_GROUP_NAMES = [
    "set_mpu", "mpu", "initialize", "_get_data_parallel_group", "_get_data_parallel_world_size",
    "_get_data_parallel_rank", "_get_broadcast_src_rank", "_get_model_parallel_group",
    "_get_model_parallel_world_size", "_get_model_parallel_rank",
    "get_tensor_model_parallel_group", "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_rank", "get_tensor_model_parallel_src_rank",
    "TensorParallelGroups", "init_tensor_parallel_groups", "_init_tp_mesh_device",
    "_get_sequence_parallel_group", "_get_sequence_parallel_world_size",
    "_get_sequence_parallel_rank", "_get_sequence_data_parallel_group",
    "_get_sequence_data_parallel_world_size", "_get_sequence_data_parallel_rank",
    "_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP", "_expert_group_name",
    "_expert_layout", "_create_expert_and_data_parallel", "_get_expert_parallel_group",
    "_get_expert_parallel_group_dict", "_get_expert_data_parallel_group",
    "_get_expert_data_parallel_group_dict", "_get_expert_replica_group",
    "_get_expert_model_parallel_group", "_get_expert_parallel_world_size",
    "_get_expert_parallel_rank", "_get_expert_parallel_src_rank",
    "_get_expert_data_parallel_world_size", "_get_expert_data_parallel_rank",
    "_get_expert_data_parallel_src_rank", "_get_max_expert_size", "_get_max_expert_size_name",
    "_get_max_expert_parallel_group"]


def test_every_upstream_group_name_resolves_in_a_fresh_interpreter():
    """The core defines the data / model views; the owning plugins export the rest into the
    module (entry-point group ``deepspeed.exports.utils.groups``), found on first use."""
    import subprocess
    import sys

    code = ("import deepspeed, deepspeed.utils.groups as g, sys\n"
            f"names = {UPSTREAM_GROUP_NAMES!r}\n"
            "missing = [n for n in names if n != 'mpu' and not hasattr(g, n)]\n"
            "print(missing, g.mpu, set(names) - {'mpu'} <= set(dir(g)), "
            "deepspeed.utils.groups is g, g.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")[0]
    assert out == "[] None True True deepspeed.topology.groups"
