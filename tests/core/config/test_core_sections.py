

def test_partition_activation_singular_is_accepted_with_a_warning():
    import warnings

    from deepspeed.config import DeepSpeedConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = DeepSpeedConfig({"train_batch_size": 1,
                               "activation_checkpointing": {"partition_activation": True}},
                              world_size=1)
    assert cfg.section("activation_checkpointing").partition_activations is True
    assert any("partition_activation" in str(w.message) for w in caught)
