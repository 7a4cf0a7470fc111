"""Checkpoints (state saved and restored, errors reset, mask never restored) and composition with
fp16 / bf16 / ZeRO / MoE / pipeline, on 2 gloo ranks."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed

from onebit_training import (config, data, engine, eval_loss, identical_on_all_ranks, masters,
                             train)

FREEZE = 2


def _groups(net, masked=False):
    first = {"params": [net[0].weight]}
    if masked:
        first["exp_avg_mask"] = torch.ones(16, 1)
        first["exp_avg_mask"][:2] = 0.0
    return [first, {"params": [p for p in net.parameters() if p is not net[0].weight]}]


def _groups_with_mask(net):
    return _groups(net, masked=True)


def _checkpoint(opt_type, save_dir):
    from deepspeed import comm as dist

    params = {"OneBitAdam": dict(freeze_step=FREEZE), "OneBitLamb": dict(freeze_step=FREEZE),
              "ZeroOneAdam": dict(var_freeze_step=FREEZE, local_step_scaler=1,
                                  local_step_clipper=2)}[opt_type]
    x, y = data(8, dist.get_world_size())
    eng = engine(config(opt_type, lr=1e-2, **params), model_parameters=_groups_with_mask)
    train(eng, 5, x, y)
    opt = eng.basic_optimizer
    errors_before = float(opt.compressor.worker_error.abs().sum())
    saved_state = {k: v.clone() for k, v in opt.state[masters(eng)[1]].items()
                   if torch.is_tensor(v)}
    saved_step = opt.step_count
    saved_dict = opt.state_dict()
    eng.save_checkpoint(save_dir, tag="t")

    fresh = engine(config(opt_type, lr=1e-2, **params), model_parameters=_groups)  # no mask
    fresh.load_checkpoint(save_dir, tag="t")
    loaded = fresh.basic_optimizer
    restored = loaded.state[masters(fresh)[1]]
    return {
        "errors_before": errors_before,
        "errors_after": float(loaded.compressor.worker_error.abs().sum()
                              + loaded.compressor.server_error.abs().sum()),
        "state_equal": all(torch.equal(v, restored[k]) for k, v in saved_state.items()
                           if k not in ("sync_base", "momentum_accumulator")),
        "step": (saved_step, loaded.step_count),
        "mask_in_saved": any("exp_avg_mask" in g for g in saved_dict["param_groups"]),
        "mask_after_load": any("exp_avg_mask" in g for g in loaded.param_groups),
        "allreduce_flag": loaded.enable_backward_allreduce,
        "params_equal": all(torch.equal(a, b) for a, b in zip(eng.module.parameters(),
                                                               fresh.module.parameters())),
        "continues": train(fresh, 2, x, y, first_step=5) is not None,
    }


@pytest.mark.parametrize("opt_type", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
def test_checkpoint_resets_errors_and_never_restores_mask(opt_type, tmp_path):
    for r in run_distributed(_checkpoint, world_size=2, args=(opt_type, str(tmp_path))):
        assert r["errors_before"] > 0  # compression ran and left errors behind
        assert r["errors_after"] == 0.0
        assert r["state_equal"] and r["params_equal"]
        assert r["step"][0] == r["step"][1] == 5
        assert not r["mask_in_saved"] and not r["mask_after_load"]
        assert r["allreduce_flag"] is False  # step 6 is past every warm-up
        assert r["continues"]


def _mask_supplied_again(save_dir):
    from deepspeed import comm as dist

    x, y = data(8, dist.get_world_size())
    eng = engine(config("OneBitAdam", lr=1e-2, freeze_step=FREEZE), model_parameters=_groups)
    train(eng, 3, x, y)
    eng.save_checkpoint(save_dir, tag="t")
    fresh = engine(config("OneBitAdam", lr=1e-2, freeze_step=FREEZE),
                   model_parameters=_groups_with_mask)
    fresh.load_checkpoint(save_dir, tag="t")
    train(fresh, 2, x, y, first_step=3)
    return float(fresh.basic_optimizer.state[masters(fresh)[0]]["exp_avg"][:2].abs().max())


def test_mask_of_the_new_run_applies_after_load(tmp_path):
    assert run_distributed(_mask_supplied_again, world_size=2, args=(str(tmp_path),)) == [0.0,
                                                                                         0.0]


def _precision(precision, opt_type):
    from deepspeed import comm as dist

    key = "var_freeze_step" if opt_type == "ZeroOneAdam" else "freeze_step"
    extra = {"local_step_scaler": 1, "local_step_clipper": 1} if opt_type == "ZeroOneAdam" else {}
    x, y = data(12, dist.get_world_size())
    eng = engine(config(opt_type, precision=precision, lr=1e-2, **{key: 3}, **extra))
    before = eval_loss(eng, x, y)
    history = train(eng, 12, x, y)
    return (before, eval_loss(eng, x, y), identical_on_all_ranks(list(eng.module.parameters())),
            [op for op, _ in history[-1][1]], next(eng.module.parameters()).dtype)


@pytest.mark.parametrize("precision", ["fp16", "bf16", None])
@pytest.mark.parametrize("opt_type", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
def test_precisions(precision, opt_type):
    for before, after, identical, ops, dtype in run_distributed(_precision, world_size=2,
                                                                args=(precision, opt_type)):
        assert after < before and identical
        assert "all_to_all_single" in ops
        # fp16 checks overflow with one 4-byte all-reduce; no gradient all-reduce otherwise
        assert ops.count("all_reduce") == (1 if precision == "fp16" else 0)
        assert dtype == {"fp16": torch.float16, "bf16": torch.bfloat16, None: torch.float32}[
            precision]


def _initialize_error(extra):
    import deepspeed

    cfg = config("OneBitAdam", freeze_step=2)
    cfg.update(extra)
    try:
        engine(cfg)
    except (deepspeed.plugin_manager.PluginError, AssertionError, ValueError) as exc:
        return str(exc)
    return ""


def test_zero_is_excluded_naming_both_plugins():
    for msg in run_distributed(_initialize_error, world_size=2,
                               args=({"zero_optimization": {"stage": 1}},)):
        assert "'onebit'" in msg and "'zero'" in msg


def test_zero_stage_0_is_fine():
    assert run_distributed(_initialize_error, world_size=2,
                           args=({"zero_optimization": {"stage": 0}},)) == ["", ""]
