"""What ZeRO's config says to the user: an invalid stage names the value once, and
``elastic_checkpoint`` (honoured: a checkpoint saved on N ranks is re-partitioned for M, see
test_zero_checkpoint.py) is not called ignored."""
import logging

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


@pytest.fixture
def warnings_seen():
    from deepspeed.utils.logging import logger

    lines = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def test_elastic_checkpoint_is_not_called_ignored(warnings_seen):
    config = _config({"stage": 2, "elastic_checkpoint": True})
    assert config.section("zero_optimization").elastic_checkpoint is True
    assert [line for line in warnings_seen if "elastic_checkpoint" in line] == []
