"""TiledMLP and TiledFusedLogitsLoss inside a ZeRO-3 + Ulysses (sp=2) engine train like the
untiled model on one process (the ALST setup: tiled MLPs patched into a Llama)."""
import types

import pytest
import torch
import torch.nn.functional as F

from sp_helpers import SP, tiny_llama, weighted_sp_loss

SEQ, STEPS, LR = 16, 2, 1e-2
# a small "hidden" for the shard rule so a rank's 8 tokens make ceil(8/3) = 3 uneven shards
RULE_HIDDEN = 3


def _samples():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 64, (STEPS, SP, 1, SEQ), generator=g)


def _mlp_forward(self, x):
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _tiled_mlp_forward(self, x):
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP, tiled_mlp_num_shards
    shards = tiled_mlp_num_shards(x.shape[1], RULE_HIDDEN)
    self.shards_used = shards
    return TiledMLP.apply(_mlp_forward, self, x, shards,
                          [self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight])


def _tiled_loss(model, hidden, shift_labels):
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    def fn(lm_head, x, y):
        return F.cross_entropy(lm_head(x).reshape(-1, lm_head.out_features), y.reshape(-1),
                               ignore_index=-100, reduction="sum")
    total = TiledFusedLogitsLoss.apply(fn, model.lm_head, hidden, shift_labels, None, 3,
                                       [model.lm_head.weight], "sum")
    return total / (shift_labels != -100).sum().clamp(min=1)


def _full_params(module):
    from deepspeed.zero import GatheredParameters
    with GatheredParameters(list(module.parameters())):
        return {name: p.detach().float().clone() for name, p in module.named_parameters()}


def _train_tiled_zero3():
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (UlyssesSPAttentionHF,
                                                                UlyssesSPDataLoaderAdapter)
    model = tiny_llama()
    for layer in model.model.layers:
        layer.mlp.forward = types.MethodType(_tiled_mlp_forward, layer.mlp)
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, sequence_parallel_size=SP,
                                                          micro_batch_size=1)
    try:
        config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": SP,
                  "zero_optimization": {"stage": 3},
                  "optimizer": {"type": "Adam", "params": {"lr": LR}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, mpu=mpu)
        rank, data = dist.get_rank(), _samples()
        dl = [{"input_ids": data[s, rank], "labels": data[s, rank]} for s in range(STEPS)]
        group = mpu.get_sequence_parallel_group()
        adapter = UlyssesSPDataLoaderAdapter(dl, sp_rank=mpu.get_sequence_parallel_rank(),
                                             sp_group=group, sp_world_size=SP, device="cpu")
        losses = []
        for batch in adapter:
            hidden = engine.module.model(input_ids=batch["input_ids"],
                                         position_ids=batch["position_ids"]).last_hidden_state
            loss = _tiled_loss(engine.module, hidden, batch["shift_labels"])
            loss = weighted_sp_loss(loss, batch["shift_labels"], group)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        shards = [layer.mlp.shards_used for layer in model.model.layers]
        params = _full_params(engine.module)
        engine.destroy()
        return losses, params, shards
    finally:
        parallel_state.destroy_sequence_parallel()


def test_zero3_ulysses_with_tiled_mlp_and_tiled_loss_matches_single_process(dist_pool):
    model = tiny_llama()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    want_losses = []
    data = _samples()
    for step in range(STEPS):
        for rank in range(SP):
            opt.zero_grad()
            loss = model(input_ids=data[step, rank], labels=data[step, rank]).loss
            loss.backward()
            opt.step()
            want_losses.append(loss.item())
    want = {n: p.detach() for n, p in model.named_parameters()}
    for losses, params, shards in dist_pool.run(_train_tiled_zero3, world_size=SP, timeout=120):
        assert shards == [3, 3]
        assert losses == pytest.approx(want_losses, rel=1e-4)
        for name, value in want.items():
            torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5, msg=name)
