"""Model parallelism on 2 gloo ranks: partitioned activations and the model-parallel seeds.

The mpu is built from `deepspeed.comm.new_group`, like Megatron's: model-parallel groups of
`tp` consecutive ranks, data-parallel groups of the ranks with the same model-parallel rank.
"""
import torch

import deepspeed.comm as dist


class GroupMPU:
    def __init__(self, tp):
        world, rank = dist.get_world_size(), dist.get_rank()
        # every rank creates every group, in the same order (new_group is collective)
        mp_groups = [dist.new_group(list(range(start, start + tp)))
                     for start in range(0, world, tp)]
        dp_groups = [dist.new_group(list(range(offset, world, tp))) for offset in range(tp)]
        self.tp, self.rank = tp, rank
        self.mp_group = mp_groups[rank // tp]
        self.dp_group = dp_groups[rank % tp]

    def get_model_parallel_rank(self):
        return self.rank % self.tp

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_group(self):
        return self.mp_group

    def get_data_parallel_rank(self):
        return self.rank // self.tp

    def get_data_parallel_world_size(self):
        return dist.get_world_size() // self.tp

    def get_data_parallel_group(self):
        return self.dp_group


def _isolated(fn):
    """Ranks are reused across tests: give each run default checkpointing state and put the
    previous state back afterwards."""
    from deepspeed.activation_checkpointing import get_cuda_rng_tracker
    from deepspeed.activation_checkpointing import settings as ac_settings

    saved_state, tracker = ac_settings._STATE, get_cuda_rng_tracker()
    saved_streams, saved_seeds = tracker.get_states(), set(tracker.seeds_)
    ac_settings._STATE = ac_settings._State()
    tracker.reset()
    try:
        return fn()
    finally:
        ac_settings._STATE = saved_state
        tracker.set_states(saved_streams)
        tracker.seeds_ = saved_seeds


def _mp_segment(layer, hidden, mask, scale):
    """Megatron-style: what leaves the segment as the next activation is replicated across the
    model-parallel group (default stream), while dropout inside the model-parallel region draws
    from the tracker stream and differs per rank (here it only feeds a rank-local loss term)."""
    import deepspeed.checkpointing as ckpt

    with ckpt.get_cuda_rng_tracker().fork():
        local = torch.nn.functional.dropout(layer(hidden), p=0.3, training=True)
    out = torch.nn.functional.dropout(layer(hidden) * scale, p=0.2, training=True) + hidden * mask
    return out, local.pow(2).sum(), mask.sum()


def _train(layers, x0, mask, use_checkpoint):
    import deepspeed.checkpointing as ckpt

    for layer in layers:
        layer.zero_grad(set_to_none=True)
    ckpt.model_parallel_cuda_manual_seed(42)
    x = x0.clone().requires_grad_()
    h, saved, loss = x, [], 0
    for i, layer in enumerate(layers):
        if use_checkpoint:
            h, local, count = ckpt.checkpoint(_mp_segment, layer, h, mask, 1.0 + i)
            saved.append(h.grad_fn.saved_tensors)
        else:
            h, local, count = _mp_segment(layer, h, mask, 1.0 + i)
        loss = loss + local + count
    (h.pow(2).sum() + loss).backward()
    grads = [h.detach(), x.grad] + [p.grad for layer in layers for p in layer.parameters()]
    return grads, saved


def _partitioned_run(options):
    import deepspeed.checkpointing as ckpt
    from deepspeed.activation_checkpointing import settings as ac_settings

    def body():
        mpu = GroupMPU(tp=2)
        torch.manual_seed(0)
        layers = [torch.nn.Linear(6, 6) for _ in range(3)]
        x0, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.5).float()
        ckpt.configure(mpu, deepspeed_config={"activation_checkpointing": options},
                       partition_activation=True)  # the Megatron tutorial's spelling
        ref, _ = _train(layers, x0, mask, use_checkpoint=False)  # same seeds, no checkpointing
        got, saved = _train(layers, x0, mask, use_checkpoint=True)
        rank = mpu.get_model_parallel_rank()
        first_input = x0.reshape(-1)[rank * 12:(rank + 1) * 12]
        return {"equal": [torch.equal(g, r) for g, r in zip(got, ref)],
                "x_grad": got[1],
                "saved_numels": [[t.numel() for t in seg] for seg in saved],
                "saved_devices": sorted({t.device.type for seg in saved for t in seg}),
                "first_partition_is_mine": torch.equal(saved[0][0], first_input),
                "buffers_left": len(ac_settings.contiguous_buffers())}

    return _isolated(body)


def test_partitioned_activations_give_exact_gradients_on_two_ranks(dist_pool):
    variants = [{}, {"cpu_checkpointing": True},
                {"contiguous_memory_optimization": True, "number_checkpoints": 3}]
    for options in variants:
        results = dist_pool.run(_partitioned_run, world_size=2, args=(options,))
        # the ranks' model-parallel dropout differed, so their gradients do too, and each
        # rank's still equals its own unchecked run
        assert not torch.equal(results[0]["x_grad"], results[1]["x_grad"])
        for result in results:
            assert all(result["equal"]) and len(result["equal"]) == 8, (options, result)
            # hidden (24 elements) and the float mask (24) are split in half; the Python
            # float is not a tensor and nothing else is kept
            assert result["saved_numels"] == [[12, 12]] * 3, (options, result)
            assert result["first_partition_is_mine"], options
            assert result["saved_devices"] == ["cpu"]
            assert result["buffers_left"] == 0


def _indivisible_activation():
    import deepspeed.checkpointing as ckpt

    def body():
        ckpt.configure(GroupMPU(tp=2), partition_activations=True)
        x = torch.randn(3, 5, requires_grad=True)
        try:
            ckpt.checkpoint(torch.nn.functional.gelu, x)
        except AssertionError as exc:
            return str(exc)
        return None

    return _isolated(body)


def test_an_activation_that_does_not_split_evenly_is_refused(dist_pool):
    for message in dist_pool.run(_indivisible_activation, world_size=2):
        assert message is not None
        assert "argument 0 has shape (3, 5) (15 elements)" in message
        assert "2 model-parallel ranks" in message


def _seeded_draws(tp):
    import deepspeed.checkpointing as ckpt

    def body():
        ckpt.configure(GroupMPU(tp=tp))
        ckpt.model_parallel_cuda_manual_seed(1234)
        default = torch.rand(6)
        with ckpt.get_cuda_rng_tracker().fork():
            model_parallel = torch.rand(6)
        return default, model_parallel

    return _isolated(body)


def test_model_parallel_seeds_differ_inside_a_group_only(dist_pool):
    (d0, m0), (d1, m1) = dist_pool.run(_seeded_draws, world_size=2, args=(2,))
    assert torch.equal(d0, d1)  # default stream: same within the model-parallel group
    assert not torch.equal(m0, m1)  # model-parallel stream: differs within it
    assert torch.equal(m0, torch.rand(6, generator=torch.Generator().manual_seed(1234 + 2718)))
    assert torch.equal(m1, torch.rand(6, generator=torch.Generator().manual_seed(1234 + 2719)))

    (d0, m0), (d1, m1) = dist_pool.run(_seeded_draws, world_size=2, args=(1,))
    assert torch.equal(d0, d1) and torch.equal(m0, m1)  # TP=1, DP=2: replicas agree
