"""3-D reshaping through a universal checkpoint (issue 36): a pipeline of Megatron-style
tensor-parallel layers trained at TP2 x PP2 (4 ranks), converted with ``ds_to_universal``, resumes
at TP1 x PP2, at TP2 x PP1 and data-parallel only, and its losses continue those of the run that
was never interrupted (within 1e-5: the tensor-parallel sums add in another order)."""
import os

import pytest
import torch
from torch import nn

from deepspeed.checkpoint import load_file
from deepspeed.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

MICRO, GAS, IN, HIDDEN, OUT = 2, 2, 4, 8, 3
SEED, TAG, LR = 4321, "step2", 1e-2
ADAMW = {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}}


def _tensor_group():
    from deepspeed import topology

    return topology.current().group("pipe.model")  # the grid's tensor (``model``) axis


def _piece_of(linear, split_dim, split_bias):
    """This tensor rank's ``(weight, bias, group)`` of ``linear`` (Megatron's split)."""
    from deepspeed import comm as dist

    group = _tensor_group()
    parts, index = dist.get_world_size(group=group), dist.get_rank(group=group)
    weight = linear.weight.detach().chunk(parts, split_dim)[index]
    bias = linear.bias.detach()
    bias = bias.chunk(parts)[index] if split_bias else bias
    return nn.Parameter(weight.clone()), nn.Parameter(bias.clone()), group


class Column(ColumnParallelLinear):
    def __init__(self, n_in, n_out):
        super().__init__(*_piece_of(nn.Linear(n_in, n_out), 0, True))


class Row(RowParallelLinear):
    def __init__(self, n_in, n_out):
        super().__init__(*_piece_of(nn.Linear(n_in, n_out), 1, False))


def _specs():
    """Two column -> row blocks, a replicated LayerNorm between them; 4 layers per stage at two
    stages. Layer ``i`` is built under seed ``SEED + i``, so every layout starts alike."""
    from deepspeed.pipe import LayerSpec

    return [LayerSpec(Column, IN, HIDDEN), LayerSpec(nn.Tanh), LayerSpec(Row, HIDDEN, IN),
            LayerSpec(nn.LayerNorm, IN), LayerSpec(Column, IN, HIDDEN), LayerSpec(nn.Tanh),
            LayerSpec(Row, HIDDEN, OUT), LayerSpec(nn.Tanh)]


def _mse(outputs, labels):
    return nn.functional.mse_loss(outputs, labels)


def _data(count=4):
    """``count`` global batches of ``GAS`` micro-batches (data-parallel size 1's view)."""
    g = torch.Generator().manual_seed(5)
    return [[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
             for _ in range(GAS)] for _ in range(count)]


def _config(gas, **extra):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, "steps_per_print": 10 ** 6, **extra}


def _pipeline(pp, tp, **extra):
    import deepspeed
    from deepspeed.pipe import PipeModelDataParallelTopology, PipelineModule

    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=1)
    model = PipelineModule(_specs(), topology=topo, loss_fn=_mse, seed_layers=True,
                           base_seed=SEED, partition_method="uniform")
    return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                config=_config(GAS, **extra))[0]


def _train_pipeline(engine, data):
    return [engine.train_batch(iter(batch)).item() for batch in data]


def _source(save_dir, zero):
    """TP2 x PP2: train 2 batches, save, ``ds_to_universal``-ready; then the 2 batches the
    resumed runs must reproduce."""
    extra = {"zero_optimization": {"stage": 1}} if zero else {}
    engine = _pipeline(2, 2, **extra)
    data = _data()
    _train_pipeline(engine, data[:2])
    engine.save_checkpoint(save_dir, tag=TAG)
    losses = _train_pipeline(engine, data[2:])
    engine.destroy()
    return losses


def _resume(universal_dir, layout):
    """Load the universal checkpoint at ``layout`` and train the last 2 batches."""
    import deepspeed

    load = {"checkpoint": {"load_universal": True}}
    if layout == "dp":  # no pipeline, no tensor parallelism: the layers as one nn.Sequential
        from deepspeed import comm as dist

        torch.manual_seed(99)  # other initial weights: all must come from the checkpoint
        model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, IN),
                              nn.LayerNorm(IN), nn.Linear(IN, HIDDEN), nn.Tanh(),
                              nn.Linear(HIDDEN, OUT), nn.Tanh())
        engine = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=_config(GAS // 2, **load,
                                                     zero_optimization={"stage": 1}))[0]
        engine.load_checkpoint(universal_dir, tag=TAG)
        steps, rank, losses = engine.global_steps, dist.get_rank(), []
        for batch in _data()[2:]:  # the global batch: one micro-batch per rank
            x, y = batch[rank]
            loss = _mse(engine(x), y)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / dist.get_world_size())
    else:
        pp, tp = layout
        engine = _pipeline(pp, tp, **load, **({"zero_optimization": {"stage": 1}}
                                               if tp > 1 else {}))
        engine.load_checkpoint(universal_dir, tag=TAG)
        steps = engine.global_steps
        losses = _train_pipeline(engine, _data()[2:])
    engine.destroy()
    return losses, steps


@pytest.fixture(scope="module")
def universal_source(dist_pool, tmp_path_factory):
    from deepspeed.checkpoint.ds_to_universal import convert

    root = tmp_path_factory.mktemp("tp2pp2")
    expected = dist_pool.run(_source, world_size=4, args=(str(root / "ckpt"), False))
    out = convert(str(root / "ckpt"), str(root / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    return root, expected[0], out


def test_conversion_joins_the_tensor_parallel_pieces(universal_source):
    from deepspeed.checkpoint.universal import load_param_state, read_info

    root, _, out = universal_source
    info = read_info(out)
    assert info["source"]["pipeline_stages"] == 2 and info["source"]["tensor_parallel_size"] == 2
    shapes = info["param_shapes"]
    # whole shapes: column weights joined along 0, row weights along 1, replicated ones once
    assert shapes["0.weight"] == [HIDDEN, IN] and shapes["0.bias"] == [HIDDEN]
    assert shapes["2.weight"] == [IN, HIDDEN] and shapes["2.bias"] == [IN]
    assert shapes["3.weight"] == [IN] and shapes["6.weight"] == [OUT, HIDDEN]
    ckpt = root / "ckpt" / TAG
    pieces = [load_file(ckpt / f"layer_00-model_{t:02d}-model_states.pt")["weight"]
              for t in range(2)]
    assert torch.equal(load_param_state(out, "0.weight"), torch.cat(pieces, 0))
    pieces = [load_file(ckpt / f"layer_06-model_{t:02d}-model_states.pt")["weight"]
              for t in range(2)]
    assert torch.equal(load_param_state(out, "6.weight"), torch.cat(pieces, 1))
    slices = load_file(ckpt / "mp_rank_03_model_states.pt")["param_slices"]
    assert slices == {"4.weight": [0, 2, 1], "4.bias": [0, 2, 1], "6.weight": [1, 2, 1]}
    assert load_param_state(out, "6.weight", "exp_avg_sq").shape == (OUT, HIDDEN)
    assert sorted(os.listdir(out)).count("mp_rank_00_model_states.pt") == 1


@pytest.mark.parametrize("layout", [(2, 1), (1, 2), "dp"], ids=["tp1pp2", "tp2pp1", "dp2"])
def test_universal_resumes_at_another_layout(dist_pool, universal_source, layout):
    _, expected, out = universal_source
    results = dist_pool.run(_resume, world_size=2, args=(os.path.dirname(out), layout))
    for losses, steps in results:
        assert steps == 2
        assert losses == pytest.approx(expected, abs=1e-5, rel=0)
