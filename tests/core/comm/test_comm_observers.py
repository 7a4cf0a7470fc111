"""Comm observers: records with byte counts and bandwidths, no timing cost without observers,
comms_logger settings and the log_summary hand-off."""
import types

import pytest
import torch

from deepspeed.comm import observers
from deepspeed.testing.distributed import run_distributed

GBPS = 8 / 1e9  # bytes/s -> Gbit/s


def _reference_bandwidth(op, size, seconds, n):
    """The tutorial's table, written out independently of deepspeed.comm.observers."""
    if op == "all_reduce":
        return 2 * size / seconds * GBPS, size / seconds * (2 * (n - 1) / n) * GBPS
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        algbw = size * n / seconds * GBPS
        return algbw, algbw * (n - 1) / n
    if op == "all_to_all_single":
        algbw = size / seconds * GBPS
        return algbw, algbw * (n - 1) / n
    return size / seconds * GBPS, size / seconds * GBPS


@pytest.fixture(autouse=True)
def _clean_observers():
    observers.reset()
    yield
    observers.reset()


# --------------------------------------------------------------------------- in this process
@pytest.mark.parametrize("op", ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                                "all_to_all_single", "broadcast", "send"])
@pytest.mark.parametrize("n", [2, 16])
def test_bandwidth_formulas(op, n):
    assert observers.bandwidth(op, 1000, 0.25, n) == pytest.approx(
        _reference_bandwidth(op, 1000, 0.25, n))


def test_busbw_over_algbw_is_the_documented_factor():
    algbw, busbw = observers.bandwidth("reduce_scatter_tensor", 4096, 0.01, 16)
    assert busbw / algbw == pytest.approx(15 / 16)
    assert observers.bandwidth("all_reduce", 4096, 0.0, 4) == (0.0, 0.0)


def test_observer_registry_rejects_bad_calls():
    with pytest.raises(TypeError, match="callable"):
        observers.add_comm_observer(42)
    with pytest.raises(ValueError, match="not a registered comm observer"):
        observers.remove_comm_observer(print)


def test_configure_reads_the_comms_logger_section_then_keywords():
    assert observers.comms_logger_settings() == observers.CommsLoggerSettings(
        enabled=False, verbose=False, prof_all=True, debug=False, prof_ops=[])
    observers.configure({"comms_logger": {"enabled": True, "prof_all": False,
                                          "prof_ops": ["all_reduce", "all_gather"]}})
    observers.configure(debug=True, verbose=True)
    assert observers.comms_logger_settings() == observers.CommsLoggerSettings(
        enabled=True, verbose=True, prof_all=False, debug=True,
        prof_ops=["all_reduce", "all_gather"])
    config_object = types.SimpleNamespace(comms_logger=types.SimpleNamespace(enabled=False))
    observers.configure(config_object)
    assert observers.comms_logger_settings().enabled is False


@pytest.mark.parametrize("kwargs, message", [
    ({"config": {"comms_logger": {"enable": True}}},
     r"unknown key\(s\) \['enable'\] in comms_logger"),
    ({"config": {"comms_logger": {"verbose": "yes"}}},
     "comms_logger.verbose must be true or false"),
    ({"prof_ops": "all_reduce"}, "prof_ops must be a list"),
    ({"debug": 1}, "debug must be true or false"),
])
def test_configure_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        observers.configure(**kwargs)


def test_log_summary_asks_the_observer_that_can_summarise():
    assert observers.log_summary() is None  # no logger plugin: nothing to summarise

    class Summariser:
        def __init__(self):
            self.asked = []

        def __call__(self, record):
            raise AssertionError("no op runs in this test")

        def log_summary(self, show_straggler=False, return_dict=False):
            self.asked.append((show_straggler, return_dict))
            return {"all_reduce": {}} if return_dict else None

    summariser = Summariser()
    observers.add_comm_observer(summariser)
    assert observers.log_summary(show_straggler=True, return_dict=True) == {"all_reduce": {}}
    assert summariser.asked == [(True, True)]


# --------------------------------------------------------------------------- in the ranks
def _rank_records():
    import deepspeed.comm as dist
    from deepspeed.comm import collectives

    synchronize, syncs = collectives._synchronize, []
    collectives._synchronize = lambda: (syncs.append(1), synchronize())
    try:
        dist.all_reduce(torch.ones(256))
        syncs_without_observer = len(syncs)
        records = []
        dist.add_comm_observer(records.append)
        dist.all_reduce(torch.ones(256), log_name="grads", prof=True)  # 1024 bytes
        dist.all_gather_into_tensor(torch.zeros(512), torch.ones(256))  # 1024 per rank
        dist.reduce_scatter_tensor(torch.zeros(128), torch.ones(256))  # 512 per rank
        dist.all_to_all_single(torch.zeros(256), torch.ones(256))  # 1024
        dist.broadcast(torch.ones(64, dtype=torch.float64), src=0)  # 512
        dist.barrier()
        work = dist.all_reduce(torch.ones(10), async_op=True)
        before_wait = len(records)
        work.wait()
        with observers.paused():
            dist.all_reduce(torch.ones(4))
        syncs_with_observer = len(syncs) - syncs_without_observer
        dist.remove_comm_observer(records.append)
        dist.all_reduce(torch.ones(4))
        return {"records": records, "before_wait": before_wait,
                "syncs": (syncs_without_observer, syncs_with_observer, len(syncs))}
    finally:
        collectives._synchronize = synchronize


def test_observers_get_sized_timed_records_and_no_observer_costs_nothing():
    for rank, got in enumerate(run_distributed(_rank_records, world_size=2)):
        records = got["records"]
        assert [(r.op, r.log_name, r.size_bytes, r.group_size, r.rank, r.async_op, r.prof)
                for r in records] == [
            ("all_reduce", "grads", 1024, 2, rank, False, True),
            ("all_gather_into_tensor", "all_gather_into_tensor", 1024, 2, rank, False, False),
            ("reduce_scatter_tensor", "reduce_scatter_tensor", 512, 2, rank, False, False),
            ("all_to_all_single", "all_to_all_single", 1024, 2, rank, False, False),
            ("broadcast", "broadcast", 512, 2, rank, False, False),
            ("barrier", "barrier", 0, 2, rank, False, False),
            ("all_reduce", "all_reduce", 40, 2, rank, True, False),
        ]
        assert got["before_wait"] == 6  # the async op reports when its wait() returns
        # 6 synchronous ops synchronise before and after, the async one once after its wait;
        # without an observer nothing synchronises
        assert got["syncs"] == (0, 13, 13)
        for record in records:
            assert record.caller == "_rank_records"
            assert record.latency_s > 0
            assert (record.algbw_gbps, record.busbw_gbps) == pytest.approx(
                _reference_bandwidth(record.op, record.size_bytes, record.latency_s, 2))
        ratios = {r.op: r.busbw_gbps / r.algbw_gbps for r in records if r.algbw_gbps}
        assert ratios == pytest.approx({"all_reduce": 0.5, "all_gather_into_tensor": 0.5,
                                        "reduce_scatter_tensor": 0.5, "all_to_all_single": 0.5,
                                        "broadcast": 1.0})
