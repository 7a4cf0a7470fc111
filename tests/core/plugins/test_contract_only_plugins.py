"""Plugins written from ``deepspeed.hooks`` alone replace the built-in monitor and comms
logger: the engine exposes their monitor as ``engine.monitor``, they read the step timers
through the declared protocol, and ``deepspeed.comm.log_summary()`` is answered by them, both
for an engine and for ``deepspeed.comm.configure`` without one."""
from pathlib import Path

import pytest
from hook_only import deepspeed_imports

FIXTURE = Path(__file__).with_name("contract_only_plugin.py")


def test_the_fixture_imports_nothing_of_deepspeed_but_the_hook_file():
    assert deepspeed_imports(FIXTURE) == {"deepspeed.hooks"}


def _replace_builtins():
    """Swap the built-in monitor and comms_logger for the fixture's, as a third-party package
    registering the same entry-point names would."""
    from deepspeed import plugin_manager
    from deepspeed.plugin_manager import PluginSpec

    original = plugin_manager.installed_plugins
    installed = original()
    assert {"monitor", "comms_logger"} <= set(installed)
    replaced = dict(installed)
    replaced["monitor"] = PluginSpec("monitor", "contract_only_plugin:ContractMonitor",
                                     "contract-fixture", "0")
    replaced["comms_logger"] = PluginSpec("comms_logger",
                                          "contract_only_plugin:ContractCommsLogger",
                                          "contract-fixture", "0")
    replaced["contract_extras"] = PluginSpec("contract_extras",
                                             "contract_only_plugin:ContractExtras",
                                             "contract-fixture", "0")
    plugin_manager.installed_plugins = lambda: replaced
    return original  # the function itself: it reads entry points again (a later fixture's)


def _train_with_replacements(steps):
    import torch

    import deepspeed
    from deepspeed import comm as dist
    from deepspeed import plugin_manager

    original = _replace_builtins()
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        config = {"train_micro_batch_size_per_gpu": 2, "wall_clock_breakdown": True,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                  "csv_monitor": {"enabled": True, "output_path": "/nonexistent"},
                  "comms_logger": {"enabled": True}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        for _ in range(steps):
            loss = engine(torch.randn(2, 4)).pow(2).mean()
            engine.backward(loss)
            engine.step()
        summary = dist.log_summary()
        events = list(engine.monitor.events)
        plugin_names = sorted(type(p).__name__ for p in engine.plugins.get_plugins())
        engine.destroy()
        # without an engine: deepspeed.comm.configure asks the installed plugins for a logger
        dist.configure(enabled=True)
        dist.all_reduce(torch.ones(1))
        standalone = dist.log_summary()
        dist.configure(enabled=False)
        return plugin_names, events, summary, standalone
    finally:
        plugin_manager.installed_plugins = original


def test_contract_only_plugins_replace_monitor_and_comms_logger(dist_pool):
    for plugin_names, events, summary, standalone in dist_pool.run(
            _train_with_replacements, args=(2,)):
        assert plugin_names == ["ContractCommsLogger", "ContractMonitor"]
        names = [name for name, _, _ in events]
        assert names.count("loss") == 2 and [s for n, _, s in events if n == "loss"] == [1, 2]
        assert {"ms/forward", "ms/backward", "ms/step"} <= set(names)
        assert all(value >= 0 for name, value, _ in events if name.startswith("ms/"))
        assert summary["from"] == "contract" and summary["all_reduce"] == 2
        assert standalone == {"all_reduce": 1}


def _extras_round_trip(save_dir):
    import torch

    import deepspeed
    from deepspeed import plugin_manager

    original = _replace_builtins()
    try:
        torch.manual_seed(0)
        config = {"train_micro_batch_size_per_gpu": 2,
                  "optimizer": {"type": "ContractSGD", "params": {"lr": 0.1}},
                  "contract_extras": {"enabled": True, "momentum": 0.5}}
        engines = []
        for _ in range(2):
            model = torch.nn.Linear(4, 1)
            engine, optimizer, *_ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=config)
            engines.append(engine)
        trained, fresh = engines
        for _ in range(3):
            trained.backward(trained(torch.randn(2, 4)).pow(2).mean())
            trained.step()
        trained.save_checkpoint(save_dir, tag="t")
        fresh.load_checkpoint(save_dir, tag="t")
        extras = [p for p in fresh.plugins.get_plugins() if type(p).__name__ == "ContractExtras"]
        group = trained.basic_optimizer.param_groups[0]
        result = (type(trained.basic_optimizer).__name__, group["momentum"],
                  extras[0].seen.steps, fresh.global_steps)
        for engine in engines:
            engine.destroy()
        return result
    finally:
        plugin_manager.installed_plugins = original


def test_contract_only_plugin_builds_its_optimizer_and_restores_its_state(dist_pool, tmp_path):
    for name, momentum, restored, steps in dist_pool.run(_extras_round_trip,
                                                         args=(str(tmp_path),)):
        assert (name, momentum, restored, steps) == ("SGD", 0.5, 3, 3)
