"""Which optimizer a config's ``optimizer`` section builds, and the errors for bad sections."""
import importlib.util

import pytest
import torch

from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
from deepspeed.ops.lamb import FusedLamb
from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
from deepspeed.optimizers import build_optimizer


def config(type_, params=None, **extra):
    section = {"type": type_, "params": params or {}}
    return DeepSpeedConfig({"train_batch_size": 1, "optimizer": section, **extra}, world_size=1)


def build(type_, params=None, parameters=None):
    parameters = parameters if parameters is not None else torch.nn.Linear(2, 2).parameters()
    return build_optimizer(None, config(type_, params), parameters)


def on_device():
    """Params that do not live on the host (what a GPU run passes), without needing a GPU."""
    return [torch.nn.Parameter(torch.empty(2, device="meta"))]


@pytest.mark.parametrize("type_,params,cls,decoupled", [
    ("Adam", {}, DeepSpeedCPUAdam, True),
    ("adam", {"adam_w_mode": False}, DeepSpeedCPUAdam, False),
    ("ADAMW", {"adam_w_mode": False}, DeepSpeedCPUAdam, True),
    ("Adam", {"torch_adam": True}, torch.optim.AdamW, None),
    ("Adam", {"torch_adam": True, "adam_w_mode": False}, torch.optim.Adam, None),
    ("AdamW", {"torch_adam": True, "adam_w_mode": False}, torch.optim.AdamW, None),
    ("Lamb", {}, FusedLamb, None),
    ("Lion", {}, DeepSpeedCPULion, None),
    ("Adagrad", {}, DeepSpeedCPUAdagrad, None),
    ("SGD", {"lr": 0.1}, torch.optim.SGD, None),
    ("sgd", {"lr": 0.1}, torch.optim.SGD, None),
    ("RMSprop", {}, torch.optim.RMSprop, None),
])
def test_config_names_on_the_host(type_, params, cls, decoupled):
    opt = build(type_, params)
    assert type(opt) is cls
    if decoupled is not None:
        assert opt.adamw_mode is decoupled


@pytest.mark.parametrize("type_,params,cls", [
    ("Adam", {}, FusedAdam), ("AdamW", {}, FusedAdam), ("Lion", {}, FusedLion),
    ("Adagrad", {}, torch.optim.Adagrad), ("Lamb", {}, FusedLamb),
])
def test_config_names_on_a_device(type_, params, cls):
    assert type(build(type_, params, on_device())) is cls


def test_adam_w_mode_reaches_fused_adam():
    assert build("Adam", {"adam_w_mode": False}, on_device()).adam_w_mode is False
    assert build("Adam", {}, on_device()).adam_w_mode is True


@pytest.mark.parametrize("device,cls", [("cpu", DeepSpeedCPUAdam), (None, FusedAdam)])
def test_a_plugin_keeping_masters_on_the_host_gets_the_cpu_optimizer(device, cls):
    """``device`` is the ``deepspeed_optimizer_device`` answer (ZeRO-Offload says "cpu")."""
    opt = build_optimizer(None, config("Adam"), on_device(), device=device)
    assert type(opt) is cls


def test_hyperparameters_reach_the_optimizer():
    opt = build("Adam", {"lr": 0.05, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.1,
                         "bias_correction": False})
    group = opt.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"],
            group["bias_correction"]) == (0.05, (0.8, 0.9), 1e-6, 0.1, False)


def test_param_groups_from_a_generator_survive():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    groups = [{"params": model[0].parameters(), "lr": 0.5}, {"params": model[1].parameters()}]
    opt = build("Adam", {"lr": 0.1}, groups)
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.1]


def test_client_optimizer_and_callable():
    model = torch.nn.Linear(2, 1)
    no_section = DeepSpeedConfig({"train_batch_size": 1}, world_size=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert build_optimizer(opt, no_section, list(model.parameters())) is opt
    seen = []
    built = build_optimizer(lambda ps: seen.append(ps) or torch.optim.SGD(ps, lr=0.1),
                            no_section, list(model.parameters()))
    assert isinstance(built, torch.optim.SGD) and len(seen[0]) == 2
    assert build_optimizer(None, no_section, model.parameters()) is None


def test_client_optimizer_errors():
    model = torch.nn.Linear(2, 1)
    no_section = DeepSpeedConfig({"train_batch_size": 1}, world_size=1)
    with pytest.raises(TypeError, match="str is not a subclass of torch.optim.Optimizer"):
        build_optimizer("adam", no_section, list(model.parameters()))
    with pytest.raises(DeepSpeedConfigError, match="keep only one"):
        build_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), config("Adam"),
                        list(model.parameters()))


def test_max_grad_norm_points_at_gradient_clipping():
    with pytest.raises(ValueError, match="gradient_clipping"):
        build("Adam", {"max_grad_norm": 1.0})


def test_unknown_option_names_the_key_and_the_allowed_ones():
    with pytest.raises(DeepSpeedConfigError, match=r"optimizer.params.momentum: not a parameter "
                                                   r"of DeepSpeedCPUAdam, which takes: lr, "):
        build("Adam", {"momentum": 0.9})


def test_a_misspelled_option_gets_the_closest_name():
    with pytest.raises(DeepSpeedConfigError, match=r"optimizer.params.weight_decy: not a "
                                                   r"parameter of DeepSpeedCPUAdam; did you mean "
                                                   r"'weight_decay'\?"):
        build("Adam", {"weight_decy": 0.1})


@pytest.mark.parametrize("params,message", [
    ({"lr": "1e-3x"}, "optimizer.params.lr: expected a number (the default is 0.001), got "
                      "'1e-3x', which is not a number"),
    ({"lr": "1e-3"}, "optimizer.params.lr: expected a number (the default is 0.001), got the "
                     "string '1e-3'; write it without quotes"),
    ({"betas": [0.9]}, "optimizer.params.betas: expected 2 numbers like [0.9, 0.999], got 1"),
    ({"betas": [0.9, None]}, "optimizer.params.betas[1]: expected a number (the default is "
                             "0.999), got None"),
    ({"amsgrad": "yes"}, "optimizer.params.amsgrad: expected true or false, got 'yes'"),
])
def test_a_value_of_the_wrong_kind_names_its_key_path(params, message):
    """Checked against the constructor's signature before it runs: no TypeError from inside."""
    with pytest.raises(DeepSpeedConfigError) as raised:
        build("AdamW", params)
    assert message in str(raised.value)


def test_every_bad_option_is_reported_at_once_for_a_torch_optimizer():
    with pytest.raises(DeepSpeedConfigError) as raised:
        build("SGD", {"lr": "fast", "momentun": 0.9, "nesterov": 1})
    text = str(raised.value)
    assert "3 problems" in text and "optimizer.params.lr: expected a number" in text
    assert "optimizer.params.momentun: not a parameter of SGD; did you mean 'momentum'?" in text
    assert "optimizer.params.nesterov: expected true or false, got 1" in text


def test_torch_adam_cannot_skip_bias_correction():
    with pytest.raises(DeepSpeedConfigError, match="bias_correction"):
        build("Adam", {"torch_adam": True, "bias_correction": False})


def test_unknown_type_suggests_the_closest_name():
    with pytest.raises(DeepSpeedConfigError, match="'Lambb'.*did you mean 'lamb'"):
        build("Lambb")


@pytest.mark.parametrize("type_", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
def test_plugin_types_unknown_to_the_core_are_asked_of_the_plugins(type_):
    """The core knows no plugin's optimizer names (the onebit plugin builds these through
    ``deepspeed_build_optimizer``): without a plugin answering, the error says so."""
    calls = []
    with pytest.raises(DeepSpeedConfigError, match=f"'{type_}'.*nor built by an enabled plugin"):
        build_optimizer(None, config(type_), [], plugin_builder=lambda **kw: calls.append(kw))
    assert calls and calls[0]["name"] == type_


def test_plugin_builder_builds_types_the_core_does_not_know():
    model = torch.nn.Linear(2, 1)
    made = torch.optim.SGD(model.parameters(), lr=0.3)
    seen = {}

    def plugin_builder(name, params, optimizer_params):
        seen.update(name=name, params=params, optimizer_params=optimizer_params)
        return made if name == "OneBitAdam" else None

    got = build_optimizer(None, config("OneBitAdam", {"lr": 0.3, "freeze_step": 2}),
                          model.parameters(), plugin_builder=plugin_builder)
    assert got is made
    assert seen["optimizer_params"] == {"lr": 0.3, "freeze_step": 2}
    assert len(seen["params"]) == 2
    # the core's own names never reach the plugin
    seen.clear()
    build_optimizer(None, config("Adam"), model.parameters(), plugin_builder=plugin_builder)
    assert not seen


def test_mup_types_need_the_mup_package():
    if importlib.util.find_spec("mup") is None:
        with pytest.raises(DeepSpeedConfigError, match="needs the 'mup' package"):
            build("MuAdam")
    else:
        assert type(build("MuAdam")).__name__ == "MuAdam"


@pytest.mark.parametrize("name, expected", [("FusedAdam", "FusedAdam"), ("CPUAdam", "DeepSpeedCPUAdam"),
                                            ("DeepSpeedCPUAdam", "DeepSpeedCPUAdam"),
                                            ("FusedLamb", "FusedLamb")])
def test_deepspeed_class_names_as_config_types(name, expected):
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.optimizers import build_optimizer

    config = DeepSpeedConfig({"train_batch_size": 1, "optimizer": {"type": name,
                                                                   "params": {"lr": 0.1}}},
                             world_size=1)
    opt = build_optimizer(None, config, [torch.nn.Parameter(torch.ones(2))])
    assert type(opt).__name__ == expected
