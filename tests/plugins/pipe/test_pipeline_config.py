"""The config's ``pipeline`` section lays out a ``PipelineModule`` left at its defaults:
``stages``, ``partition``, ``seed_layers`` and ``activation_checkpoint_interval`` fill in the
module's arguments at ``deepspeed.initialize``; an argument given that the config contradicts is
an error naming both."""
import pytest
from torch import nn

from pipe_training import BASE_SEED, HIDDEN, MICRO, batches, config, mse, reference_run, specs

PIPELINE_SECTION = {"stages": 2, "partition": "type:Tanh", "seed_layers": True,
                    "activation_checkpoint_interval": 1}
CHECKPOINTED = []


def _counting_checkpoint(function, *args):
    from deepspeed import checkpointing

    CHECKPOINTED.append(len(args))
    return checkpointing.checkpoint(function, *args)


def _laid_out_by_the_config(data):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    # no num_stages, partition_method, seed_layers nor interval: the section decides them
    model = PipelineModule(specs(), loss_fn=mse, base_seed=BASE_SEED,
                           activation_checkpoint_func=_counting_checkpoint)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(2, "SGD", pipeline=PIPELINE_SECTION))
    losses = [engine.train_batch(iter(batch[0])).item() for batch in data]
    laid_out = (engine.num_stages, list(model.parts), len(CHECKPOINTED) > 0)
    engine.destroy()
    return laid_out, losses


def test_the_pipeline_section_lays_out_a_module_left_at_its_defaults(dist_pool):
    from deepspeed.pipe.layers import partition_layers

    data = batches(2, gas=2, dp_world=1)
    expected, _ = reference_run(data, optimizer="SGD")  # layer i seeded with base_seed + i
    by_type = partition_layers(specs(), 2, PIPELINE_SECTION["partition"])
    assert by_type != partition_layers(specs(), 2, "parameters")  # the key must matter
    for laid_out, losses in dist_pool.run(_laid_out_by_the_config, world_size=2, args=(data, )):
        assert laid_out == (2, by_type, True)  # stages, partition, interval (checkpointed)
        assert losses == pytest.approx(expected, rel=1e-5)  # seed_layers: the seeded weights


def test_a_config_key_contradicting_a_given_argument_names_both():
    from deepspeed.pipe import PipelineModule

    module = PipelineModule([nn.Linear(2, 2), nn.Linear(2, 2)], num_stages=1,
                            partition_method="uniform", activation_checkpoint_interval=2)
    with pytest.raises(ValueError, match=r"pipeline.partition.*partition_method='uniform'"):
        module.apply_pipeline_config(partition="parameters")
    with pytest.raises(ValueError, match=r"pipeline.activation_checkpoint_interval \(1\)"):
        module.apply_pipeline_config(activation_checkpoint_interval=1)
    with pytest.raises(ValueError, match=r"pipeline.stages \(2\).*1 stages"):
        module.apply_pipeline_config(stages=2)
    assert module.apply_pipeline_config(stages=1, partition="uniform") is False  # agrees


def test_a_module_without_stages_waits_for_the_config():
    from deepspeed.pipe import PipelineModule

    module = PipelineModule([nn.Linear(2, 2)])
    assert not module.is_laid_out() and list(module.parameters()) == []
    with pytest.raises(RuntimeError, match="num_stages or topology"):
        module.mpu()
    with pytest.raises(RuntimeError, match="pipeline.stages"):
        module.apply_pipeline_config()
    assert module.apply_pipeline_config(stages=1, seed_layers=True) is True
    assert module.num_stages == 1 and len(list(module.parameters())) == 2


# ---------------------------------------------------------------- pipe_partitioned / grad_partitioned
def _tensor_parallel_stages(data, section):
    """2 stages x 2 tensor-parallel ranks (replicated layers: every tensor-parallel rank of a
    stage holds the same activation); what this rank sent across the stage boundary."""
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.pipe.topology import PipeModelDataParallelTopology

    model = PipelineModule(specs(), topology=PipeModelDataParallelTopology(2, 2, 1),
                           loss_fn=mse, seed_layers=True, base_seed=BASE_SEED)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(2, "SGD", pipeline=section))
    losses = [engine.train_batch(iter(batch[0])).item() for batch in data]
    sent = (engine.stage_id, engine.link.sent_bytes)
    engine.destroy()
    return sent, losses


def _whole_and_split(data):
    whole = _tensor_parallel_stages(data, {"pipe_partitioned": False, "grad_partitioned": False})
    return whole, _tensor_parallel_stages(data, {})  # both default to true


def test_partitioned_activations_and_gradients_cross_stages_in_tensor_parallel_shares(dist_pool):
    data = batches(2, gas=2, dp_world=1)
    expected, _ = reference_run(data, optimizer="SGD")
    for whole, split in dist_pool.run(_whole_and_split, world_size=4, args=(data, )):
        (stage, whole_bytes), whole_losses = whole
        (_, split_bytes), split_losses = split
        # stage 0 sends activations only (pipe_partitioned), stage 1 their gradients only
        # (grad_partitioned): 4 micro-batches of MICRO x HIDDEN fp32 tensors each way
        assert whole_bytes == 4 * MICRO * HIDDEN * 4, stage
        assert split_bytes * 2 == whole_bytes, stage  # each tensor-parallel rank sent half
        assert whole_losses == pytest.approx(expected, rel=1e-5)
        assert split_losses == pytest.approx(whole_losses, rel=1e-6)
