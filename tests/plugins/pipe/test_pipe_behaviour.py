"""``PipelineEngine`` behaviours beyond the training numbers (2 gloo ranks, 2 stages): monitor
events and the progress line, ``set_batch_fn``, tuples crossing a stage boundary,
``reset_activation_shape``, ``is_gradient_accumulation_boundary``, fp16, ``eval_batch``'s
options and ``training_data`` read by ``train_batch()`` itself. The reference is the
single-process model of ``pipe_training`` on the same data."""
import csv
import logging
import re

import pytest
import torch
from torch import nn

from deepspeed.testing.distributed import DistributedTestError
from pipe_training import (BASE_SEED, HIDDEN, IN, MICRO, OUT, batches, config, mse,
                           reference_model, reference_run, specs)

STEPS = 3


def _engine(gas, extra=None, layers=None, **init_kwargs):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    model = PipelineModule(layers or specs(), num_stages=2, loss_fn=mse, seed_layers=True,
                           base_seed=BASE_SEED, partition_method="uniform")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(gas, "SGD", **(extra or {})), **init_kwargs)
    return engine


# ---------------------------------------------------------------- monitors and the progress line
def _monitored(data, gas, out_dir):
    from deepspeed import comm as dist

    rank = dist.get_rank()
    engine = _engine(gas, {"steps_per_print": 2,
                           "csv_monitor": {"enabled": True, "output_path": f"{out_dir}/{rank}",
                                           "job_name": "pipe"}})
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(handler)
    try:
        losses = [engine.train_batch(iter(batch[0])).item() for batch in data]
        eval_loss = engine.eval_batch(iter(data[0][0])).item()
    finally:
        logger.removeHandler(handler)
    samples = engine.global_samples
    engine.destroy()
    return losses, eval_loss, [m for m in seen if "steps: " in m], samples


def _rows(path):
    with open(path) as handle:
        return list(csv.reader(handle))


def test_monitor_events_and_progress_line_come_from_rank_zero(dist_pool, tmp_path):
    gas, count = 2, 4
    data = batches(count, gas, dp_world=1)
    results = dist_pool.run(_monitored, world_size=2, args=(data, gas, str(tmp_path)))
    (losses, eval_loss, lines, samples), (losses1, _, lines1, _) = results
    assert losses == losses1  # the loss is broadcast along the pipe
    assert samples == count * MICRO * gas
    job = tmp_path / "0" / "pipe"
    train = _rows(job / "Train_Samples_train_loss.csv")
    assert train[0] == ["step", "train_loss"]
    assert [int(step) for step, _ in train[1:]] == [MICRO * gas * (i + 1) for i in range(count)]
    assert [float(v) for _, v in train[1:]] == pytest.approx(losses, abs=1e-6)
    evals = _rows(job / "Train_Samples_eval_loss.csv")
    assert evals[0] == ["step", "eval_loss"]
    assert [(int(s), float(v)) for s, v in evals[1:]] == [(samples, pytest.approx(eval_loss))]
    assert not list((tmp_path / "1").rglob("*.csv"))  # global rank 0 writes, nobody else

    pattern = re.compile(r"steps: (\d+) loss: ([\d.]+) iter time \(s\): ([\d.]+) "
                         r"samples/sec: ([\d.]+)$")
    parsed = [pattern.search(line) for line in lines]
    assert all(parsed) and [int(m.group(1)) for m in parsed] == [2, 4]
    assert [float(m.group(2)) for m in parsed] == pytest.approx([losses[1], losses[3]],
                                                                abs=1e-4)
    assert all(float(m.group(3)) > 0 and float(m.group(4)) > 0 for m in parsed)
    assert lines1 == []


# ---------------------------------------------------------------- set_batch_fn
def _double_labels(batch):
    inputs, labels = batch
    return inputs, labels * 2


def _with_batch_fn(data, gas):
    engine = _engine(gas)
    engine.set_batch_fn(_double_labels)
    losses = [engine.train_batch(iter(batch[0])).item() for batch in data]
    engine.destroy()
    return losses


def test_set_batch_fn_post_processes_every_batch(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    doubled = [[[(x, y * 2) for x, y in rank] for rank in batch] for batch in data]
    expected, _ = reference_run(doubled, optimizer="SGD")
    plain, _ = reference_run(data, optimizer="SGD")
    for losses in dist_pool.run(_with_batch_fn, world_size=2, args=(data, 2)):
        assert losses == pytest.approx(expected, abs=1e-6)
        assert losses[0] != pytest.approx(plain[0], abs=1e-3)


# ---------------------------------------------------------------- a tuple crossing the boundary
class MaskedLinear(nn.Module):
    """``(x, mask) -> (tanh(linear(x)) * mask, mask)``: the int64 mask rides along."""

    def __init__(self, fan_in, fan_out):
        super().__init__()
        self.linear = nn.Linear(fan_in, fan_out)

    def forward(self, inputs):
        x, mask = inputs
        return torch.tanh(self.linear(x)) * mask, mask


class MaskedHead(nn.Module):
    def __init__(self, fan_in, fan_out):
        super().__init__()
        self.linear = nn.Linear(fan_in, fan_out)

    def forward(self, inputs):
        x, mask = inputs
        assert mask.dtype == torch.int64 and not mask.requires_grad
        return self.linear(x) * mask


def _masked_specs():
    from deepspeed.pipe import LayerSpec

    return [LayerSpec(MaskedLinear, IN, HIDDEN), LayerSpec(MaskedLinear, HIDDEN, HIDDEN),
            LayerSpec(MaskedLinear, HIDDEN, HIDDEN), LayerSpec(MaskedHead, HIDDEN, OUT)]


def _masked_data(count, gas, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [[((torch.randn(MICRO, IN, generator=g),
               torch.randint(0, 2, (MICRO, 1), generator=g, dtype=torch.int64)),
              torch.randn(MICRO, OUT, generator=g)) for _ in range(gas)] for _ in range(count)]


def _masked_reference(data):
    from deepspeed.pipe.layers import set_random_seed

    layers = []
    for idx, spec in enumerate(_masked_specs()):
        set_random_seed(BASE_SEED + idx)
        layers.append(spec.build())
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for batch in data:
        opt.zero_grad()
        total = 0.0
        for inputs, y in batch:
            loss = mse(model(inputs), y)
            (loss / len(batch)).backward()
            total += loss.item()
        opt.step()
        losses.append(total / len(batch))
    return losses


def _masked_run(data, gas):
    engine = _engine(gas, layers=_masked_specs())
    losses = [engine.train_batch(iter(batch)).item() for batch in data]
    described = engine.link.sent if engine.is_first_stage() else engine.link.received
    engine.destroy()
    return losses, described


def test_a_tuple_with_an_int64_mask_crosses_the_stage_boundary(dist_pool):
    data = _masked_data(STEPS, 2)
    expected = _masked_reference(data)
    results = dist_pool.run(_masked_run, world_size=2, args=(data, 2))
    for losses, _ in results:
        assert losses == pytest.approx(expected, abs=1e-6)
    # both sides agree: a tuple of a float activation with a gradient and a mask without one
    wanted = (True, [(torch.float32, (MICRO, HIDDEN), True), (torch.int64, (MICRO, 1), False)])
    assert [described for _, described in results] == [wanted, wanted]


# ---------------------------------------------------------------- reset_activation_shape
def _seq_batches(count, gas, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return [[[(torch.randn(MICRO, seq, IN, generator=g), torch.randn(MICRO, seq, OUT, generator=g))
              for _ in range(gas)]] for _ in range(count)]


def _changing_shapes(phases, gas, reset):
    engine = _engine(gas)
    losses = []
    for idx, data in enumerate(phases):
        if idx and reset:
            engine.reset_activation_shape()
        losses += [engine.train_batch(iter(batch[0])).item() for batch in data]
    engine.destroy()
    return losses


def test_reset_activation_shape_lets_the_sequence_length_change(dist_pool):
    phases = [_seq_batches(2, 2, seq=3, seed=1), _seq_batches(2, 2, seq=5, seed=2)]
    expected, _ = reference_run(phases[0] + phases[1], optimizer="SGD")
    for losses in dist_pool.run(_changing_shapes, world_size=2, args=(phases, 2, True)):
        assert losses == pytest.approx(expected, abs=1e-6)


def test_a_changed_shape_without_reset_names_both_shapes(dist_pool):
    phases = [_seq_batches(1, 2, seq=3, seed=1), _seq_batches(1, 2, seq=5, seed=2)]
    # the sending stage raises; the receiving one waits for activations that never come and is
    # stopped by the pool a few seconds after the failure
    with pytest.raises(DistributedTestError) as caught:
        dist_pool.run(_changing_shapes, world_size=2, args=(phases, 2, False), timeout=60)
    assert set(caught.value.failures) == {0}
    message = caught.value.failures[0]
    assert "PipelineError" in message and "reset_activation_shape()" in message
    assert f"[{(MICRO, 3, HIDDEN)}] to [{(MICRO, 5, HIDDEN)}]" in message


# ---------------------------------------------------------------- is_gradient_accumulation_boundary
def _boundary_trace(data, gas):
    engine = _engine(gas)
    current, trace = [None], []

    def probe(where):
        trace.append((current[0], where, engine.is_gradient_accumulation_boundary()))

    def wrap_instruction(method):
        def run(self, instruction):
            current[0] = type(instruction).__name__
            probe("before")
            method(self, instruction)
            probe("after")
            current[0] = None
        return run

    def wrap_call(owner, name):
        method = getattr(owner, name)

        def run(*args, **kwargs):
            probe("inside")
            return method(*args, **kwargs)
        setattr(owner, name, run)

    # every instruction runs through the engine's table (an instance copy shadows the class's)
    engine._INSTRUCTION_MAP = {kind: wrap_instruction(method)
                               for kind, method in type(engine)._INSTRUCTION_MAP.items()}
    engine.module.register_forward_pre_hook(lambda module, args: probe("inside"))  # ForwardPass
    wrap_call(engine.precision, "accumulate_micro_grads")  # BackwardPass
    wrap_call(engine, "allreduce_gradients")  # ReduceGrads
    wrap_call(engine, "_clip_gradients")  # OptimizerStep
    wrap_call(engine.module, "allreduce_tied_weight_gradients")  # ReduceTiedGrads
    outside = engine.is_gradient_accumulation_boundary()
    for batch in data:
        engine.train_batch(iter(batch[0]))
    engine.destroy()
    return outside, trace


def test_gradient_accumulation_boundary_only_inside_reduce_and_step(dist_pool):
    data = batches(2, 3, dp_world=1)
    for outside, trace in dist_pool.run(_boundary_trace, world_size=2, args=(data, 3)):
        assert outside is False
        inside = {(name, value) for name, where, value in trace if where == "inside"}
        assert inside == {("ForwardPass", False), ("BackwardPass", False),
                          ("ReduceTiedGrads", False), ("ReduceGrads", True),
                          ("OptimizerStep", True)}
        assert not any(value for _, where, value in trace if where != "inside")
        assert sum(1 for n, w, _ in trace if (n, w) == ("ForwardPass", "inside")) == 6


# ---------------------------------------------------------------- fp16
def _fp16_run(data, gas):
    engine = _engine(gas, {"fp16": {"enabled": True, "loss_scale": 0,
                                    "initial_scale_power": 8}})
    losses = [engine.train_batch(iter(batch[0])).item() for batch in data]
    dtypes = {p.dtype for p in engine.module.parameters()}
    result = losses, dtypes, engine.skipped_steps, engine.optimizer.cur_scale
    engine.destroy()
    return result


def test_fp16_with_dynamic_loss_scale_trains_close_to_the_fp32_reference(dist_pool):
    data = batches(STEPS, 2, dp_world=1)
    ref_losses, _ = reference_run(data, optimizer="SGD")
    results = dist_pool.run(_fp16_run, world_size=2, args=(data, 2))
    for losses, dtypes, skipped, scale in results:
        assert dtypes == {torch.float16}
        assert skipped == 0 and scale == 2.0 ** 8
        assert losses == pytest.approx(ref_losses, rel=2e-2)
    assert results[0][0] == results[1][0]


# ---------------------------------------------------------------- eval_batch options
def _eval_options(data, gas):
    engine = _engine(gas)
    micro = data[0][0]
    loss, logits = engine.eval_batch(iter(micro), return_logits=True)
    raw = engine.eval_batch(iter(micro), reduce_output=None)
    unbroadcast = engine.eval_batch(iter(micro), bcast_loss=False)
    mean_outputs = engine.eval_batch(iter(micro), compute_loss=False)
    train = engine.train_batch(iter(data[1][0])).item()  # an eval before and after training
    after = engine.eval_batch(iter(micro)).item()
    train2 = engine.train_batch(iter(data[2][0])).item()
    engine.destroy()
    raw = None if raw is None else [v.item() for v in raw]
    logits = None if logits is None else [t.detach() for t in logits]
    unbroadcast = None if unbroadcast is None else unbroadcast.item()
    return loss.item(), logits, raw, unbroadcast, mean_outputs, [train, train2], after


def test_eval_batch_logits_raw_losses_and_eval_between_train_batches(dist_pool):
    data = batches(3, 2, dp_world=1)
    micro = data[0][0]
    with torch.no_grad():
        model = reference_model()
        outputs = [model(x) for x, _ in micro]
        per_micro = [mse(o, y).item() for o, (_, y) in zip(outputs, micro)]
    ref_train, _ = reference_run(data[1:], optimizer="SGD")
    _, stepped = reference_run(data[1:2], optimizer="SGD")
    with torch.no_grad():
        after = sum(mse(stepped(x), y).item() for x, y in micro) / len(micro)
    results = dist_pool.run(_eval_options, world_size=2, args=(data, 2))
    for rank, (loss, logits, raw, unbroadcast, mean_outputs, train, after_eval) in enumerate(
            results):
        assert loss == pytest.approx(sum(per_micro) / 2, abs=1e-6)
        assert train == pytest.approx(ref_train, abs=1e-6)
        assert after_eval == pytest.approx(after, abs=1e-6)
        if rank == 0:  # not the last stage: no logits, no raw losses, no unbroadcast loss
            assert logits is None and raw is None and unbroadcast is None
            assert mean_outputs is None
        else:
            assert len(logits) == 2
            for got, want in zip(logits, outputs):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
            assert raw == pytest.approx(per_micro, abs=1e-6)
            assert unbroadcast == pytest.approx(loss, abs=1e-7)
            # compute_loss=False: the outputs themselves, averaged over the micro-batches
            torch.testing.assert_close(mean_outputs, sum(outputs) / 2, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- training_data given to initialize
class _Pairs(torch.utils.data.Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, idx):
        return self.pairs[idx]


def _samples(data):
    """One (x, y) sample per row, in the order the micro-batches hold them."""
    return [(x[i], y[i]) for batch in data for x, y in batch[0] for i in range(len(x))]


def _from_training_data(data, gas, steps):
    engine = _engine(gas, training_data=_Pairs(_samples(data)))
    losses = [engine.train_batch().item() for _ in range(steps)]
    engine.destroy()
    return losses


def test_train_batch_reads_training_data_itself_and_repeats_it(dist_pool):
    data = batches(2, 2, dp_world=1)
    expected, _ = reference_run(data + data[:1], optimizer="SGD")  # the loader starts over
    for losses in dist_pool.run(_from_training_data, world_size=2, args=(data, 2, 3)):
        assert losses == pytest.approx(expected, abs=1e-6)
