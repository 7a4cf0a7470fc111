"""What ZeRO-3 keeps in memory between its collectives: a released weight is really freed
between a module's forward and its backward (``saved_views``), and with fp32 parameters each
shard is a view of the fp32 master chunk rather than a second copy. Both must leave training
bit-identical to the per-parameter path and equal to single-process AdamW."""
import torch

from test_zero3_coalescing import STEPS, _data, _model, _reference
from zero_models import LR, MICRO


def _train_and_watch(zero):
    """Train ``STEPS`` steps; in the last forward, hold a handle on the storage of each
    gathered Linear weight and count, once the forward has returned, how many of them
    anything besides that handle still references."""
    import deepspeed
    from deepspeed import comm as dist

    from zero_models import full_params

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 0,
                                         "stage3_prefetch_bucket_size": 0}, **zero)}
    engine, *_ = deepspeed.initialize(model=_model(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = _data(world)
    held = []
    linears = [m for m in engine.module.modules() if isinstance(m, torch.nn.Linear)]

    def hold(module, args):  # runs after the coordinator's own pre-hook: gathered now
        held.append(module.weight.data.untyped_storage())

    alive_after_forward = None
    for s in range(STEPS):
        handles = [m.register_forward_pre_hook(hold) for m in linears] if s == STEPS - 1 else []
        start = s * MICRO * world + rank * MICRO
        loss = torch.nn.functional.mse_loss(engine(x[start:start + MICRO]),
                                            y[start:start + MICRO])
        if handles:
            alive_after_forward = sum(torch._C._storage_Use_Count(h._cdata) > 1 for h in held)
            for handle in handles:
                handle.remove()
        engine.backward(loss)
        engine.step()
    optimizer = engine.optimizer
    chunks = [(c.data_ptr(), c.data_ptr() + c.numel() * c.element_size())
              for c in optimizer.all_chunks]
    shards = [p.ds_tensor.data_ptr() for p in engine.module.parameters()]
    shards_in_masters = sum(any(lo <= ptr < hi for lo, hi in chunks) for ptr in shards)
    return full_params(engine.module), len(held), alive_after_forward, shards_in_masters, \
        len(shards)


def test_released_weights_are_freed_before_backward_and_shards_view_masters(dist_pool):
    from deepspeed.zero.saved_views import AVAILABLE as saved_views_available

    expected = _reference(2)
    coalesced = dist_pool.run(_train_and_watch, args=({},))
    per_parameter = dist_pool.run(_train_and_watch, args=({"reduce_bucket_size": 1},))
    # memory_efficient_linear off: autograd's saved views keep every gathered weight whole
    plain_linear = dist_pool.run(_train_and_watch, args=({"memory_efficient_linear": False},))
    for (params, held, alive, in_masters, n_shards), (single, *_), (plain, _, kept, *_) in zip(
            coalesced, per_parameter, plain_linear):
        assert held == 4  # the four Linear modules gathered their weights in the forward
        if saved_views_available:  # none is kept whole (by autograd's saved views) until backward
            assert alive == 0
            assert kept == 3  # all but the first Linear, whose input needs no gradient
        assert in_masters == n_shards == 10  # fp32: no shard is a copy of its master
        for name, want in expected.items():
            assert torch.equal(params[name], single[name]), name
            assert torch.equal(plain[name], single[name]), name
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)
