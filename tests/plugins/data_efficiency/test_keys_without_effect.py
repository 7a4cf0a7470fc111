"""Documented keys the plugin accepts but does not act on are named, with the reason, once."""
from deepspeed.config.without_effect import keys_without_effect
from deepspeed.data_efficiency.config import DataSamplingCurriculumConfig, RandomLTDConfig


def test_unimplemented_keys_are_reported_only_when_set():
    assert keys_without_effect(RandomLTDConfig(), "r") == []
    assert keys_without_effect(DataSamplingCurriculumConfig(), "c") == []
    [(path, why)] = keys_without_effect(DataSamplingCurriculumConfig(data_cluster_path="/tmp/c"),
                                        "c")
    assert path == "c.data_cluster_path" and "no cluster files" in why
