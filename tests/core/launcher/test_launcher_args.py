"""The ``deepspeed`` command's flags as code written against upstream uses them: unambiguous
prefixes (argparse's default), plugin flags included, never reaching into the user script's own
arguments; and ``deepspeed.launcher.runner.parse_resource_filter`` on a host table."""
from collections import OrderedDict

import pytest

from deepspeed.launcher import runner
from deepspeed.launcher.flag_prefixes import expand_flag_prefixes


def test_unambiguous_prefixes_of_launcher_flags():
    args = runner.parse_args(["--num_g", "2", "--master_p=29600", "--no_loc", "--bind_cores",
                              "train.py", "--lr", "1"])
    assert (args.num_gpus, args.master_port, args.no_local_rank, args.bind_cores_to_rank) == \
        (2, 29600, True, True)
    assert args.user_script == "train.py" and args.user_args == ["--lr", "1"]
    # a plugin's command sees the flags written out in full
    assert args.command_line[:4] == ["--num_gpus", "2", "--master_port=29600", "--no_local_rank"]


def test_ambiguous_prefix_is_a_usage_error_naming_the_candidates(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["--num", "2", "train.py"])
    err = capsys.readouterr().err
    assert "ambiguous option: --num could match" in err and "--num_nodes" in err and "--num_gpus" in err


def test_the_script_arguments_are_never_expanded_or_rejected():
    """Tokens after the script that look like (ambiguous) launcher prefixes are the user's."""
    user = ["--num=3", "--master", "x", "--no", "-i", "--include_path", "p"]
    args = runner.parse_args(["-i", "localhost:0", "train.py", *user])
    assert args.include == "localhost:0" and args.user_args == user
    # a flag's value that looks like a prefix stays a value
    assert expand_flag_prefixes(["--master_addr", "--num", "s.py", "--num"],
                                runner.build_parser().flag_actions) == \
        ["--master_addr", "--num", "s.py", "--num"]


def test_plugin_flags_accept_prefixes_too():
    """``--autotuning`` is the autotuning plugin's flag (deepspeed_launcher_arguments)."""
    args = runner.parse_args(["--autotun", "tune", "--num_gpus", "1", "train.py",
                              "--deepspeed", "ds.json"])
    assert args.autotuning == "tune"
    assert [a.option_strings[0] for a in args.plugin_flags] == ["--autotuning"]
    assert args.command_line[:2] == ["--autotuning", "tune"]


def test_unknown_flag_is_still_unknown(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["--nonsense", "train.py"])
    assert "--nonsense" in capsys.readouterr().err


def test_parse_resource_filter_from_the_runner():
    hosts = OrderedDict([("worker-0", [0, 1, 2, 3]), ("worker-1", [0, 1, 2, 3])])
    assert runner.parse_resource_filter(hosts, include_str="worker-1:0,2") == {"worker-1": [0, 2]}
    assert runner.parse_resource_filter(hosts, exclude_str="worker-0@worker-1:3") == \
        {"worker-1": [0, 1, 2]}
    assert runner.parse_resource_filter(hosts) == hosts
    with pytest.raises(ValueError, match="mutually exclusive"):
        runner.parse_resource_filter(hosts, include_str="worker-0", exclude_str="worker-1")
