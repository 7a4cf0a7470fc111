"""deepspeed.add_config_arguments and how initialize picks its config source."""
import argparse

import pytest
import torch

import deepspeed
from deepspeed.api import _config_source


def test_add_config_arguments_returns_the_same_parser_with_ds_flags():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    assert deepspeed.add_config_arguments(parser) is parser
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "c.json", "--local_rank", "1"])
    assert args.deepspeed is True and args.deepspeed_config == "c.json" and args.local_rank == 1
    args = parser.parse_args([])
    assert args.deepspeed is False and args.deepspeed_config is None
    assert parser.parse_args(["--deepscale_config", "old.json"]).deepscale_config == "old.json"


def test_config_source_from_each_place():
    cfg = {"train_batch_size": 2}
    assert _config_source(None, cfg, None) is cfg
    assert _config_source(None, None, cfg) is cfg
    assert _config_source(argparse.Namespace(deepspeed_config="c.json"), None, None) == "c.json"
    assert _config_source(argparse.Namespace(deepscale_config="o.json"), None, None) == "o.json"


def test_no_config_at_all_says_how_to_pass_one():
    """Raised before anything starts (no process group), naming every way to give a config."""
    from deepspeed.config import DeepSpeedConfigError

    with pytest.raises(DeepSpeedConfigError) as raised:
        deepspeed.initialize(model=torch.nn.Linear(2, 2))
    text = str(raised.value)
    assert "no DeepSpeed config was given" in text
    assert "deepspeed.initialize(config=...)" in text and "--deepspeed_config" in text
    assert "add_config_arguments" in text
    # a script that parsed the flags but was started without one hears about the flag first
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    with pytest.raises(DeepSpeedConfigError, match="args.deepspeed_config is None. Run the script "
                                                   "with --deepspeed_config ds_config.json"):
        deepspeed.initialize(args=parser.parse_args([]), model=torch.nn.Linear(2, 2))


def test_config_source_conflicts_are_errors():
    with pytest.raises(AssertionError, match="deepspeed arguments and deepspeed.initialize"):
        _config_source(argparse.Namespace(deepspeed_config="c.json"), {"a": 1}, None)
    with pytest.raises(AssertionError, match="deepscale"):
        _config_source(argparse.Namespace(deepspeed_config="a", deepscale_config="b"), None, None)
    with pytest.raises(AssertionError, match="both 'config' and 'config_params'"):
        _config_source(None, {"a": 1}, {"a": 2})


def test_initialize_requires_a_model():
    with pytest.raises(AssertionError, match="requires a model"):
        deepspeed.initialize(model=None, config={"train_batch_size": 1})
