"""``ds_to_universal`` on MoE checkpoints: a ZeRO-2 run with ep 2 on 4 ranks (dense groups
partitioned over 4 ranks, expert groups over the 2 ranks holding the same experts) converts
into the layout the ep-1 model (every expert) would have saved, and loading it with
``load_universal`` into an ep-1 engine on 1 rank (ZeRO 1, and without ZeRO) gives exactly the
saved engine's fp32 weights and Adam moments. The same holds for an ep-2 checkpoint saved
without ZeRO on 2 ranks (the optimizer state in one file per expert-parallel rank), for one
saved with ZeRO-3 (ep 1 on 2 ranks: the experts are ordinary parameters of its shards) and
with frozen experts: the ZeRO-3 run's, the run without ZeRO's and one ep-2 ZeRO-2 run's
experts' first biases have ``requires_grad=False`` (ZeRO-3 shards them; otherwise they are
whole in the expert files and recorded under the writer's local names). Loaded into an
expert-parallel engine (ep 2 on 2 ranks, ep 4 on 4 ranks; without ZeRO and ZeRO-2), each rank
holds its own experts' saved weights and moments, and the next two steps' losses are the
original checkpoint's resumed at the layout it was saved with."""
import os
import types

import pytest
import torch

from moe_helpers import EXPERTS_PREFIX, ep_model, global_expert_name, loss_of, moe_param_groups

MICRO, IN, OUT, NUM_EXPERTS, TAG = 6, 4, 3, 4, "ckpt"
STATE_KEYS = ("exp_avg", "exp_avg_sq")


# the parameters frozen in the ``frozen`` sources: every expert's first bias
FROZEN_SUFFIX = ".0.bias"


def _engine(ep_size, stage, seed=0, load_universal=False, frozen=False, gas=1):
    import deepspeed

    model, ep_rank = ep_model(ep_size, seed, num_experts=NUM_EXPERTS)
    if frozen:
        for name, param in model.named_parameters():
            if name.startswith(EXPERTS_PREFIX) and name.endswith(FROZEN_SUFFIX):
                param.requires_grad_(False)
    config = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
              "gradient_accumulation_steps": gas,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage}}
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      model_parameters=moe_param_groups(model))
    return engine, ep_rank * model.moe.num_local_experts


def _state_of(engine, stage, first):
    """This rank's fp32 weights and Adam moments (frozen parameters: the weight) under the
    ep-1 (global) names."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, param in engine.module.named_parameters():
        if not param.requires_grad:
            values = {"fp32": safe_get_full_fp32_param(param) if stage == 3 else param}
            values = {"fp32": values["fp32"].detach().float().clone()}
        elif stage == 0:
            state = engine.basic_optimizer.state[param]
            values = {"fp32": param.detach().clone(), **{k: state[k].clone() for k in STATE_KEYS}}
        else:
            values = {"fp32": safe_get_full_fp32_param(param).clone(),
                      **{k: safe_get_full_optimizer_state(param, k).clone() for k in STATE_KEYS}}
        out[global_expert_name(name, first)] = values
    return out


def _swapped_groups(ep_size, build):
    """Drop this process's cached ep groups of ``ep_size``; with ``build``, rebuild them in the
    swapped layout (``use_data_before_expert_parallel_``), which MoE layers then reuse."""
    from deepspeed.utils import groups

    name = groups._expert_group_name(ep_size)
    groups._EXPERT_PARALLEL_GROUP.pop(name, None)
    groups._EXPERT_DATA_PARALLEL_GROUP.pop(name, None)
    if build:
        groups._create_expert_and_data_parallel(ep_size, use_data_before_expert_parallel_=True)


def _save(save_dir, source):
    """2 Adam steps, then this rank's fp32 weights and moments under the ep-1 names."""
    _swapped_groups(source.ep, source.swapped)
    try:
        return _train_and_save(save_dir, source)
    finally:
        if source.swapped:
            _swapped_groups(source.ep, False)


def _train_and_save(save_dir, source):
    import deepspeed.comm as dist

    engine, first = _engine(source.ep, source.stage, frozen=source.frozen)
    g = torch.Generator().manual_seed(1)
    data = [[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
             for _ in range(dist.get_world_size())] for _ in range(2)]
    for step in data:
        x, y = step[dist.get_rank()]
        engine.backward(loss_of(engine, x, y))
        engine.step()
    engine.save_checkpoint(save_dir, tag=TAG)
    out = _state_of(engine, source.stage, first)
    engine.destroy()
    return out


def _merged(results):
    merged = {}
    for values in results:
        for name, value in values.items():
            if name in merged:  # replicas (dense weights, an expert's edp ranks) agree
                for key in value:
                    assert torch.equal(merged[name][key], value[key]), (name, key)
            merged[name] = value
    assert len([n for n in merged if n.startswith(EXPERTS_PREFIX)]) == 4 * NUM_EXPERTS
    return merged


def _load_universal(universal_dir, stage, frozen):
    """An ep-1 engine (different initial weights) loading the universal checkpoint."""
    engine, _ = _engine(1, stage, seed=7, load_universal=True, frozen=frozen)
    engine.load_checkpoint(universal_dir, tag=TAG)
    assert engine.global_steps == 2
    loaded = _state_of(engine, stage, 0)
    for name, param in engine.module.named_parameters():
        assert torch.equal(param.detach().float(), loaded[name]["fp32"]), name
    engine.destroy()
    return loaded


def _source(world, ep, stage, swapped=False, frozen=False):
    return types.SimpleNamespace(world=world, ep=ep, stage=stage, swapped=swapped,
                                 frozen=frozen)


# the source runs: ep 2 under ZeRO-2 (also in the swapped expert layout, and with frozen
# expert biases) or without ZeRO (frozen expert biases); ep 1 under ZeRO-3 (frozen expert
# biases: ZeRO-3 shards them)
SOURCES = {"zero2": _source(4, 2, 2), "zero2_swapped": _source(4, 2, 2, swapped=True),
           "zero2_frozen": _source(4, 2, 2, frozen=True),
           "no_zero_frozen": _source(2, 2, 0, frozen=True),
           "zero3_frozen": _source(2, 1, 3, frozen=True)}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def moe_source(request, dist_pool, tmp_path_factory):
    """A source checkpoint (``SOURCES``), its saved fp32 weights and moments under the ep-1
    names (``saved``) and its universal conversion (``root / "universal"``)."""
    from deepspeed.checkpoint.ds_to_universal import convert

    source = SOURCES[request.param]
    root = tmp_path_factory.mktemp(f"moe_universal_{request.param}")
    saved = _merged(dist_pool.run(_save, world_size=source.world,
                                  args=(str(root / "src"), source)))
    if source.swapped:  # ep groups [0, 2] and [1, 3]: the recorded tables say so
        from deepspeed.checkpoint import load_file

        layer = load_file(root / "src" / TAG / "mp_rank_00_model_states.pt")[
            "moe_checkpoint"]["layers"][0]
        assert layer["expert_parallel_ranks"] == [0, 0, 1, 1]
        assert layer["expert_data_parallel_ranks"] == [0, 1, 0, 1]
    convert(str(root / "src"), str(root / "universal"), num_extract_workers=1,
            num_merge_workers=1)
    return types.SimpleNamespace(root=root, saved=saved, name=request.param, **vars(source))


def test_conversion_holds_every_expert_under_global_names(moe_source):
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.universal import load_param_state, read_info

    root, saved = moe_source.root, moe_source.saved
    out = root / "universal" / TAG
    info = read_info(out)
    assert info["source"]["zero_stage"] == moe_source.stage
    assert info["source"]["dp_world_size"] == moe_source.world
    if moe_source.ep > 1:  # ZeRO-3 keeps no MoE layout: its experts are in its shards
        assert [layer["ep_size"] for layer in info["source"]["moe"]] == [moe_source.ep]
    frozen = sorted(n for n in saved if moe_source.frozen and n.endswith(FROZEN_SUFFIX) and
                    n.startswith(EXPERTS_PREFIX))
    assert sorted(info["frozen_param_shapes"]) == frozen  # every expert's, global names
    assert len(frozen) == (NUM_EXPERTS if moe_source.frozen else 0)
    experts = [n for n in info["group_params"][1]]
    assert sorted(experts + frozen) == sorted(n for n in saved if n.startswith(EXPERTS_PREFIX))
    if moe_source.ep > 1:  # every expert-parallel rank's experts, in global-id order
        assert experts[0].startswith(f"{EXPERTS_PREFIX}0.") and \
            experts[-1].startswith(f"{EXPERTS_PREFIX}{NUM_EXPERTS - 1}.")
    assert "name" not in info["param_groups"][1]  # ep_size_<n>: the saved layout's group name
    assert info["state_keys"] == [sorted(STATE_KEYS)] * 2
    for name, values in saved.items():
        for key, want in values.items():
            assert torch.equal(load_param_state(out, name, key), want), (name, key)
    states = load_file(out / "mp_rank_00_model_states.pt")
    assert "moe_checkpoint" not in states
    assert sorted(states["module"]) == sorted(saved)
    for name, values in saved.items():
        assert torch.equal(states["module"][name], values["fp32"]), name
    assert not [f for f in os.listdir(out) if f.startswith(("layer_", "expp_", "zero_"))]
    assert not (root / "universal" / "tmp").exists()


@pytest.mark.parametrize("stage", [1, 0])
def test_loads_into_an_ep1_engine_on_one_rank(dist_pool, moe_source, stage):
    loaded = dist_pool.run(_load_universal, world_size=1,
                           args=(str(moe_source.root / "universal"), stage,
                                 moe_source.frozen))[0]
    assert sorted(loaded) == sorted(moe_source.saved)
    for name, values in moe_source.saved.items():
        for key, want in values.items():
            assert torch.equal(loaded[name][key], want), (name, key)


def test_incomplete_moe_checkpoints_are_refused(moe_source, tmp_path):
    """A missing expert file, per-expert-parallel-rank optimizer file or ZeRO rank file names
    what is missing."""
    import shutil

    from deepspeed.checkpoint import CheckpointFormatError
    from deepspeed.checkpoint.ds_to_universal import convert, main

    source = tmp_path / TAG
    shutil.copytree(moe_source.root / "src" / TAG, source)
    victim, match = (("zero_pp_rank_1_mp_rank_00_optim_states.pt", "lacks .*zero_pp_rank_1")
                     if moe_source.stage == 3 else
                     ("expp_rank_1_mp_rank_00_optim_states.pt", "deepspeed_experts.2.")
                     if moe_source.stage == 0 else
                     ("layer_0_expert_3_mp_rank_00_model_states.pt", "expert_3"))
    os.remove(source / victim)
    with pytest.raises((CheckpointFormatError, FileNotFoundError), match=match):
        convert(source, tmp_path / "out", num_extract_workers=1, num_merge_workers=1)
    assert main(["--input_folder", str(source), "--output_folder", str(tmp_path / "o")]) == 1


def test_expert_groups_are_cut_by_the_recorded_rank_tables():
    """The swapped layout (``use_data_before_expert_parallel_``: ep groups [0, 2], [1, 3]) as
    the checkpoint records it, and the default one checkpoints without the tables assume."""
    from deepspeed.zero.ds_to_universal_moe import global_groups, group_placement, moe_plan

    layer = {"name": "moe", "num_experts": 4, "ep_size": 2}
    described = [[{"params": [f"{EXPERTS_PREFIX}1.0.weight"], "numels": [8], "padded": 8}]]
    dense = [{"params": ["inp.weight"], "numels": [8], "padded": 8}]
    swapped = dict(layer, expert_parallel_ranks=[0, 0, 1, 1],
                   expert_data_parallel_ranks=[0, 1, 0, 1])
    for entry, want in ((swapped, [(0, 1), (1, 1), (0, 3), (1, 3)]),
                        (layer, [(0, 1), (0, 3), (1, 1), (1, 3)])):
        plan = moe_plan({"moe_checkpoint": {"layers": [entry], "world_size": 4}}, 4)
        got = []
        for rank in range(4):
            world, group_rank, rename = group_placement(plan, described[0], 4, rank)
            assert world == 2
            got.append((group_rank, int(rename(f"{EXPERTS_PREFIX}1.0.weight")
                                        [len(EXPERTS_PREFIX):].split(".")[0])))
            assert group_placement(plan, dense, 4, rank)[:2] == (4, rank)
        assert got == want
    groups = global_groups(plan, [dense] + described,
                           [{"inp.weight": [8]}, {f"{EXPERTS_PREFIX}1.0.weight": [8]}])
    assert list(groups[1]) == [f"{EXPERTS_PREFIX}{e}.0.weight" for e in (1, 3)]


def test_replicated_experts_are_cut_over_the_copies_on_every_tensor_rank(tmp_path):
    """tp 2 x dp 2, ep 2, experts replicated over the tensor ranks (data-parallel groups
    [0, 2] and [1, 3]): the expert groups are partitioned over the ranks holding a copy of
    the same experts on either tensor rank ([0, 1] and [2, 3]), their fragments meet in
    tensor rank 0's folder and only tensor rank 0 merges them."""
    from deepspeed.zero.ds_to_universal_moe import (group_placement, join_tensor_replicas,
                                                    moe_plan, replica_jobs)

    layer = {"name": "moe", "num_experts": 4, "ep_size": 2, "tensor_replicas": 2,
             "expert_parallel_ranks": [0, 0, 1, 1], "expert_data_parallel_ranks": [0] * 4}
    plans = join_tensor_replicas(
        [moe_plan({"moe_checkpoint": {"layers": [layer], "world_size": 4,
                                      "data_parallel_ranks": ranks}}, 2)
         for ranks in ([0, 2], [1, 3])], 2, [str(tmp_path / "t0"), str(tmp_path / "t1")])
    described = [{"params": [f"{EXPERTS_PREFIX}1.0.weight"], "numels": [8], "padded": 8}]
    for tensor_rank, plan in enumerate(plans):
        assert plan[0]["fragments_dir"] == str(tmp_path / "t0")
        for dp_rank in range(2):  # the replica group of ep rank e is [2e, 2e + 1]
            world, rank, rename = group_placement(plan, described, 2, dp_rank)
            assert (world, rank) == (2, tensor_rank)
            global_id = 2 * dp_rank + 1  # local expert 1 of ep rank dp_rank
            assert rename(f"{EXPERTS_PREFIX}1.0.weight") == f"{EXPERTS_PREFIX}{global_id}.0.weight"
        jobs = replica_jobs(plan, {"inp.weight": ("inp.weight", [8], [], 2, "", "", False),
                                   f"{EXPERTS_PREFIX}3.0.weight": (None, [8], [], 2, "", "",
                                                                    False)}, tensor_rank)
        assert {n: j[3] for n, j in jobs.items()} == (
            {"inp.weight": 2, f"{EXPERTS_PREFIX}3.0.weight": 2} if tensor_rank == 0 else
            {"inp.weight": 2})


def test_tensor_parallel_experts_without_recorded_pieces_are_refused(tmp_path):
    from deepspeed.checkpoint import CheckpointFormatError
    from deepspeed.zero.ds_to_universal_moe import with_global_experts

    states = {"moe_checkpoint": {"layers": [{"name": "moe", "num_experts": 4, "ep_size": 2,
                                             "tensor_parallel_experts": 2}], "world_size": 4},
              "module": {}, "param_slices": {"inp.weight": [0, 2, 1]}}
    with pytest.raises(CheckpointFormatError, match=r"rank 1: MoE layer 0 \('moe'\) .* 2 "
                                                    r"tensor-parallel ranks.*partition_dim"):
        with_global_experts(tmp_path, states, [], mp_rank=1)


# ---------------------------------------------------------------- into expert-parallel engines
NEXT_SHARDS = 4  # the global batch of each step after loading: 4 micro-batches


def _next_steps(engine, steps=2):
    """Mean loss over a global batch of ``NEXT_SHARDS`` micro-batches (each rank its share,
    accumulated) for each of ``steps`` Adam steps: the first is the loaded weights' loss, the
    second shows the update made with the loaded moments."""
    import deepspeed.comm as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    share = NEXT_SHARDS // world
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        shards = [(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
                  for _ in range(NEXT_SHARDS)]
        total = torch.zeros(())
        for x, y in shards[rank * share:(rank + 1) * share]:
            loss = loss_of(engine, x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        losses.append(total.item() / NEXT_SHARDS)
    return losses


def _resume_original(source_dir, source):
    """The original checkpoint loaded back at the layout it was saved with, then 2 steps."""
    import deepspeed.comm as dist

    _swapped_groups(source.ep, source.swapped)
    try:
        engine, _ = _engine(source.ep, source.stage, seed=7, frozen=source.frozen,
                            gas=NEXT_SHARDS // dist.get_world_size())
        engine.load_checkpoint(source_dir, tag=TAG)
        losses = _next_steps(engine)
        engine.destroy()
        return losses
    finally:
        if source.swapped:
            _swapped_groups(source.ep, False)


def _load_universal_split(universal_dir, ep_size, stage, frozen):
    import deepspeed.comm as dist

    engine, first = _engine(ep_size, stage, seed=7, load_universal=True, frozen=frozen,
                            gas=NEXT_SHARDS // dist.get_world_size())
    engine.load_checkpoint(universal_dir, tag=TAG)
    assert engine.global_steps == 2
    loaded = _state_of(engine, stage, first)
    for name, param in engine.module.named_parameters():
        assert torch.equal(param.detach(), loaded[global_expert_name(name, first)]["fp32"]), name
    losses = _next_steps(engine)
    engine.destroy()
    return loaded, losses


@pytest.fixture(scope="module")
def resumed_original(dist_pool, moe_source):
    return dist_pool.run(_resume_original, world_size=moe_source.world,
                         args=(str(moe_source.root / "src"), SOURCES[moe_source.name]))[0]


@pytest.mark.parametrize("stage", [0, 2])
@pytest.mark.parametrize("ep_size", [2, 4])
def test_loads_into_an_expert_parallel_engine(dist_pool, moe_source, resumed_original, ep_size,
                                              stage):
    """ep 2 on 2 ranks and ep 4 on 4 ranks: each rank reads its own experts (global id
    ``ep_rank * num_local_experts + local``) and their moments; the next steps' losses are the
    original checkpoint's resumed at its own layout."""
    results = dist_pool.run(_load_universal_split, world_size=ep_size,
                            args=(str(moe_source.root / "universal"), ep_size, stage,
                                  moe_source.frozen))
    held = set()
    for loaded, losses in results:
        for name, values in loaded.items():
            for key, value in values.items():
                assert torch.equal(value, moe_source.saved[name][key]), (name, key)
        held |= set(loaded)
        assert losses == pytest.approx(resumed_original, abs=1e-6)
    assert held == set(moe_source.saved)  # every expert is on some rank
