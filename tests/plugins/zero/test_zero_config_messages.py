"""What ZeRO's config says to the user: an invalid stage names the value once, and
``elastic_checkpoint`` (honoured: a checkpoint saved on N ranks is re-partitioned for M, see
test_zero_checkpoint.py) is not called ignored."""
import pytest

from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from deepspeed.zero.aio_config import AioConfig
from deepspeed.zero.config import DeepSpeedZeroConfig

SECTIONS = {"zero_optimization": DeepSpeedZeroConfig, "aio": AioConfig}


def _config(zero):
    return DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": zero},
                           sections=SECTIONS, world_size=1)


def test_an_invalid_stage_is_named_once():
    with pytest.raises(DeepSpeedConfigError) as caught:
        _config({"stage": 4})
    message = str(caught.value)
    assert "zero_optimization.stage: must be 0, 1, 2 or 3, got 4" in message
    assert message.count("got 4") == 1, message


def test_elastic_checkpoint_is_not_called_ignored():
    from unittest import mock

    from deepspeed.utils.logging import logger

    with mock.patch.object(logger, "warning") as warning:
        config = _config({"stage": 2, "elastic_checkpoint": True})
    assert config.section("zero_optimization").elastic_checkpoint is True
    said = [str(call.args[0]) for call in warning.call_args_list if call.args]
    assert [line for line in said if "elastic_checkpoint" in line] == []


@pytest.mark.parametrize("stage, warned", [(1, 1), (2, 0)])
def test_bf16_immediate_grad_update_is_warned_once_under_stage_1_only(stage, warned):
    from unittest import mock

    import torch

    from deepspeed.utils.logging import logger
    from deepspeed.zero import plugin

    plugin._warn_immediate_grad_update_stage_1.cache_clear()
    config = DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": {"stage": stage},
                              "bf16": {"enabled": True, "immediate_grad_update": True}},
                             sections=SECTIONS, world_size=1)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    with mock.patch.object(logger, "warning") as warning:
        for _ in range(2):
            plugin.check_optimizer(config, config.section("zero_optimization"), optimizer)
    said = [str(call.args[0]) for call in warning.call_args_list if call.args]
    about = [line for line in said if "immediate_grad_update" in line]
    assert len(about) == warned and all("stage 2" in line for line in about)
