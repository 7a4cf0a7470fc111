"""PipelineModule, LayerSpec and TiedLayerSpec: partitioning, lazy building, tied weights,
activation checkpointing and the per-layer checkpoint files (api-part1.md §8)."""
import functools
import os

import pytest
import torch
from torch import nn

from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.pipe.layers import count_layer_params, partition_layers
from deepspeed.pipe.topology import PipeDataParallelTopology
from deepspeed.pipe.partitioning import partition_balanced


class CountingLinear(nn.Linear):
    """Counts the constructions that allocate real memory (meta builds are free)."""
    built = 0
    forwards = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.weight.device.type != "meta":
            type(self).built += 1

    def forward(self, x):
        type(self).forwards += 1
        return super().forward(x)


@pytest.fixture(autouse=True)
def _reset_counters():
    CountingLinear.built = CountingLinear.forwards = 0


def _mlp_specs():
    return [LayerSpec(nn.Linear, 4, 8), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 8, 8),
            LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 2)]


# ---------------------------------------------------------------------------- single process
def test_sequential_parity_with_num_stages_1():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 2))
    pipe = PipelineModule(layers=net, num_stages=1)
    x = torch.randn(3, 4)
    torch.testing.assert_close(pipe(x), net(x), rtol=0, atol=0)
    assert pipe.stage_id == 0 and pipe.num_stages == 1 and pipe.parts == [0, 4]
    assert pipe.topology().get_dim("pipe") == 1
    assert pipe.get_additional_losses() is None
    assert len(list(pipe.parameters())) == 6


def test_layer_specs_and_callables_match_the_same_seeded_sequential():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    torch.manual_seed(0)  # the 'parameters' partition counts on the meta device: no RNG use
    pipe = PipelineModule(_mlp_specs()[:3] + [torch.tanh, LayerSpec(nn.Linear, 8, 2)],
                          num_stages=1, loss_fn=nn.MSELoss())
    x = torch.randn(5, 4)
    torch.testing.assert_close(pipe(x), ref(x), rtol=0, atol=0)
    assert isinstance(pipe.loss_fn, nn.MSELoss)
    assert [k for k in pipe.state_dict()] == ["0.weight", "0.bias", "2.weight", "2.bias",
                                              "4.weight", "4.bias"]


def test_layer_spec_build_and_errors():
    layer = LayerSpec(nn.Linear, 4, 8, bias=False).build()
    assert isinstance(layer, nn.Linear) and layer.bias is None
    assert (layer.in_features, layer.out_features) == (4, 8)
    assert "Linear(4, 8, bias=False)" in repr(LayerSpec(nn.Linear, 4, 8, bias=False))
    with pytest.raises(RuntimeError, match="int"):
        LayerSpec(int)
    with pytest.raises(RuntimeError, match="relu"):
        LayerSpec(torch.relu)
    spec = TiedLayerSpec("emb", nn.Embedding, 10, 4, tied_weight_attr="weight")
    assert spec.key == "emb" and spec.tied_weight_attr == ["weight"] and spec.forward_fn is None
    assert TiedLayerSpec("e", nn.Linear, 2, 2).tied_weight_attr == ["weight"]


def test_layer_spec_is_built_lazily():
    specs = [LayerSpec(CountingLinear, 4, 4) for _ in range(3)]
    assert CountingLinear.built == 0
    PipelineModule(specs, num_stages=1)
    assert CountingLinear.built == 3


def test_partition_uniform_parameters_and_type():
    layers = [nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU()]
    assert partition_layers(layers, 2, "uniform") == [0, 2, 4]
    parts = partition_layers(layers, 2, "type:linear")
    assert [sum(isinstance(m, nn.Linear) for m in layers[parts[s]:parts[s + 1]])
            for s in range(2)] == [1, 1]
    assert partition_layers(layers, 2, "type:LIN") == parts  # case-insensitive

    sizes = [LayerSpec(nn.Linear, 16, 16), nn.Linear(4, 4), LayerSpec(nn.Linear, 8, 8), torch.relu,
             LayerSpec(CountingLinear, 8, 2)]
    counts = count_layer_params(sizes)
    assert counts == [272, 20, 72, 0, 18]
    assert CountingLinear.built == 0  # counted on the meta device
    assert partition_layers(sizes, 2, "parameters") == partition_balanced(counts, 2)
    assert partition_layers(sizes, 3) == partition_balanced(counts, 3)
    frozen = nn.Linear(4, 4).requires_grad_(False)
    assert count_layer_params([frozen, nn.Linear(2, 2)]) == [0, 6]


def test_partition_errors():
    layers = [nn.Linear(4, 4), nn.ReLU()]
    with pytest.raises(RuntimeError, match="conv"):
        partition_layers(layers, 2, "type:conv")
    for method in ("profile", "bogus"):
        with pytest.raises(NotImplementedError, match=method) as info:
            partition_layers(layers, 2, method)
        assert "uniform" in str(info.value) and "parameters" in str(info.value)
    with pytest.raises(NotImplementedError, match="profile"):
        PipelineModule(layers, num_stages=1, partition_method="profile")


def test_construction_errors():
    with pytest.raises(RuntimeError, match="must provide num_stages or topology"):
        PipelineModule([nn.Linear(2, 2)]).apply_pipeline_config()  # nor pipeline.stages
    with pytest.raises(RuntimeError, match=r"num_stages \(2\).*world size \(1\)"):
        PipelineModule([nn.Linear(2, 2)], num_stages=2)
    with pytest.raises(RuntimeError, match=r"\(2\).*\(1\)"):
        PipelineModule([nn.Linear(2, 2)], topology=PipeDataParallelTopology(1, 2))
    inner = PipelineModule([nn.Linear(2, 2)], num_stages=1)
    with pytest.raises(NotImplementedError):
        PipelineModule([inner], num_stages=1)
    with pytest.raises(AssertionError, match="list"):
        PipelineModule([nn.Linear(2, 2)], num_stages=1, checkpointable_layers=("Linear", ))
    with pytest.raises(TypeError, match="neither"):
        PipelineModule([nn.Linear(2, 2), 3], num_stages=1)
    with pytest.raises(AssertionError):
        inner.stage_owner(1)
    with pytest.raises(RuntimeError, match="init_distributed"):
        inner.mpu()


def test_topology_argument_single_stage():
    pipe = PipelineModule(_mlp_specs(), topology=PipeDataParallelTopology(1, 1),
                          partition_method="uniform")
    assert pipe.num_stages == 1 and pipe.parts == [0, 5]
    assert pipe.ckpt_layer_path("/d", 3) == os.path.join("/d", "layer_03-model_states.pt")
    assert pipe.ckpt_prefix("/c", "tag") == os.path.join("/c", "tag", "module-pipe_00")


def test_seed_layers():
    seeds = []
    pipe = PipelineModule([LayerSpec(nn.Linear, 3, 3), LayerSpec(nn.Linear, 3, 3)], num_stages=1,
                          seed_layers=True, base_seed=100)
    for idx in range(2):
        torch.manual_seed(100 + idx)
        torch.testing.assert_close(pipe.forward_funcs[idx].weight, nn.Linear(3, 3).weight)
    PipelineModule([LayerSpec(nn.Linear, 3, 3), nn.ReLU(), LayerSpec(nn.Linear, 3, 3)],
                   num_stages=1, seed_layers=True, base_seed=7,
                   seed_fn=lambda s: (seeds.append(s), torch.manual_seed(s)))
    assert seeds[:3] == [7, 8, 9]


def test_tied_layers_share_one_module_on_a_stage():
    layers = [TiedLayerSpec("emb", nn.Embedding, 10, 4), nn.Linear(4, 4),
              TiedLayerSpec("emb", nn.Embedding, 10, 4, forward_fn=lambda m, x: x @ m.weight.t())]
    pipe = PipelineModule(layers, num_stages=1)
    assert list(pipe.tied_modules.keys()) == ["emb"] and pipe.tied_comms == {}
    out = pipe(torch.tensor([[1, 2]]))
    assert out.shape == (1, 2, 10)
    # single stage: nothing to reduce
    out.sum().backward()
    pipe.allreduce_tied_weight_gradients()
    assert pipe.get_tied_weights_and_groups() == []


def _checkpointed_model(interval, **kwargs):
    torch.manual_seed(0)
    layers = [CountingLinear(4, 8), nn.ReLU(), CountingLinear(8, 8), nn.Tanh(),
              CountingLinear(8, 1)]
    return PipelineModule(layers, num_stages=1, activation_checkpoint_interval=interval, **kwargs)


def _grads(interval, **kwargs):
    pipe = _checkpointed_model(interval, **kwargs)
    CountingLinear.forwards = 0
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    pipe(x).pow(2).sum().backward()
    return [p.grad.clone() for p in pipe.parameters()], CountingLinear.forwards


def test_activation_checkpointing_recomputes_with_equal_gradients():
    plain, plain_forwards = _grads(0)
    assert plain_forwards == 3
    for interval in (1, 2):
        grads, forwards = _grads(interval)
        assert forwards == 6  # every segment holds a Linear: each runs again in backward
        for got, want in zip(grads, plain):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_checkpointable_layers_and_custom_function():
    calls = []

    def custom(fn, *args):
        calls.append(len(args))
        return fn(*args)

    grads, forwards = _grads(1, activation_checkpoint_func=custom)
    assert calls == [1, 1, 1] and forwards == 3  # only the segments with parameters
    _, forwards = _grads(1, checkpointable_layers=["ReLU"])
    assert forwards == 3  # no Linear segment may be checkpointed
    _, forwards = _grads(1, checkpointable_layers=["CountingLinear"])
    assert forwards == 6


def test_save_excludes_frozen_params(tmp_path):
    pipe = PipelineModule([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)], num_stages=1)
    pipe.forward_funcs[0].bias.requires_grad_(False)
    pipe.save_state_dict(str(tmp_path), exclude_frozen_params=True)
    # every module layer gets a file (ReLU's is empty); plain callables get none
    assert sorted(os.listdir(tmp_path)) == [f"layer_{i:02d}-model_states.pt" for i in range(3)]
    saved = torch.load(tmp_path / "layer_00-model_states.pt", weights_only=True)
    assert list(saved) == ["weight"]
    assert pipe.ckpt_layer_path_list(str(tmp_path), 2) == [
        str(tmp_path / "layer_02-model_states.pt")]
    with pytest.raises(RuntimeError, match="bias"):
        pipe.load_state_dir(str(tmp_path))
    pipe.load_state_dir(str(tmp_path), strict=False)
    with pytest.raises(FileNotFoundError, match="layer_00-model_states.pt"):
        pipe.load_state_dir(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------- two gloo ranks
def _lazy_build_on_two_stages():
    import deepspeed.comm as dist

    CountingLinear.built = 0
    specs = [LayerSpec(CountingLinear, 4, 4) for _ in range(4)]
    pipe = PipelineModule(specs, num_stages=2)  # 'parameters': counted on the meta device
    built = CountingLinear.built
    grid = pipe.mpu()
    assert grid.get_stage_id() == pipe.stage_id == dist.get_rank()
    return {"stage": pipe.stage_id, "parts": pipe.parts, "built": built,
            "local": len(pipe.forward_funcs), "pipe_dim": pipe.topology().get_dim("pipe"),
            "layer_path": pipe.ckpt_layer_path("d", 0), "prefix": pipe.ckpt_prefix("c", "t"),
            "owner": [pipe.stage_owner(i) for i in range(4)]}


def test_each_rank_builds_only_its_layers(dist_pool):
    r0, r1 = dist_pool.run(_lazy_build_on_two_stages)
    assert (r0["stage"], r1["stage"]) == (0, 1)
    assert r0["parts"] == r1["parts"] == [0, 2, 4]
    assert r0["built"] == r1["built"] == 2 and r0["local"] == r1["local"] == 2
    assert r0["pipe_dim"] == 2 and r0["owner"] == [0, 0, 1, 1]
    assert r0["layer_path"] == os.path.join("d", "layer_00-model_states.pt")
    assert r1["layer_path"] == os.path.join("d", "layer_02-model_states.pt")
    assert r1["prefix"] == os.path.join("c", "t", "module-pipe_01")


def _lm_head(module, x):
    return x @ module.weight.t()


def _tied_weights_on_two_stages():
    import deepspeed.comm as dist

    rank = dist.get_rank()
    torch.manual_seed(10 + rank)  # different initial tied weights unless synchronised
    layers = [TiedLayerSpec("emb", nn.Embedding, 6, 4), LayerSpec(nn.Linear, 4, 4),
              LayerSpec(nn.Linear, 4, 4), TiedLayerSpec("emb", nn.Embedding, 6, 4,
                                                        forward_fn=_lm_head)]
    pipe = PipelineModule(layers, num_stages=2, partition_method="uniform")
    comm = pipe.tied_comms["emb"]
    weight = pipe.tied_modules["emb"].weight
    initial = weight.detach().clone()
    inputs = torch.tensor([[0, 1, 2]]) if rank == 0 else torch.randn(1, 3, 4)
    pipe(inputs).pow(2).sum().backward()
    before = weight.grad.clone()
    pipe.allreduce_tied_weight_gradients()
    (tied_weight, group), = pipe.get_tied_weights_and_groups()
    return {"initial": initial, "before": before, "after": weight.grad.clone(),
            "ranks": comm["ranks"], "attr": comm["weight_attr"], "same": tied_weight is weight,
            "group_size": dist.get_world_size(group),
            "replicated": getattr(weight, "ds_pipe_replicated", False)}


def test_tied_weights_start_identical_and_grads_are_summed(dist_pool):
    r0, r1 = dist_pool.run(_tied_weights_on_two_stages)
    torch.testing.assert_close(r0["initial"], r1["initial"], rtol=0, atol=0)
    assert not torch.equal(r0["before"], r1["before"])
    total = r0["before"] + r1["before"]
    torch.testing.assert_close(r0["after"], total, rtol=0, atol=1e-6)
    torch.testing.assert_close(r1["after"], total, rtol=0, atol=1e-6)
    assert r0["ranks"] == r1["ranks"] == [0, 1] and r0["attr"] == ["weight"]
    assert r0["same"] and r0["group_size"] == 2
    assert (r0["replicated"], r1["replicated"]) == (False, True)


def _ckpt_layers():
    return [LayerSpec(nn.Linear, 4, 8), nn.ReLU(), LayerSpec(nn.Linear, 8, 8),
            functools.partial(torch.clamp, min=-0.5), LayerSpec(nn.Linear, 8, 3)]


def _save_on_two_stages(save_dir):
    import deepspeed.comm as dist

    torch.manual_seed(3)
    pipe = PipelineModule(_ckpt_layers(), num_stages=2, partition_method="uniform")
    pipe.save_state_dict(save_dir)
    dist.barrier()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    hidden = pipe(x) if pipe.stage_id == 0 else torch.empty(2, 8)
    dist.broadcast(hidden, src=0)
    return pipe.parts, (pipe(hidden) if pipe.stage_id == 1 else None)


def test_save_on_two_stages_loads_into_one_stage(dist_pool, tmp_path):
    (parts, _), (_, expected) = dist_pool.run(_save_on_two_stages, args=(str(tmp_path), ))
    assert parts == [0, 3, 5]
    assert sorted(os.listdir(tmp_path)) == [f"layer_{i:02d}-model_states.pt" for i in (0, 1, 2, 4)]
    torch.manual_seed(99)  # other weights: only the files can make the outputs agree
    single = PipelineModule(_ckpt_layers(), num_stages=1)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    assert not torch.allclose(single(x), expected)
    single.load_state_dir(str(tmp_path))
    torch.testing.assert_close(single(x), expected, rtol=0, atol=0)
