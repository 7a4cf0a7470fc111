"""``ds_to_universal`` of a Megatron-style tensor-parallel model (``mpu=``) trained with ZeRO-3
whose frozen bias is split over the tensor ranks and partitioned by ZeRO-3 (issue 36): the
tensor ranks' pieces are joined into the whole frozen tensor, and the universal checkpoint
resumes at tensor-parallel size 1 and at 2 with another data-parallel size, with the losses of
the run that was never interrupted."""
import pytest
import torch
from torch import nn

TAG, LR, GLOBAL = "two", 1e-2, 4


def _model(tp, seed):
    """Column (frozen bias) -> Tanh -> row over ``tp`` tensor ranks (a plain Sequential at tp
    1); the pieces are cut from the same whole Linears for every ``tp``."""
    torch.manual_seed(seed)
    first, second = nn.Linear(4, 8), nn.Linear(8, 4)
    first.bias.requires_grad_(False)
    if tp == 1:
        return nn.Sequential(first, nn.Tanh(), second), None
    from deepspeed.tensor_parallel.groups import TensorParallelGroups
    from deepspeed.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    groups = TensorParallelGroups(tp)
    rank, group = groups.tp_rank, groups.tp_group
    column = ColumnParallelLinear(nn.Parameter(first.weight.detach().chunk(tp, 0)[rank].clone()),
                                  nn.Parameter(first.bias.detach().chunk(tp)[rank].clone(),
                                               requires_grad=False), group)
    row = RowParallelLinear(nn.Parameter(second.weight.detach().chunk(tp, 1)[rank].clone()),
                            nn.Parameter(second.bias.detach().clone()), group)
    return nn.Sequential(column, nn.Tanh(), row), groups


def _batches():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(GLOBAL, 4, generator=g), torch.randn(GLOBAL, 4, generator=g))
            for _ in range(4)]


def _train(tp, seed, save_dir=None, load_dir=None):
    """Train at ``tp`` x (world / tp) with ZeRO-3 (every parameter partitioned): the first 2
    batches and a save, or a universal load; then the last 2 batches' mean losses."""
    import deepspeed
    from deepspeed import comm as dist

    model, groups = _model(tp, seed)
    dp = dist.get_world_size() // tp
    dp_rank = dist.get_rank() // tp
    config = {"train_micro_batch_size_per_gpu": GLOBAL // dp, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    if load_dir:
        config["checkpoint"] = {"load_universal": True}
    engine = deepspeed.initialize(model=model, mpu=groups, config=config,
                                  model_parameters=[p for p in model.parameters()
                                                    if p.requires_grad])[0]

    def step(x, y):
        share = GLOBAL // dp
        loss = nn.functional.mse_loss(engine(x[dp_rank * share:(dp_rank + 1) * share]),
                                      y[dp_rank * share:(dp_rank + 1) * share])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        return mean.item() / dist.get_world_size()

    batches = _batches()
    if load_dir:
        engine.load_checkpoint(load_dir, tag=TAG)
    else:
        for x, y in batches[:2]:
            step(x, y)
        engine.save_checkpoint(save_dir, tag=TAG)
    losses = [step(x, y) for x, y in batches[2:]]
    engine.destroy()
    return losses


def test_zero3_frozen_pieces_convert_and_resume_at_other_tensor_parallel_sizes(dist_pool,
                                                                              tmp_path):
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.ds_to_universal import convert
    from deepspeed.checkpoint.universal import load_param_state, read_info

    expected = dist_pool.run(_train, world_size=4, args=(2, 0, str(tmp_path / "ckpt")))[0]
    out = convert(str(tmp_path / "ckpt"), str(tmp_path / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    info = read_info(out)
    assert info["source"]["tensor_parallel_size"] == 2 and info["source"]["zero_stage"] == 3
    assert info["frozen_param_shapes"] == {"0.bias": [8]}
    torch.manual_seed(0)
    assert torch.equal(load_param_state(out, "0.bias"), nn.Linear(4, 8).bias.detach())
    ranks = [load_file(tmp_path / "ckpt" / TAG / f"mp_rank_0{t}_model_states.pt")
             for t in range(2)]
    assert [r["param_slices"]["0.bias"] for r in ranks] == [[0, 2, 0], [0, 2, 1]]
    module = load_file(tmp_path / "universal" / TAG / "mp_rank_00_model_states.pt")["module"]
    # whole tensors, the empty ZeRO-3 placeholders (2.bias: replicated) replaced too
    assert [module[k].shape for k in ("0.bias", "2.weight", "2.bias")] == [(8,), (4, 8), (4,)]
    for tp in (1, 2):  # on 2 ranks: TP1 x DP2, TP2 x DP1; other initial weights (seed 7)
        for losses in dist_pool.run(_train, world_size=2,
                                    kwargs={"tp": tp, "seed": 7,
                                            "load_dir": str(tmp_path / "universal")}):
            assert losses == pytest.approx(expected, abs=1e-5, rel=0), tp
