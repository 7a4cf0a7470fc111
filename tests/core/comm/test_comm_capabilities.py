"""The first-use probe of backend capabilities, and the error classification behind it."""
from datetime import timedelta

import pytest

from deepspeed.comm import capabilities
from deepspeed.comm.errors import (CommTimeoutError, is_timeout_error, is_unsupported_error,
                                   timeout_error)
from deepspeed.comm.work import CompletedWork, WorkHandle


@pytest.fixture(autouse=True)
def _clean():
    capabilities.reset()
    yield
    capabilities.reset()


def _recorder(calls, name, result=None, error=None):
    def run():
        calls.append(name)
        if error is not None:
            raise error
        return result
    return run


def test_refused_op_falls_back_once_and_is_remembered():
    calls = []
    refuse = RuntimeError("ProcessGroupGloo does not support reduce_scatter")
    native = _recorder(calls, "native", error=refuse)
    fallback = _recorder(calls, "fallback", result="via all_reduce")
    assert capabilities.call("reduce_scatter", "gloo", native, fallback) == "via all_reduce"
    assert capabilities.supported("reduce_scatter", "gloo") is False
    assert capabilities.supported("reduce_scatter", "nccl") is None  # per backend
    assert capabilities.call("reduce_scatter", "gloo", native, fallback) == "via all_reduce"
    assert calls == ["native", "fallback", "fallback"]


def test_supported_op_is_remembered_and_later_errors_propagate():
    calls = []
    assert capabilities.call("all_to_all", "gloo", _recorder(calls, "native", result=1),
                             _recorder(calls, "fallback")) == 1
    assert capabilities.supported("all_to_all", "gloo") is True
    refuse = RuntimeError("not supported dtype")
    with pytest.raises(RuntimeError, match="not supported dtype"):
        capabilities.call("all_to_all", "gloo", _recorder(calls, "native", error=refuse),
                          _recorder(calls, "fallback"))
    assert calls == ["native", "native"]


def test_other_errors_are_not_mistaken_for_a_missing_op():
    calls = []
    with pytest.raises(RuntimeError, match="invalid tensor size"):
        capabilities.call("all_to_all", "gloo",
                          _recorder(calls, "native", error=RuntimeError("invalid tensor size")),
                          _recorder(calls, "fallback"))
    assert calls == ["native"]
    assert capabilities.supported("all_to_all", "gloo") is None


def test_override_forces_and_restores():
    calls = []
    with capabilities.override(all_to_all=False):
        capabilities.call("all_to_all", "gloo", _recorder(calls, "native"),
                          _recorder(calls, "fallback"))
        with capabilities.override(all_to_all=True):
            assert capabilities.supported("all_to_all", "gloo") is True
        assert capabilities.supported("all_to_all", "gloo") is False
    assert capabilities.supported("all_to_all", "gloo") is None
    assert calls == ["fallback"]


@pytest.mark.parametrize("message, timeout, unsupported", [
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation",
     True, False),
    ("Application timeout caused pair closure", True, False),
    ("Rank 1 failed to pass monitoredBarrier in 3000 ms", True, False),
    ("ProcessGroupGloo does not support reduce_scatter", False, True),
    ("Cannot use ReduceOp.AVG with Gloo", False, True),
    ("monitored_barrier is only implemented for GLOO backend.", False, True),
    ("Connection closed by peer [127.0.0.1]:4522", False, False),
])
def test_error_classification(message, timeout, unsupported):
    assert is_timeout_error(RuntimeError(message)) is timeout
    assert is_unsupported_error(RuntimeError(message)) is unsupported


def test_async_wait_translates_timeouts():
    class StuckWork:
        def wait(self):
            raise RuntimeError("Timed out waiting 5000ms for recv operation to complete")

        def is_completed(self):
            return False

    handle = WorkHandle(StuckWork(), lambda exc: timeout_error(
        exc, rank=3, op="irecv", group_size=4, timeout=timedelta(seconds=5)))
    assert handle.is_completed() is False  # everything else is the torch Work's
    with pytest.raises(CommTimeoutError, match=r"rank 3 timed out in irecv on a group of 4 "
                                               r"rank\(s\) after 5 s") as info:
        handle.wait()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert CompletedWork().wait() is True
