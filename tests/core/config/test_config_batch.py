"""The batch triangle: train_batch_size = micro * gradient_accumulation_steps * world_size."""
import pytest

from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError, resolve_batch_triangle


@pytest.mark.parametrize("given, world, expected", [
    ((24, 4, 3), 2, (24, 4, 3)),          # all three, consistent
    ((24, 4, None), 2, (24, 4, 3)),       # tbs + micro -> gas
    ((24, None, 3), 2, (24, 4, 3)),       # tbs + gas -> micro
    ((None, 4, 3), 2, (24, 4, 3)),        # micro + gas -> tbs
    ((24, None, None), 2, (24, 12, 1)),   # only tbs -> gas = 1
    ((None, 4, None), 2, (8, 4, 1)),      # only micro -> gas = 1
    ((12, 4, 3), 1, (12, 4, 3)),          # the HF docs' explicit example values
])
def test_any_two_imply_the_third(given, world, expected):
    assert resolve_batch_triangle(*given, world_size=world) == expected


def test_inconsistent_triple_shows_the_equation():
    with pytest.raises(DeepSpeedConfigError) as info:
        resolve_batch_triangle(25, 4, 3, world_size=2)
    message = str(info.value)
    assert "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size" in message
    assert "25 != 4 * 3 * 2 (= 24)" in message


@pytest.mark.parametrize("given, fragment", [
    ((25, 4, None),
     "train_batch_size (25) is not divisible by train_micro_batch_size_per_gpu (4) * world_size (2) = 8"),
    ((25, None, 3), "train_batch_size (25) is not divisible by gradient_accumulation_steps (3) * world_size (2) = 6"),
    ((25, None, None), "train_batch_size (25) is not divisible by world_size (2) = 2"),
])
def test_non_divisible_is_an_error(given, fragment):
    with pytest.raises(DeepSpeedConfigError) as info:
        resolve_batch_triangle(*given, world_size=2)
    assert fragment in str(info.value)


@pytest.mark.parametrize("given", [(None, None, None), (None, None, 4)])
def test_neither_batch_size_given(given):
    with pytest.raises(DeepSpeedConfigError,
                       match="Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"):
        resolve_batch_triangle(*given, world_size=1)


@pytest.mark.parametrize("given, name", [((0, None, None), "train_batch_size"),
                                         ((None, -2, None), "train_micro_batch_size_per_gpu"),
                                         ((8, 4, 0), "gradient_accumulation_steps")])
def test_each_value_must_be_positive(given, name):
    with pytest.raises(DeepSpeedConfigError, match=f"{name}: -?\\d+ has to be greater than 0"):
        resolve_batch_triangle(*given, world_size=1)


@pytest.mark.parametrize("world", [0, -1, 2.0, True])
def test_world_size_must_be_a_positive_int(world):
    with pytest.raises(DeepSpeedConfigError, match="world_size must be a positive int"):
        resolve_batch_triangle(8, None, None, world_size=world)


def test_config_resolves_with_explicit_world_size():
    config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3},
                             world_size=2)
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu,
            config.gradient_accumulation_steps) == (24, 4, 3)
    assert config.to_dict()["train_batch_size"] == 24


def test_world_size_from_mpu():
    class Mpu:
        def get_data_parallel_world_size(self):
            return 4

    config = DeepSpeedConfig({"train_batch_size": 32, "gradient_accumulation_steps": 2}, mpu=Mpu())
    assert config.world_size == 4
    assert config.train_micro_batch_size_per_gpu == 4


def test_world_size_from_env(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 2})
    assert config.world_size == 3 and config.train_batch_size == 6


def test_world_size_from_initialised_process_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 5)
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert DeepSpeedConfig({"train_micro_batch_size_per_gpu": 2}).train_batch_size == 10


def test_batch_error_names_the_config_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 25, "train_micro_batch_size_per_gpu": 4}')
    with pytest.raises(DeepSpeedConfigError) as info:
        DeepSpeedConfig(path, world_size=2)
    assert str(path) in str(info.value)


def test_train_batch_size_sets_the_accumulation_steps():
    """The key's own effect: with the micro-batch given, train_batch_size decides how many
    micro-batches one optimizer step accumulates."""
    config = DeepSpeedConfig({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4},
                             world_size=2)
    assert config.gradient_accumulation_steps == 3 and config.train_batch_size == 24
