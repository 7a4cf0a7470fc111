"""``PipelineEngine.train_batch`` against a single-process ``torch.optim.AdamW`` reference on
the same global batch: 2 ranks (2 stages), 4 ranks (2 stages x 2 replicas, and 4 stages)."""
import pytest
import torch

from pipe_training import batches, pipeline_run, reference_run

STEPS = 3


def _reference_params(model):
    """Reference parameters keyed like the pipeline module's (global layer index)."""
    return {f"{idx}.{name}": p.detach() for idx, layer in enumerate(model.layers)
            for name, p in layer.named_parameters()}


def _check(results, data, tied=False, clip=0.0, optimizer="AdamW"):
    ref_losses, ref_model = reference_run(data, tied=tied, clip=clip, optimizer=optimizer)
    expected = _reference_params(ref_model)
    seen = set()
    for losses, params, info in results:
        assert info[0] == "PipelineEngine"
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        for name, value in params.items():
            if name.startswith("tied_modules."):
                continue
            torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=0)
            seen.add(name)
    tied_layer = {"0.weight"} if tied else set()  # the pipeline keeps it as tied_modules.*
    assert seen == set(expected) - tied_layer


@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
@pytest.mark.parametrize("gas", [1, 4])
def test_two_stages_match_the_reference(dist_pool, gas, optimizer):
    data = batches(STEPS, gas, dp_world=1)
    results = dist_pool.run(pipeline_run, world_size=2, args=(2, data, gas),
                            kwargs={"optimizer": optimizer})
    assert [r[2][1:] for r in results] == [(0, True, False), (1, False, True)]
    _check(results, data, optimizer=optimizer)


@pytest.mark.parametrize("stages", [2, 4])
def test_four_ranks_match_the_reference(dist_pool, stages):
    dp = 4 // stages
    data = batches(STEPS, 2, dp_world=dp)
    results = dist_pool.run(pipeline_run, world_size=4, args=(stages, data, 2),
                            kwargs={"optimizer": "SGD"})
    _check(results, data, optimizer="SGD")


def test_tied_weights_stay_identical_across_stages_and_match_the_reference(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    results = dist_pool.run(pipeline_run, world_size=2, args=(2, data, 2),
                            kwargs={"tied": True, "optimizer": "SGD"})
    _check(results, data, tied=True, optimizer="SGD")
    ref_losses, ref_model = reference_run(data, tied=True, optimizer="SGD")
    tied = [params["tied_modules.proj.weight"] for _, params, _ in results]
    assert torch.equal(tied[0], tied[1])  # both stages hold the same bits
    torch.testing.assert_close(tied[0], ref_model.layers[0].weight.detach(), atol=1e-6, rtol=0)


def test_gradient_clipping_uses_the_norm_over_all_stages(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    results = dist_pool.run(pipeline_run, world_size=2, args=(2, data, 2),
                            kwargs={"tied": True, "optimizer": "SGD",
                                    "extra": {"gradient_clipping": 0.05}})
    _check(results, data, tied=True, clip=0.05, optimizer="SGD")


def test_zero1_inside_stages_equals_the_reference(dist_pool):
    data = batches(STEPS, 2, dp_world=2)
    results = dist_pool.run(pipeline_run, world_size=4, args=(2, data, 2),
                            kwargs={"optimizer": "SGD",
                                    "extra": {"zero_optimization": {"stage": 1},
                                              "zero_allow_untested_optimizer": True}})
    _check(results, data, optimizer="SGD")


def test_activation_checkpointing_gives_the_same_training(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    results = dist_pool.run(pipeline_run, world_size=2, args=(2, data, 2),
                            kwargs={"optimizer": "SGD",
                                    "module_kwargs": {"activation_checkpoint_interval": 1}})
    _check(results, data, optimizer="SGD")


def test_bf16_trains_close_to_the_fp32_reference(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    results = dist_pool.run(pipeline_run, world_size=2, args=(2, data, 2),
                            kwargs={"optimizer": "SGD", "extra": {"bf16": {"enabled": True}}})
    ref_losses, _ = reference_run(data, optimizer="SGD")
    for losses, _, _ in results:
        assert losses == pytest.approx(ref_losses, rel=2e-2)


def _refusals_and_eval():
    import deepspeed
    from deepspeed.pipe import PipelineError, PipelineModule

    from pipe_training import config, specs
    from torch import nn

    model = PipelineModule(specs(), num_stages=2, loss_fn=nn.MSELoss(), seed_layers=True,
                           partition_method="uniform")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(2))
    seen = {}
    for name, call in (("forward", lambda: engine(torch.ones(1))),
                       ("backward", lambda: engine.backward(torch.ones(()))),
                       ("step", engine.step)):
        try:
            call()
        except PipelineError as err:
            seen[name] = str(err)
    data = batches(1, 2, dp_world=1)[0][0]
    with torch.no_grad():
        try:
            engine.train_batch(iter(data))
        except RuntimeError as err:
            seen["no_grad"] = str(err)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    loss = engine.eval_batch(iter(data))
    unchanged = all(torch.equal(p, before[n]) for n, p in engine.module.named_parameters())
    try:
        engine.train_batch(iter(data[:1]))  # one micro-batch of the two a batch needs
    except PipelineError as err:
        seen["exhausted"] = str(err)
    try:
        engine.set_train_batch_size(7)
    except ValueError as err:
        seen["batch"] = str(err)
    engine.set_train_batch_size(8)
    gas = engine.gradient_accumulation_steps()
    engine.destroy()
    return seen, float(loss), unchanged, gas


def test_refusals_eval_batch_and_batch_size(dist_pool):
    from pipe_training import reference_model

    data = batches(1, 2, dp_world=1)[0][0]
    with torch.no_grad():
        model = reference_model()
        expected = sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in data) / 2
    for seen, loss, unchanged, gas in dist_pool.run(_refusals_and_eval, world_size=2):
        assert all("Only train_batch() is accessible" in seen[k]
                   for k in ("forward", "backward", "step"))
        assert "requires gradients enabled" in seen["no_grad"]
        assert loss == pytest.approx(expected, abs=1e-6) and unchanged
        assert "ran out after 1 of 2 micro-batches" in seen["exhausted"]
        assert "must be divisible" in seen["batch"] and "7" in seen["batch"]
        assert gas == 4


def _zero2(stage):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    from pipe_training import config, specs
    from torch import nn

    model = PipelineModule(specs(), num_stages=2, loss_fn=nn.MSELoss())
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(),
                             config=config(2, zero_optimization={"stage": stage}))
    except AssertionError as err:
        return str(err)
    return None


@pytest.mark.parametrize("stage", [2, 3])
def test_zero2_and_zero3_are_refused(dist_pool, stage):
    assert dist_pool.run(_zero2, world_size=2, args=(stage,)) == [
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"] * 2


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_clipping_over_stages_and_replicas_with_and_without_zero1(dist_pool, zero_stage):
    data = batches(STEPS, 2, dp_world=2)
    extra = {"gradient_clipping": 0.05}
    if zero_stage:
        extra.update(zero_optimization={"stage": 1}, zero_allow_untested_optimizer=True)
    results = dist_pool.run(pipeline_run, world_size=4, args=(2, data, 2),
                            kwargs={"tied": True, "optimizer": "SGD", "extra": extra})
    _check(results, data, tied=True, clip=0.05, optimizer="SGD")
