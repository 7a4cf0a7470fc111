"""Expert parallelism on 2 gloo ranks: an ep_size=2 layer's forward and backward equal the
single-process ep_size=1 layer holding every expert with the same weights, and each MoE layer
does exactly one all-to-all out and one back per forward (and per backward) of
``capacity * hidden * experts-per-rank * ep_size * dtype size`` bytes."""
import pytest
import torch

from moe_helpers import HIDDEN, expert, load_from_reference

TOKENS = 24


def _pair(num_experts, ep_size, **kwargs):
    """(reference layer with all experts, expert-parallel layer with this rank's share)."""
    import deepspeed.comm as dist
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import groups

    torch.manual_seed(0)
    reference = MoE(HIDDEN, expert(), num_experts=num_experts, ep_size=1, **kwargs)
    parallel = MoE(HIDDEN, expert(), num_experts=num_experts, ep_size=ep_size, **kwargs)
    ep_rank = groups._get_expert_parallel_rank(parallel.expert_group_name)
    load_from_reference(parallel, reference, ep_rank)
    return reference, parallel, ep_rank, dist


def _ep_matches_reference(k, drop_tokens, num_experts):
    reference, parallel, ep_rank, dist = _pair(num_experts, 2, k=k, drop_tokens=drop_tokens,
                                               capacity_factor=0.75, min_capacity=2)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    x = torch.randn(2, TOKENS // 2, HIDDEN, generator=gen)
    upstream = torch.randn(2, TOKENS // 2, HIDDEN, generator=gen)
    results = []
    for layer in (reference, parallel):
        inp = x.clone().requires_grad_(True)
        torch.manual_seed(7)  # the same draws for random token selection / 2nd-expert sampling
        out, l_aux, counts = layer(inp)
        (out * upstream).sum().add(l_aux).backward()
        results.append((out.detach(), l_aux.detach(), counts, inp.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # the gate is replicated: its gradient is this rank's own
    torch.testing.assert_close(parallel.deepspeed_moe.gate.wg.weight.grad,
                               reference.deepspeed_moe.gate.wg.weight.grad, atol=1e-6, rtol=0)
    # an expert's gradient sums what every rank's tokens contributed to it (the reference's
    # expert gradients summed over the ranks, all of them in the same order on every rank)
    ref_experts = reference.deepspeed_moe.experts.deepspeed_experts
    summed = []
    for ref_expert in ref_experts:
        summed.append([p.grad.clone() for p in ref_expert.parameters()])
        for grad in summed[-1]:
            dist.all_reduce(grad)
    for local, expert_module in enumerate(parallel.deepspeed_moe.experts.deepspeed_experts):
        global_idx = ep_rank * parallel.num_local_experts + local
        for got, want in zip(expert_module.parameters(), summed[global_idx]):
            # one matmul over both ranks' slots vs two summed: rounding of values ~5
            torch.testing.assert_close(got.grad, want, atol=1e-6, rtol=1e-6)
    return [int(c) for c in results[1][2]]


@pytest.mark.parametrize("num_experts", [2, 4])
@pytest.mark.parametrize("drop_tokens", [True, False])
@pytest.mark.parametrize("k", [1, 2])
def test_ep2_forward_backward_equals_single_process_reference(dist_pool, k, drop_tokens,
                                                               num_experts):
    counts = dist_pool.run(_ep_matches_reference, world_size=2, args=(k, drop_tokens, num_experts))
    assert [sum(c) for c in counts] == [TOKENS * k] * 2


def _count_all_to_alls(num_experts, k):
    import deepspeed.comm as dist
    from deepspeed.moe.layer import MoE

    calls = []
    original = dist.all_to_all_single

    def counting(output, tensor, *args, **kwargs):
        calls.append((tuple(tensor.shape), tensor.numel() * tensor.element_size()))
        return original(output, tensor, *args, **kwargs)

    dist.all_to_all_single = counting
    try:
        torch.manual_seed(0)
        layers = torch.nn.ModuleList([MoE(HIDDEN, expert(), num_experts=num_experts, ep_size=2,
                                          k=k, min_capacity=1) for _ in range(2)])
        x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
        h = x
        for layer in layers:
            h = layer(h)[0]
        forward = list(calls)
        h.sum().backward()
        backward = calls[len(forward):]
    finally:
        dist.all_to_all_single = original
    return forward, backward


@pytest.mark.parametrize("num_experts,k", [(2, 1), (4, 1), (4, 2)])
def test_one_all_to_all_each_way_per_layer_with_the_expected_size(dist_pool, num_experts, k):
    from deepspeed.moe.gating import capacity

    results = dist_pool.run(_count_all_to_alls, world_size=2, args=(num_experts, k))
    slots = capacity(TOKENS, num_experts, k * 1.0, 1)
    ep, per_rank = 2, num_experts // 2
    size = slots * HIDDEN * per_rank * ep * 4  # capacity x hidden x experts/rank x ep x fp32
    for forward, backward in results:
        assert len(forward) == 2 * 2 and len(backward) == 2 * 2  # 2 layers x (out + back)
        for shape, nbytes in forward + backward:
            # out: [E, C, M]; back: [ep, experts/rank, C, M], the same elements
            assert torch.Size(shape).numel() == num_experts * slots * HIDDEN and nbytes == size


def _groups_for(world_sizes):
    import deepspeed.comm as dist
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import groups

    out = {}
    for ep in world_sizes:
        layer = MoE(HIDDEN, expert(), num_experts=4, ep_size=ep)
        name = layer.expert_group_name
        ep_group = groups._get_expert_parallel_group(name)
        edp_group = groups._get_expert_data_parallel_group(name)
        out[name] = (groups._get_expert_parallel_world_size(name),
                     groups._get_expert_parallel_rank(name),
                     groups._get_expert_data_parallel_world_size(name),
                     groups._get_expert_data_parallel_rank(name),
                     [dist.get_global_rank(ep_group, i)
                      for i in range(dist.get_world_size(ep_group))],
                     [dist.get_global_rank(edp_group, i)
                      for i in range(dist.get_world_size(edp_group))])
        from deepspeed.hooks import GRADIENT_GROUP
        assert all(getattr(p, GRADIENT_GROUP) is edp_group
                   for p in layer.deepspeed_moe.experts.parameters())
        assert not hasattr(layer.deepspeed_moe.gate.wg.weight, GRADIENT_GROUP)
    out["max"] = groups._get_max_expert_size_name()
    return out


def test_groups_for_several_ep_sizes_on_four_ranks(dist_pool):
    results = dist_pool.run(_groups_for, world_size=4, args=([2, 4],))
    for rank, got in enumerate(results):
        first = rank - rank % 2
        assert got["ep_size_2"] == (2, rank % 2, 2, rank // 2, [first, first + 1],
                                    [rank % 2, rank % 2 + 2])
        assert got["ep_size_4"] == (4, rank, 1, 0, [0, 1, 2, 3], [rank])
        assert got["max"] == "ep_size_4"


def _ep_not_dividing_world():
    from deepspeed.moe.layer import MoE

    try:
        MoE(HIDDEN, expert(), num_experts=3, ep_size=3)
    except ValueError as exc:
        return str(exc)
    return None


def test_ep_size_must_divide_the_world_size(dist_pool):
    messages = dist_pool.run(_ep_not_dividing_world, world_size=2)
    assert all(m == "MoE ep_size=3 must divide the world size 2" for m in messages)


def _no_grad_forward():
    from deepspeed.moe.layer import MoE

    torch.manual_seed(0)
    layer = MoE(HIDDEN, expert(), num_experts=2, ep_size=2, drop_tokens=False).eval()
    with torch.no_grad():
        out, _, counts = layer(torch.randn(3, 5, HIDDEN))
    return tuple(out.shape), int(counts.sum())


def test_forward_under_no_grad_with_expert_parallelism(dist_pool):
    assert dist_pool.run(_no_grad_forward, world_size=2) == [((3, 5, HIDDEN), 15)] * 2
