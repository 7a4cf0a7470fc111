"""MoE with tensor parallelism on 4 gloo ranks (tp 2 x dp 2, a hand-written Megatron-style mpu)
equals the single-process layer holding every expert unsplit, for ep 2 and ep 1 and both
kinds of expert:

- ``enable_expert_tensor_parallelism=False``: the experts are replicated over the two
  tensor-parallel ranks, each sends half the slots through them and gathers the other half;
- ``True``: the expert is a hand-written column-/row-parallel MLP, every rank sends all slots.

Layer level: outputs, ``l_aux``, counts and input / gate gradients equal the reference on the
rank's own tokens; an expert's gradient summed over the group the engine sums it over
(``GRADIENT_GROUP``) equals the reference expert's gradient summed over the data-parallel
ranks (cut like the expert for the TP expert). Engine level: SGD through
``deepspeed.initialize(mpu=...)`` with the model built before the mpu was registered equals the
reference trained on the global batch. Also: the group layout itself, a checkpoint resumed at the
same tensor-parallel layout (expert files per model-parallel rank), the refusal of expert
groups under sequence parallelism, and ``ds_to_universal`` of an MoE model whose dense layers
(and experts) are split over the tensor ranks, resumed without tensor parallelism."""
import pytest
import torch
from torch import nn

from moe_helpers import HIDDEN, MICRO, expert, global_batches, loss_of, moe_param_groups, \
    train_reference
from tp_helpers import PREFIX, TinyMPU, TPExpert, expert_grads_as_reference, load_layer, \
    reference_expert_state, tp_shards

TP, TOKENS, LR = 2, 24, 0.1
CASES = [(2, False), (2, True), (1, False), (1, True)]  # (ep_size, expert tensor parallel)


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def _layer_matches_reference(ep_size, expert_tp, k, drop_tokens):
    import deepspeed.comm as dist
    from deepspeed.hooks import GRADIENT_GROUP
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import groups

    kwargs = dict(num_experts=4, k=k, drop_tokens=drop_tokens, capacity_factor=0.75,
                  min_capacity=3)
    mpu = TinyMPU(TP)
    torch.manual_seed(0)
    reference = MoE(HIDDEN, expert(), ep_size=1, **kwargs)
    gen = torch.Generator().manual_seed(100 + mpu.dp_rank)  # the same tokens on both TP ranks
    x = torch.randn(2, TOKENS // 2, HIDDEN, generator=gen)
    upstream = torch.randn(2, TOKENS // 2, HIDDEN, generator=gen)

    def run(layer):
        inp = x.clone().requires_grad_(True)
        torch.manual_seed(7)  # the same draws for random token selection / 2nd-expert sampling
        out, l_aux, counts = layer(inp)
        (out * upstream).sum().add(l_aux).backward()
        return out.detach(), l_aux.detach(), counts, inp.grad

    want = run(reference)  # before the mpu is registered: a plain single-process layer
    previous = groups.set_mpu(mpu)
    try:
        parallel = MoE(HIDDEN, TPExpert(TP) if expert_tp else expert(), ep_size=ep_size,
                       enable_expert_tensor_parallelism=expert_tp, **kwargs)
        ep_rank = groups._get_expert_parallel_rank(parallel.expert_group_name)
        assert ep_rank == mpu.dp_rank % ep_size
        load_layer(parallel, reference.state_dict(), ep_rank, expert_tp, TP, mpu.tp_rank,
                   prefix=PREFIX)
        got = run(parallel)
        for g, w in zip(got, want):
            _close(g, w)
        _close(parallel.deepspeed_moe.gate.wg.weight.grad,
               reference.deepspeed_moe.gate.wg.weight.grad)
        reference_grads = []
        for ref_expert in reference.deepspeed_moe.experts.deepspeed_experts:
            grads = {n: p.grad.clone() for n, p in ref_expert.named_parameters()}
            for grad in grads.values():
                dist.all_reduce(grad, group=mpu.dp_group)
            reference_grads.append(grads)
        experts = parallel.deepspeed_moe.experts.deepspeed_experts
        for local, module in enumerate(experts):
            wanted = expert_grads_as_reference(parallel, local, expert_tp, TP, mpu.tp_rank,
                                               reference_grads[ep_rank * len(experts) + local])
            for param, grad in zip(module.parameters(), wanted):
                summed = param.grad.clone()
                dist.all_reduce(summed, group=getattr(param, GRADIENT_GROUP))
                _close(summed, grad)
        marks = [getattr(p, "tensor_model_parallel", None)
                 for p in experts[0].parameters()]
        return marks, dist.get_world_size(group=getattr(experts[0].b2 if expert_tp else
                                                        experts[0][0].weight, GRADIENT_GROUP))
    finally:
        groups.set_mpu(previous)


@pytest.mark.parametrize("k,drop_tokens", [(1, True), (2, False)])
@pytest.mark.parametrize("ep_size,expert_tp", CASES)
def test_tp2_dp2_layer_equals_single_process_reference(dist_pool, ep_size, expert_tp, k,
                                                       drop_tokens):
    results = dist_pool.run(_layer_matches_reference, world_size=4,
                            args=(ep_size, expert_tp, k, drop_tokens))
    for marks, gradient_group_size in results:
        if expert_tp:  # the expert's own marks are kept (b2 is whole on every TP rank)
            assert marks == [True, True, True, False]
            assert gradient_group_size == 2 // ep_size  # expert data parallel, one TP slice
        else:
            assert marks == [False] * 4
            assert gradient_group_size == TP * (2 // ep_size)  # and every TP rank's copy


class TPMoEModel(nn.Module):
    """``moe_helpers.TinyMoEModel`` with a choice of expert (same names and arguments)."""

    def __init__(self, ep_size, expert_tp, num_experts=4, k=1, drop_tokens=True):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.inp = nn.Linear(4, HIDDEN)
        self.moe = MoE(HIDDEN, TPExpert(TP) if expert_tp else expert(), num_experts=num_experts,
                       ep_size=ep_size, k=k, capacity_factor=1.0, min_capacity=2,
                       drop_tokens=drop_tokens, use_rts=False, top2_2nd_expert_sampling=False,
                       enable_expert_tensor_parallelism=expert_tp)
        self.out = nn.Linear(HIDDEN, 3)

    def forward(self, x):
        h, l_aux, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h), l_aux


def _train(ep_size, expert_tp, data, model_kwargs, stage):
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import groups
    from moe_helpers import TinyMoEModel

    mpu = TinyMPU(TP)
    torch.manual_seed(0)
    reference = TinyMoEModel(ep_size=1, **model_kwargs)
    # built before deepspeed.initialize registers the mpu: its groups are rebuilt then
    model = TPMoEModel(ep_size, expert_tp, **model_kwargs)
    ep_rank = mpu.dp_rank % ep_size
    model.inp.load_state_dict(reference.inp.state_dict())
    model.out.load_state_dict(reference.out.state_dict())
    load_layer(model.moe, reference.moe.state_dict(), ep_rank, expert_tp, TP, mpu.tp_rank)
    config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": LR}},
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=moe_param_groups(model),
                                      config=config, mpu=mpu)
    assert groups._get_expert_parallel_rank(model.moe.expert_group_name) == ep_rank
    losses = []
    for step in data:
        x, y = step[mpu.dp_rank][0]
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        engine.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed, group=mpu.dp_group)
        losses.append(summed.item() / mpu.dp)
    params = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    engine.destroy()
    return losses, params, ep_rank, mpu.tp_rank


@pytest.mark.parametrize("stage", [0, 2])
@pytest.mark.parametrize("ep_size,expert_tp", CASES)
def test_tp2_dp2_training_equals_single_process_reference(dist_pool, ep_size, expert_tp, stage):
    kwargs = {"num_experts": 4, "k": 2, "drop_tokens": True}
    data = global_batches(world=2, gas=1, steps=3)
    results = dist_pool.run(_train, world_size=4, args=(ep_size, expert_tp, data, kwargs, stage))
    ref_model, ref_losses, _ = train_reference(data, LR, **kwargs)
    ref_state = {k: v.detach() for k, v in ref_model.state_dict().items()}
    moe_prefix = "moe." + PREFIX
    for losses, params, ep_rank, tp_rank in results:
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        want = {}
        for local in range(4 // ep_size):
            full = reference_expert_state(ref_state, ep_rank * (4 // ep_size) + local, moe_prefix)
            if expert_tp:
                full = tp_shards(full, TP, tp_rank)
            want.update({f"{moe_prefix}{local}.{k}": v for k, v in full.items()})
        want.update({k: v for k, v in ref_state.items() if not k.startswith(moe_prefix)})
        assert sorted(params) == sorted(want)
        for name, value in params.items():
            torch.testing.assert_close(value, want[name], atol=1e-6, rtol=1e-6, msg=name)


def _sequence_parallel_refused():
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import groups

    class SequenceMPU:
        def get_sequence_parallel_world_size(self):
            return 2

    previous = groups.set_mpu(SequenceMPU())
    try:
        MoE(HIDDEN, expert(), num_experts=2, ep_size=2)
    except NotImplementedError as exc:
        return str(exc)
    finally:
        groups.set_mpu(previous)
    return None


def test_expert_parallelism_with_sequence_parallelism_names_the_reason(dist_pool):
    for message in dist_pool.run(_sequence_parallel_refused, world_size=2):
        assert "ep_size=2" in message and "sequence_parallel_size=2" in message


def _groups_under_tp():
    import deepspeed.comm as dist
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import groups

    def ranks(group):
        return [dist.get_global_rank(group, i) for i in range(dist.get_world_size(group=group))]

    mpu = TinyMPU(TP)
    previous = groups.set_mpu(mpu)
    try:
        out = {}
        for ep in (1, 2):
            name = MoE(HIDDEN, expert(), num_experts=2, ep_size=ep).expert_group_name
            out[ep] = [ranks(get(name)) for get in (
                groups._get_expert_parallel_group, groups._get_expert_data_parallel_group,
                groups._get_expert_replica_group, groups._get_expert_model_parallel_group)]
        try:
            MoE(HIDDEN, expert(), num_experts=3, ep_size=3)
            out["ep3"] = None
        except ValueError as exc:
            out["ep3"] = str(exc)
        return out
    finally:
        groups.set_mpu(previous)


def test_expert_groups_are_laid_over_each_tensor_parallel_slice(dist_pool):
    """tp 2 x dp 2 (DP groups [0, 2], [1, 3]): ep 2 splits each DP group, ep 1 keeps it."""
    for rank, got in enumerate(dist_pool.run(_groups_under_tp, world_size=4)):
        tp_rank = rank % 2
        dp_group, tp_group = [tp_rank, tp_rank + 2], [rank - tp_rank, rank - tp_rank + 1]
        # expert parallel, expert data parallel, replica (edp x tp), model parallel (ep x tp)
        assert got[2] == [dp_group, [rank], tp_group, [0, 1, 2, 3]]
        assert got[1] == [[rank], dp_group, [0, 1, 2, 3], tp_group]
        assert got["ep3"] == "MoE ep_size=3 must divide the data-parallel world size 2"


def _save_and_resume(save_dir, ep_size, expert_tp):
    """One step, save, load into a fresh engine at the same layout: same weights and loss."""
    import deepspeed
    from deepspeed.utils import groups

    def engine(seed):
        torch.manual_seed(seed)
        model = TPMoEModel(ep_size, expert_tp, k=2)
        if expert_tp:  # TPExpert starts at zero: give each rank's pieces some values
            for param in model.moe.deepspeed_moe.experts.parameters():
                torch.nn.init.normal_(param, std=0.3)
        config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
                  "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
        return deepspeed.initialize(model=model, model_parameters=moe_param_groups(model),
                                    config=config, mpu=mpu)[0]

    mpu = TinyMPU(TP)
    data = global_batches(world=2, gas=1, steps=2)
    first = engine(0)
    x, y = data[0][mpu.dp_rank][0]
    first.backward(loss_of(first, x, y))
    first.step()
    first.save_checkpoint(save_dir, tag="t")
    x, y = data[1][mpu.dp_rank][0]
    want = loss_of(first, x, y).item()
    saved = {n: p.detach().clone() for n, p in first.module.named_parameters()}
    first.destroy()
    second = engine(1)
    second.load_checkpoint(save_dir, tag="t")
    got = loss_of(second, x, y).item()
    same = all(torch.equal(p, saved[n]) for n, p in second.module.named_parameters())
    second.destroy()
    assert groups.mpu is None
    return same, got == want


@pytest.mark.parametrize("ep_size,expert_tp", [(2, False), (2, True)])
def test_tp2_dp2_checkpoint_resumes_at_the_same_layout(dist_pool, tmp_path, ep_size, expert_tp):
    results = dist_pool.run(_save_and_resume, world_size=4,
                            args=(str(tmp_path), ep_size, expert_tp))
    assert results == [(True, True)] * 4


# ------------------------------------------------ ds_to_universal: MoE with TP-split dense layers
class DenseTPMoEModel(nn.Module):
    """``Linear(4, 16) -> tanh -> Linear(16, HIDDEN) -> MoE -> Linear(HIDDEN, 3)``; with a
    tensor-parallel ``mpu`` the first two are split Megatron's way (column- then row-parallel,
    ``deepspeed.tensor_parallel.layers``: each declares its piece for universal checkpoints),
    and with ``expert_tp`` the experts too (``TPExpert``; without an mpu, whole ones of the
    same names). The weights are the unsplit model's of ``manual_seed(seed)``, whatever the
    layout."""

    def __init__(self, ep_size, seed, mpu=None, expert_tp=False):
        super().__init__()
        from deepspeed.moe.layer import MoE

        torch.manual_seed(seed)
        self.inp, self.proj = nn.Linear(4, 16), nn.Linear(16, HIDDEN)
        reference = MoE(HIDDEN, expert(), num_experts=4, ep_size=1).state_dict()
        self.out = nn.Linear(HIDDEN, 3)
        if mpu is not None:
            self._split(mpu)
        tp, tp_rank = (mpu.tp, mpu.tp_rank) if mpu is not None else (1, 0)
        self.moe = MoE(HIDDEN, TPExpert(tp) if expert_tp else expert(), num_experts=4,
                       ep_size=ep_size, k=1, capacity_factor=1.0, min_capacity=2,
                       use_rts=False, top2_2nd_expert_sampling=False,
                       enable_expert_tensor_parallelism=expert_tp)
        ep_rank = (mpu.dp_rank if mpu is not None else _rank()) % ep_size
        load_layer(self.moe, reference, ep_rank, expert_tp, tp, tp_rank)

    def _split(self, mpu):
        from deepspeed.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

        def piece(tensor, dim):
            return nn.Parameter(tensor.detach().chunk(mpu.tp, dim)[mpu.tp_rank].clone())

        self.inp = ColumnParallelLinear(piece(self.inp.weight, 0), piece(self.inp.bias, 0),
                                        mpu.tp_group)
        self.proj = RowParallelLinear(piece(self.proj.weight, 1),
                                      nn.Parameter(self.proj.bias.detach().clone()),
                                      mpu.tp_group)

    def forward(self, x):
        h, l_aux, _ = self.moe(self.proj(torch.tanh(self.inp(x))))
        return self.out(h), l_aux


def _rank():
    import deepspeed.comm as dist

    return dist.get_rank()


def _dense_tp_engine(ep_size, stage, seed, mpu=None, universal=False, expert_tp=False):
    import deepspeed

    model = DenseTPMoEModel(ep_size, seed, mpu, expert_tp)
    config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(model=model, model_parameters=moe_param_groups(model),
                                config=config, mpu=mpu)[0]


def _dp_mean_steps(engine, steps, dp_rank, dp_group, dp):
    """One Adam step per global batch of ``steps`` (this data-parallel rank's micro-batch);
    the data-parallel mean loss of each."""
    import deepspeed.comm as dist

    losses = []
    for step in steps:
        x, y = step[dp_rank][0]
        loss = loss_of(engine, x, y)
        engine.backward(loss)
        engine.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed, group=dp_group)
        losses.append(summed.item() / dp)
    return losses


def _save_dense_tp(save_dir, stage, expert_tp):
    """tp 2 x dp 2, ep 2: 2 steps, save, 2 more steps (the uninterrupted run's losses)."""
    mpu = TinyMPU(TP)
    engine = _dense_tp_engine(2, stage, 0, mpu, expert_tp=expert_tp)
    data = global_batches(world=2, gas=1, steps=4)
    _dp_mean_steps(engine, data[:2], mpu.dp_rank, mpu.dp_group, mpu.dp)
    engine.save_checkpoint(save_dir, tag="t")
    losses = _dp_mean_steps(engine, data[2:], mpu.dp_rank, mpu.dp_group, mpu.dp)
    engine.destroy()
    return losses


def _resume_dense_tp(universal_dir, ep_size, stage, expert_tp):
    """No tensor parallelism, dp 2, ``ep_size``: the universal checkpoint, then 2 steps."""
    engine = _dense_tp_engine(ep_size, stage, 7, universal=True, expert_tp=expert_tp)
    engine.load_checkpoint(universal_dir, tag="t")
    steps = engine.global_steps
    losses = _dp_mean_steps(engine, global_batches(world=2, gas=1, steps=4)[2:], _rank(), None,
                            2)
    engine.destroy()
    return steps, losses


@pytest.mark.parametrize("stage,expert_tp", [(1, False), (0, False), (1, True)])
def test_moe_with_tp_split_dense_layers_converts_and_resumes_without_tp(dist_pool, tmp_path,
                                                                        stage, expert_tp):
    """An ep-2 MoE model whose dense layers are split over 2 tensor ranks (dp 2) converts:
    ZeRO-1 with the experts replicated over the tensor ranks (their groups partitioned over
    the copies on both tensor ranks) or split over them (``TPExpert``), or no ZeRO (optimizer
    files per expert-parallel rank and tensor rank). The tensor ranks' pieces are joined,
    every expert is under its global id; resumed without tensor parallelism (ep 1 and ep 2 on
    2 ranks, no ZeRO and ZeRO-2), the losses continue the uninterrupted run's."""
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.ds_to_universal import convert
    from deepspeed.checkpoint.universal import load_param_state, read_info

    expected = dist_pool.run(_save_dense_tp, world_size=4,
                             args=(str(tmp_path / "tp"), stage, expert_tp))
    assert all(losses == expected[0] for losses in expected)
    out = convert(str(tmp_path / "tp"), str(tmp_path / "universal"), num_extract_workers=1,
                  num_merge_workers=1)
    info = read_info(out)
    assert info["source"]["tensor_parallel_size"] == 2
    assert info["param_shapes"]["inp.weight"] == [16, 4]
    assert info["param_shapes"]["proj.weight"] == [HIDDEN, 16]
    experts = {n.split(PREFIX)[1].split(".")[0] for n in info["param_shapes"] if PREFIX in n}
    assert experts == {"0", "1", "2", "3"}
    tag_dir = tmp_path / "tp" / "t"
    states = [load_file(tag_dir / f"mp_rank_0{t}_model_states.pt") for t in range(2)]
    split = [("inp.weight", 0), ("proj.weight", 1)]
    if expert_tp:  # the writer's local expert 1 is global expert 1 (ep rank 0)
        split += [(f"moe.{PREFIX}1.w1", 0), (f"moe.{PREFIX}1.w2", 1)]
        assert info["param_shapes"][f"moe.{PREFIX}3.w2"] == [HIDDEN, 16]
    for name, dim in split:
        assert [s["param_slices"][name] for s in states] == [[dim, 2, 0], [dim, 2, 1]]
        saved = [load_file(tag_dir / f"layer_0_expert_1_mp_rank_0{t}_model_states.pt")
                 if PREFIX in name else states[t]["module"] for t in range(2)]
        assert torch.equal(load_param_state(out, name),
                           torch.cat([pieces[name] for pieces in saved], dim)), name
    for ep_size, target_stage in ((1, 0), (2, 2)):
        for steps, losses in dist_pool.run(_resume_dense_tp, world_size=2,
                                           args=(str(tmp_path / "universal"), ep_size,
                                                 target_stage, expert_tp)):
            assert steps == 2
            assert losses == pytest.approx(expected[0], abs=1e-5, rel=0)
