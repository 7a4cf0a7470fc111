"""Random-LTD on a small transformer, against the unwrapped model and the schedule computed here."""
import copy
import math

import pytest
import torch
from torch import nn

from deepspeed.data_efficiency import (RandomLayerTokenDrop, RandomLTDScheduler,
                                       convert_to_random_ltd, remove_random_ltd_state_dict)
from deepspeed.data_efficiency.config import RandomLTDConfig
from deepspeed.testing.distributed import run_distributed

SEQ, WIDTH, LAYERS = 32, 16, 4


class Layer(nn.Module):
    """A decoder block taking its mask as a keyword, as random-LTD requires."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.mlp = nn.Linear(WIDTH, WIDTH)
        self.seen = []

    def forward(self, x, attention_mask=None):
        self.seen.append((x.shape[1], None if attention_mask is None
                          else tuple(attention_mask.shape)))
        y, _ = self.attn(x, x, x, attn_mask=attention_mask, need_weights=False)
        return x + self.mlp(torch.tanh(y))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        mask = torch.triu(torch.full((x.shape[1], x.shape[1]), float("-inf")), 1)
        for layer in self.layers:
            x = layer(x, attention_mask=mask)
        return self.head(x).mean()


def ltd_config(layer_ids=(1, 2), lo=8, hi=32, steps=6, per_step=4):
    return RandomLTDConfig(enabled=True, total_layer_num=LAYERS,
                           random_ltd_layer_num=len(layer_ids), random_ltd_layer_id=list(layer_ids),
                           model_mask_name="attention_mask", model_type="decoder",
                           random_ltd_schedule={"min_value": lo, "max_value": hi,
                                                "schedule_type": "fixed_linear",
                                                "schedule_config": {"require_steps": steps,
                                                                    "seq_per_step": per_step}})


def converted(config, global_batch=2):
    plain = Tiny()
    model = convert_to_random_ltd(copy.deepcopy(plain), Layer)
    scheduler = RandomLTDScheduler(config, global_batch_size=global_batch, seed=3)
    wrappers = [m for m in model.modules() if isinstance(m, RandomLayerTokenDrop)]
    for i, w in enumerate(wrappers):
        w.init_config(config, scheduler, i)
    return plain, model, scheduler, wrappers


def test_unsampled_positions_pass_through_and_kept_count_follows_schedule():
    config = ltd_config()
    _, model, scheduler, wrappers = converted(config)
    x = torch.randn(2, SEQ, WIDTH)
    for step in range(8):
        reserved = scheduler.update_seq(step)
        expected = min(math.floor(step / 6 * 24 + 8) // 4 * 4, 32)
        assert reserved == expected
        if reserved >= SEQ:
            break
        wrapper = wrappers[1]
        out = wrapper(x, attention_mask=torch.zeros(SEQ, SEQ))
        idx = wrapper.last_indices
        assert idx.shape == (2, reserved)
        assert (idx.diff(dim=1) > 0).all()  # sorted, no repeats
        keep = torch.zeros(2, SEQ, dtype=torch.bool)
        keep.scatter_(1, idx, True)
        assert torch.equal(out[~keep], x[~keep])  # dropped tokens bypass the layer
        inner = wrapper.random_ltd_layer
        assert inner.seen[-1] == (reserved, (reserved, reserved))  # decoder mask sliced
        for b in range(2):
            part = x[b:b + 1, idx[b]]
            ref = inner(part, attention_mask=torch.zeros(reserved, reserved))
            assert torch.allclose(out[b, idx[b]], ref[0], atol=1e-6)
    # selections differ across layers: each layer draws its own subset
    scheduler.current_seq = 8
    wrappers[1](x)
    first = wrappers[1].last_indices
    wrappers[2](x)
    assert first is not None and not torch.equal(first, wrappers[2].last_indices)
    # layers not listed in random_ltd_layer_id never drop
    assert not wrappers[0].active and not wrappers[3].active


def test_eval_equals_unwrapped_and_gradients_flow():
    plain, model, scheduler, _ = converted(ltd_config())
    scheduler.update_seq(0)
    x = torch.randn(2, SEQ, WIDTH)
    model.eval()
    plain.eval()
    assert torch.equal(model(x), plain(x))
    model.train()
    model(x).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_stripped_state_dict_loads_into_plain_model():
    plain, model, _, _ = converted(ltd_config())
    for p in model.parameters():
        p.data.add_(1.0)
    state = remove_random_ltd_state_dict(model.state_dict())
    fresh = Tiny()
    fresh.load_state_dict(state, strict=True)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), state.values()))


def test_seq_batch_dim_and_encoder_mask():
    config = ltd_config()
    config.hidden_state_order = "seq_batch_dim"
    config.model_type = "encoder"
    scheduler = RandomLTDScheduler(config, seed=1)
    scheduler.update_seq(0)
    seen = {}

    class SeqFirst(nn.Module):
        def forward(self, x, attention_mask=None):
            seen["x"], seen["mask"] = x.shape, attention_mask
            return x * 2

    wrapper = RandomLayerTokenDrop(SeqFirst())
    wrapper.init_config(config, scheduler, 1)
    x = torch.randn(SEQ, 3, WIDTH)
    mask = torch.arange(SEQ).float().view(1, 1, 1, SEQ).expand(3, 1, SEQ, SEQ).contiguous()
    out = wrapper(x, attention_mask=mask)
    idx = wrapper.last_indices
    assert seen["x"] == (8, 3, WIDTH)
    for b in range(3):
        assert torch.equal(seen["mask"][b, 0, 0], idx[b].float())  # key axis gathered
        assert torch.equal(out[idx[b], b], 2 * x[idx[b], b])
        dropped = torch.ones(SEQ, dtype=torch.bool)
        dropped[idx[b]] = False
        assert torch.equal(out[dropped, b], x[dropped, b])


def _engine_ltd(ckpt):
    import deepspeed

    model = Tiny()
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "data_efficiency": {"enabled": True, "data_routing": {
                  "enabled": True, "random_ltd": ltd_config().model_dump()}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    convert_to_random_ltd(engine, Layer)
    kept = []
    torch.manual_seed(1)
    for _ in range(4):
        loss = engine(torch.randn(2, SEQ, WIDTH))
        kept.append(engine.module.layers[1].last_indices.shape[1])
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(ckpt)
    tokens = engine.random_ltd_scheduler.consumed_layer_tokens
    engine.destroy()
    again, *_ = deepspeed.initialize(model=Tiny(), config=config,
                                     model_parameters=Tiny().parameters())
    convert_to_random_ltd(again, Layer)
    again.load_checkpoint(ckpt)
    restored = (again.random_ltd_scheduler.consumed_layer_tokens,
                again.random_ltd_scheduler.get_current_seq())
    again.destroy()
    return kept, tokens, restored


def test_engine_random_ltd_on_2_ranks(tmp_path):
    for kept, tokens, restored in run_distributed(_engine_ltd, world_size=2,
                                                  args=(str(tmp_path),)):
        schedule = [min(math.floor(t / 6 * 24 + 8) // 4 * 4, 32) for t in range(4)]
        assert kept == schedule
        global_batch = 4  # 2 per rank x 2 ranks
        assert tokens == sum(global_batch * (r * 2 + 32 * 2) for r in schedule)
        assert restored == (tokens, schedule[-1])


LR_SCHEDULE = {"enabled": True, "warmup_layer_token": 300, "total_layer_token": 700}


def _layer_token_lr(steps):
    import deepspeed

    model = Tiny()
    ltd = ltd_config().model_dump()
    ltd["layer_token_lr_schedule"] = LR_SCHEDULE
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "data_efficiency": {"enabled": True, "data_routing": {
                  "enabled": True, "random_ltd": ltd}}}
    engine, optimizer, *_ = deepspeed.initialize(model=model, config=config,
                                                 model_parameters=model.parameters())
    convert_to_random_ltd(engine, Layer)
    torch.manual_seed(1)
    seen = []
    for _ in range(steps):
        engine.backward(engine(torch.randn(2, SEQ, WIDTH)))
        engine.step()
        seen.append((engine.random_ltd_scheduler.consumed_layer_tokens,
                     optimizer.param_groups[0]["lr"]))
    engine.destroy()
    return seen


def test_layer_token_lr_schedule_follows_consumed_tokens(dist_pool):
    [seen] = dist_pool.run(_layer_token_lr, world_size=1, args=(4, ))
    tokens = [t for t, _ in seen]
    assert tokens == [160, 336, 528, 736]  # 2 x (r * 2 + 32 * 2), r = 8, 12, 16, 20
    warmup, total = LR_SCHEDULE["warmup_layer_token"], LR_SCHEDULE["total_layer_token"]
    expected = [0.01 * 160 / warmup]  # linear warmup, then cosine decay to 0 at the total
    expected += [0.01 * 0.5 * (1 + math.cos(math.pi * min(1, (t - warmup) / (total - warmup))))
                 for t in tokens[1:]]
    assert [lr for _, lr in seen] == [pytest.approx(lr, abs=1e-12) for lr in expected]
    assert seen[-1][1] == 0.0


def test_layer_token_lr_schedule_needs_a_total_above_the_warmup():
    from deepspeed.data_efficiency.config import LayerTokenLRScheduleConfig

    with pytest.raises(ValueError, match="total_layer_token"):
        LayerTokenLRScheduleConfig(enabled=True, warmup_layer_token=10)
