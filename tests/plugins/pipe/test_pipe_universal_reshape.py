"""3-D reshaping through a universal checkpoint (issue 36), as the universal-checkpointing tutorial
describes it: a pipeline of Megatron-style tensor-parallel layers trained at TP2 x PP2 (4 ranks,
no ZeRO), converted with ``ds_to_universal``, resumes at TP1 x PP2, at TP2 x PP1 and
data-parallel only (DP2), and its losses continue those of the run that was never interrupted
(within 1e-5: the tensor-parallel sums add in another order). The source has one data-parallel
rank: without ZeRO only data-parallel rank 0 writes, so a DP2 source saves the same files (an
8-rank TP2 x PP2 x DP2 source was measured to convert and resume alike, at twice the ranks).

The model holds what a Megatron GPT holds and the conversion has to get right: a weight tied
between the first and the last stage that is itself split over the tensor ranks (an embedding
reused as the output projection, ``TiedLayerSpec``), and a frozen parameter split over the tensor
ranks (``requires_grad=False``; the model states record its slice like a trained one's)."""
import os

import pytest
import torch
from torch import nn

from deepspeed.checkpoint import load_file
from deepspeed.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                              reduce_from_tensor_parallel)

MICRO, IN, HIDDEN = 2, 4, 8
MICRO_BATCHES = 4  # per global batch, over all data-parallel ranks
SEED, TAG, LR = 4321, "step2", 1e-2
ADAMW = {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}}
TIED, FROZEN = "tied_modules.io.weight", "4.bias"


def _tensor_group():
    from deepspeed import topology

    return topology.current().group("pipe.model")  # the grid's tensor (``model``) axis


def _piece_of(linear, split_dim, split_bias):
    """This tensor rank's ``(weight, bias, group)`` of ``linear`` (Megatron's split)."""
    from deepspeed import comm as dist

    group = _tensor_group()
    parts, index = dist.get_world_size(group=group), dist.get_rank(group=group)
    weight = linear.weight.detach().chunk(parts, split_dim)[index]
    bias = None
    if linear.bias is not None:
        bias = linear.bias.detach()
        bias = nn.Parameter((bias.chunk(parts)[index] if split_bias else bias).clone())
    return nn.Parameter(weight.clone()), bias, group


class Column(ColumnParallelLinear):
    def __init__(self, n_in, n_out, bias=True, freeze_bias=False):
        super().__init__(*_piece_of(nn.Linear(n_in, n_out, bias=bias), 0, True))
        if freeze_bias:
            self.bias.requires_grad_(False)


class Row(RowParallelLinear):
    def __init__(self, n_in, n_out):
        super().__init__(*_piece_of(nn.Linear(n_in, n_out), 1, False))


def _output_projection(io, x):
    """The tied ``io`` Column reused at the end, transposed: this rank's hidden slice times its
    weight slice, summed over the tensor ranks (a row-parallel product)."""
    return reduce_from_tensor_parallel(x @ io.weight, io.group)


def _specs():
    """Tied io (column, no bias) -> Tanh -> row -> replicated LayerNorm -> column with a frozen
    bias -> Tanh -> io again as the output projection -> Tanh; 4 layers per stage at two stages.
    Layer ``i`` is built under seed ``SEED + i``, so every layout starts alike."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    return [TiedLayerSpec("io", Column, IN, HIDDEN, bias=False), LayerSpec(nn.Tanh),
            LayerSpec(Row, HIDDEN, IN), LayerSpec(nn.LayerNorm, IN),
            LayerSpec(Column, IN, HIDDEN, freeze_bias=True), LayerSpec(nn.Tanh),
            TiedLayerSpec("io", Column, IN, HIDDEN, bias=False, forward_fn=_output_projection),
            LayerSpec(nn.Tanh)]


class Unsplit(nn.Module):
    """The same layers without pipeline or tensor parallelism, under the pipeline's global names
    (``tied_modules.io``, ``2``, ``4`` ...), so a universal checkpoint of the pipeline loads."""

    def __init__(self):
        super().__init__()
        self.tied_modules = nn.ModuleDict({"io": nn.Linear(IN, HIDDEN, bias=False)})
        for index, layer in ((1, nn.Tanh()), (2, nn.Linear(HIDDEN, IN)), (3, nn.LayerNorm(IN)),
                             (4, nn.Linear(IN, HIDDEN)), (5, nn.Tanh()), (7, nn.Tanh())):
            self.add_module(str(index), layer)
        self._modules["4"].bias.requires_grad_(False)

    def forward(self, x):
        layer = self._modules
        x = layer["3"](layer["2"](layer["1"](self.tied_modules.io(x))))
        return layer["7"](layer["5"](layer["4"](x)) @ self.tied_modules.io.weight)


def _mse(outputs, labels):
    return nn.functional.mse_loss(outputs, labels)


def _data(count=4):
    """``count`` global batches of ``MICRO_BATCHES`` micro-batches; data-parallel rank ``d`` of
    ``dp`` trains micro-batches ``d * n .. (d + 1) * n`` of each (``n = MICRO_BATCHES / dp``),
    so every layout sums the gradient of the same samples."""
    g = torch.Generator().manual_seed(5)
    return [[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, IN, generator=g))
             for _ in range(MICRO_BATCHES)] for _ in range(count)]


def _mine(batch, dp, rank):
    share = MICRO_BATCHES // dp
    return batch[rank * share:(rank + 1) * share]


def _config(gas, **extra):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
            "optimizer": ADAMW, "steps_per_print": 10 ** 6, **extra}


def _pipeline(pp, tp, dp, **extra):
    import deepspeed
    from deepspeed.pipe import PipeModelDataParallelTopology, PipelineModule

    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    model = PipelineModule(_specs(), topology=topo, loss_fn=_mse, seed_layers=True,
                           base_seed=SEED, partition_method="uniform")
    params = [p for p in model.parameters() if p.requires_grad]
    return deepspeed.initialize(model=model, model_parameters=params,
                                config=_config(MICRO_BATCHES // dp, **extra))[0]


def _train_pipeline(engine, data):
    dp, rank = engine.dp_world_size, engine.grid.get_data_parallel_rank()
    return [engine.train_batch(iter(_mine(batch, dp, rank))).item() for batch in data]


def _source(save_dir):
    """TP2 x PP2: train 2 batches, save, ``ds_to_universal``-ready; then the 2 batches the
    resumed runs must reproduce."""
    engine = _pipeline(2, 2, 1)
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
    if layout == "dp":  # no pipeline, no tensor parallelism: the layers as one module
        from deepspeed import comm as dist

        torch.manual_seed(99)  # other initial weights: all must come from the checkpoint
        model = Unsplit()
        dp, rank = dist.get_world_size(), dist.get_rank()
        params = [p for p in model.parameters() if p.requires_grad]
        engine = deepspeed.initialize(model=model, model_parameters=params,
                                      config=_config(MICRO_BATCHES // dp, **load,
                                                     zero_optimization={"stage": 1}))[0]
        engine.load_checkpoint(universal_dir, tag=TAG)
        steps, losses = engine.global_steps, []
        for batch in _data()[2:]:
            mean = torch.zeros(())
            for x, y in _mine(batch, dp, rank):
                loss = _mse(engine(x), y)
                engine.backward(loss)
                engine.step()
                mean += loss.detach() / (MICRO_BATCHES // dp)
            dist.all_reduce(mean)
            losses.append(mean.item() / dp)
        frozen = engine.module._modules["4"].bias.detach().clone()
    else:
        pp, tp = layout
        engine = _pipeline(pp, tp, 2 // (pp * tp), **load,
                           **({"zero_optimization": {"stage": 1}} if tp > 1 else {}))
        with torch.no_grad():  # every weight, the frozen bias too, must come from the checkpoint
            for param in engine.module.parameters():
                param.zero_()
        engine.load_checkpoint(universal_dir, tag=TAG)
        steps = engine.global_steps
        losses = _train_pipeline(engine, _data()[2:])
        frozen = None
    engine.destroy()
    return losses, steps, frozen


@pytest.fixture(scope="module")
def universal_source(dist_pool, tmp_path_factory):
    from deepspeed.checkpoint.ds_to_universal import convert

    root = tmp_path_factory.mktemp("tp2pp2")
    expected = dist_pool.run(_source, world_size=4, args=(str(root / "ckpt"),))
    out = convert(str(root / "ckpt"), str(root / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    return root, expected[0], out


def _pieces(ckpt, layer, key):
    return [load_file(ckpt / f"layer_{layer:02d}-model_{t:02d}-model_states.pt")[key]
            for t in range(2)]


def test_conversion_joins_the_tensor_parallel_pieces(universal_source):
    from deepspeed.checkpoint.universal import load_param_state, read_info

    root, _, out = universal_source
    info = read_info(out)
    assert info["source"]["pipeline_stages"] == 2 and info["source"]["tensor_parallel_size"] == 2
    shapes = info["param_shapes"]
    # whole shapes: column weights joined along 0, row weights along 1, replicated ones once
    assert shapes[TIED] == [HIDDEN, IN] and shapes["4.weight"] == [HIDDEN, IN]
    assert shapes["2.weight"] == [IN, HIDDEN] and shapes["2.bias"] == [IN]
    assert shapes["3.weight"] == [IN] and "0.weight" not in shapes and "6.weight" not in shapes
    ckpt = root / "ckpt" / TAG
    assert torch.equal(load_param_state(out, "2.weight"), torch.cat(_pieces(ckpt, 2, "weight"), 1))
    # the tied split weight: joined from the tensor ranks' pieces of the module's layer files
    tied = torch.cat(_pieces(ckpt, 0, "weight"), 0)
    assert torch.equal(load_param_state(out, TIED), tied)
    assert load_param_state(out, TIED, "exp_avg_sq").shape == (HIDDEN, IN)
    # the frozen split bias: whole, joined like a trained parameter, and never trained
    assert info["frozen_param_shapes"] == {FROZEN: [HIDDEN]} and FROZEN not in shapes
    assert torch.equal(load_param_state(out, FROZEN), torch.cat(_pieces(ckpt, 4, "bias")))
    states = load_file(os.path.join(out, "mp_rank_00_model_states.pt"))
    assert torch.equal(states["module"][FROZEN], load_param_state(out, FROZEN))
    assert torch.equal(states["module"][TIED], tied)
    slices = load_file(ckpt / "mp_rank_03_model_states.pt")["param_slices"]
    assert slices == {TIED: [0, 2, 1], "4.weight": [0, 2, 1], FROZEN: [0, 2, 1]}
    assert sorted(f for f in os.listdir(out) if f.endswith("_model_states.pt")) == \
        ["mp_rank_00_model_states.pt"]


@pytest.mark.parametrize("layout", [(2, 1), (1, 2), "dp"], ids=["tp1pp2", "tp2pp1", "dp2"])
def test_universal_resumes_at_another_layout(dist_pool, universal_source, layout):
    from deepspeed.checkpoint.universal import load_param_state

    _, expected, out = universal_source
    results = dist_pool.run(_resume, world_size=2, args=(os.path.dirname(out), layout))
    for losses, steps, frozen in results:
        assert steps == 2
        assert losses == pytest.approx(expected, abs=1e-5, rel=0)
        if frozen is not None:  # loaded from the checkpoint, and not trained since
            assert torch.equal(frozen, load_param_state(out, FROZEN))
