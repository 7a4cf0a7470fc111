"""MoE layers inside a pipeline (issue 36): they train (a pipeline grid's "model" groups span
its stages, so the MoE layer takes its tensor-parallel group from the grid's tensor axis), and
``ds_to_universal`` converts a pipeline MoE checkpoint: 2 stages x 2 data-parallel ranks with
experts split 2 ways, under ZeRO-1 or without ZeRO, resume at 2 stages on 2 ranks with every
expert on each rank (ep 1, no ZeRO) with the losses of the uninterrupted run."""
import os

import pytest
import torch
from torch import nn

from moe_helpers import HIDDEN, expert

MICRO, TAG = 4, "t"


class MoEBlock(nn.Module):
    def __init__(self, ep_size):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.moe = MoE(HIDDEN, expert(), num_experts=4, ep_size=ep_size, k=1,
                       capacity_factor=1.0, min_capacity=2, use_rts=False,
                       top2_2nd_expert_sampling=False)

    def forward(self, x):
        return self.moe(x)[0]


def _data():
    """4 global batches of 2 micro-batches (one per data-parallel rank of the source)."""
    g = torch.Generator().manual_seed(0)
    return [[(torch.randn(MICRO, 4, generator=g), torch.randn(MICRO, 3, generator=g))
             for _ in range(2)] for _ in range(4)]


def _engine(ep_size, zero, gas, universal=False):
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.pipe import LayerSpec, PipelineModule

    specs = [LayerSpec(nn.Linear, 4, HIDDEN), LayerSpec(nn.Tanh), LayerSpec(MoEBlock, ep_size),
             LayerSpec(MoEBlock, ep_size), LayerSpec(nn.Linear, HIDDEN, 3)]
    model = PipelineModule(specs, num_stages=2, loss_fn=nn.functional.mse_loss,
                           partition_method="uniform", seed_layers=True,
                           base_seed=7 if not universal else 99)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "steps_per_print": 10 ** 6, "zero_optimization": {"stage": zero}}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "p"})
    return deepspeed.initialize(model=model, model_parameters=groups, config=config)[0]


def _source(save_dir, zero):
    engine = _engine(2, zero, 1)
    dp = engine.grid.get_data_parallel_rank()
    train = [engine.train_batch(iter([batch[dp]])).item() for batch in _data()[:2]]
    engine.save_checkpoint(save_dir, tag=TAG)
    after = [engine.train_batch(iter([batch[dp]])).item() for batch in _data()[2:]]
    engine.destroy()
    return train, after


def _resume(universal_dir):
    engine = _engine(1, 0, 2, universal=True)
    engine.load_checkpoint(universal_dir, tag=TAG)
    steps = engine.global_steps
    losses = [engine.train_batch(iter(batch)).item() for batch in _data()[2:]]
    engine.destroy()
    return steps, losses


@pytest.mark.parametrize("zero", [1, 0])
def test_pipeline_moe_checkpoint_converts_and_resumes_with_another_expert_layout(dist_pool,
                                                                                  tmp_path,
                                                                                  zero):
    """ZeRO-1 (expert groups partitioned over each stage's expert-data-parallel ranks) or no
    ZeRO (each stage's optimizer state in one file per expert-parallel rank)."""
    from deepspeed.checkpoint.ds_to_universal import convert
    from deepspeed.checkpoint.universal import read_info

    results = dist_pool.run(_source, world_size=4, args=(str(tmp_path / "pipe"), zero))
    written = sorted(f for f in os.listdir(tmp_path / "pipe" / TAG) if "optim_states" in f)
    assert written == ([f"zero_pp_rank_{d}_mp_rank_0{s}_optim_states.pt"
                        for d in range(2) for s in range(2)] if zero else
                       [f"expp_rank_{r}_mp_rank_0{s}_optim_states.pt"
                        for s, r in ((0, 0), (0, 1), (1, 2), (1, 3))])
    expected = results[0][1]
    assert all(r == results[0] for r in results)  # the loss is every rank's
    out = convert(str(tmp_path / "pipe"), str(tmp_path / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    info = read_info(out)
    experts = [n for g in info["group_params"] for n in g if ".deepspeed_experts." in n]
    # every expert of both MoE layers (one per stage) under its global id
    assert {n.split(".deepspeed_experts.")[1].split(".")[0] for n in experts} == \
        {"0", "1", "2", "3"}
    assert {n.split(".")[0] for n in experts} == {"2", "3"} and len(experts) == 2 * 4 * 4
    for steps, losses in dist_pool.run(_resume, world_size=2,
                                       args=(str(tmp_path / "universal"),)):
        assert steps == 2
        assert losses == pytest.approx(expected, abs=1e-5, rel=0)
