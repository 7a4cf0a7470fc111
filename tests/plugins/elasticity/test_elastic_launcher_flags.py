"""The launcher's plugin-provided flags: checked like any flag, handed to the plugin through the
``deepspeed_launcher_command`` hook, and a clear error when no installed plugin provides them."""
import pytest

from deepspeed.launcher import runner


@pytest.mark.parametrize("argv,needle", [
    (["--autotuning", "tune", "--elastic_training", "x.py"], "cannot be combined"),
    (["--min_elastic_nodes", "2", "x.py"], "need --elastic_training"),
    (["--elastic_training", "--min_elastic_nodes", "3", "--max_elastic_nodes", "2", "x.py"],
     "--max_elastic_nodes (2) is smaller than --min_elastic_nodes (3)"),
    (["--elastic_training", "--max_elastic_nodes", "0", "x.py"], "must be a positive integer"),
])
def test_bad_flag_combinations(argv, needle, capsys):
    assert runner.main(argv) == 1
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("flag,feature", [(["--autotuning", "run"], "autotuning"),
                                          (["--elastic_training"], "elastic training")])
def test_missing_plugin_is_named(flag, feature, monkeypatch, capsys):
    """The flags are the plugins' (``deepspeed_launcher_arguments``); without them installed a
    documented flag still gets a clear message naming what it runs."""
    import deepspeed.plugin_manager as pm

    monkeypatch.setattr(pm, "installed_plugins", lambda: {})
    assert runner.main(flag + ["x.py"]) == 1
    err = capsys.readouterr().err
    assert (f"{flag[0]} is a DeepSpeed launcher flag, but no installed plugin provides it "
            f"(it runs {feature})") in err


def test_elastic_dry_run_prints_the_rendezvous_plan(capsys, monkeypatch):
    monkeypatch.setenv("DS_ELASTIC_KEEP_ALIVE_INTERVAL", "3")
    status = runner.main(["--elastic_training", "--dry_run", "--num_gpus", "2", "--no_ssh",
                          "--node_rank", "0", "--max_elastic_nodes", "3", "--master_port",
                          "29123", "train.py", "--steps", "4"])
    out = capsys.readouterr().out
    assert status == 0
    assert "'min_nodes': 1, 'max_nodes': 3, 'nproc_per_node': 2" in out
    assert "'rdzv_backend': 'c10d', 'rdzv_endpoint': '127.0.0.1:29123'" in out
    assert "'is_host': True" in out
    # a dead node is noticed after 5 missed heartbeats, at the interval the variable sets
    assert "'keep_alive_interval': 3, 'keep_alive_max_attempt': 5" in out
    assert "train.py --local_rank=${local_rank} --steps 4" in out
