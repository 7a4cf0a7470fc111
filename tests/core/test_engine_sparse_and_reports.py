"""`sparse_gradients`, `memory_breakdown` and `dump_state` through the engine on 2 gloo ranks,
against a plain-PyTorch single-process reference on the global batch."""
import pytest
import torch

WORLD, MICRO, STEPS, VOCAB = 2, 3, 3, 12


class Bag(torch.nn.Module):
    """An nn.Embedding(sparse=True) (sparse gradients) followed by a Linear (dense ones)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(VOCAB, 4, sparse=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(dim=1))


def make_data(gas):
    g = torch.Generator().manual_seed(3)
    n = STEPS * gas * MICRO * WORLD
    # ranks draw from overlapping ranges: some rows are touched by both, some by one only
    return torch.randint(0, VOCAB - 2, (n, 5), generator=g), torch.randn(n, 2, generator=g)


def reference(gas, lr=0.1):
    model = Bag()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    tokens, targets = make_data(gas)
    batch = gas * MICRO * WORLD
    for s in range(STEPS):
        sl = slice(s * batch, (s + 1) * batch)
        torch.nn.functional.mse_loss(model(tokens[sl]), targets[sl]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in model.parameters()]


def _train(extra, gas=1, lr=0.1):
    import logging

    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.utils.logging import logger

    lines, ops = [], []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    dist.add_comm_observer(ops.append)
    try:
        model = Bag()
        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
                  "steps_per_print": 100, **extra}
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr), config=config)
        tokens, targets = make_data(gas)
        rank = dist.get_rank()
        for s in range(STEPS):
            for m in range(gas):
                start = s * gas * MICRO * WORLD + rank * gas * MICRO + m * MICRO
                out = engine(tokens[start:start + MICRO])
                engine.backward(torch.nn.functional.mse_loss(out, targets[start:start + MICRO]))
                engine.step()
        engine.destroy()
    finally:
        dist.remove_comm_observer(ops.append)
        logger.removeHandler(handler)
    return {"params": [p.detach() for p in engine.module.parameters()],
            "ops": sorted({record.op for record in ops}), "log": "\n".join(lines)}


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse_gradients", "densified"])
@pytest.mark.parametrize("gas", [1, 2])
def test_sparse_embedding_gradients_average_like_the_global_batch(dist_pool, sparse, gas):
    results = dist_pool.run(_train, args=({"sparse_gradients": sparse}, gas))
    expected = reference(gas)
    for result in results:
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        # sparse: the touched rows travel by all_gather; densified: the whole table is all-reduced
        assert ("all_gather" in result["ops"]) is sparse
        assert "all_reduce" in result["ops"]
    torch.testing.assert_close(results[0]["params"], results[1]["params"], atol=0, rtol=0)


def test_sparse_gradients_with_prescaling_and_a_communication_dtype(dist_pool):
    extra = {"sparse_gradients": True, "prescale_gradients": True, "gradient_predivide_factor": 2.0,
             "communication_data_type": "fp32"}
    results = dist_pool.run(_train, args=(extra,))
    for got, want in zip(results[0]["params"], reference(1)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_memory_breakdown_reports_memory_around_each_step_on_rank_0(dist_pool):
    results = dist_pool.run(_train, args=({"memory_breakdown": True},))
    log = results[0]["log"]
    assert log.count("Engine before step") == STEPS and log.count("Engine after step") == STEPS
    assert "MA " in log and "Max_MA " in log and " CA " in log and "Max_CA " in log
    assert "CPU Virtual Memory:  used = " in log
    assert "Engine before step" not in results[1]["log"]  # rank 0 reports


def test_memory_breakdown_off_reports_nothing_and_dump_state_prints_the_engine(dist_pool):
    results = dist_pool.run(_train, args=({"dump_state": True},))
    log = results[0]["log"]
    assert "Engine before step" not in log and "CPU Virtual Memory" not in log
    assert "DeepSpeedEngine:" in log
    assert "  global_steps ...." in log and "  dp_world_size ...." in log
    assert "DeepSpeedEngine:" not in results[1]["log"]
    quiet = dist_pool.run(_train, args=({},))
    assert "DeepSpeedEngine:" not in quiet[0]["log"]


def test_see_memory_usage_is_silent_unless_forced():
    import logging

    from deepspeed.runtime.utils import see_memory_usage
    from deepspeed.utils.logging import logger

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    try:
        see_memory_usage("not now")
        see_memory_usage("now", force=True)
    finally:
        logger.removeHandler(handler)
    assert len(lines) == 1 and lines[0].startswith("now\nMA ")
