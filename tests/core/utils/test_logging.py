"""`deepspeed.utils.log_dist`: which ranks speak, and where the rank comes from.

The logger imports nothing from `deepspeed`; `deepspeed.comm` registers its rank lookup into it.
"""
import logging

import pytest

from deepspeed.utils import logging as ds_logging


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def collected():
    handler = _Collect()
    ds_logging.logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        ds_logging.logger.removeHandler(handler)


@pytest.fixture
def rank_source():
    """Sets a rank source for one test and restores whatever was registered before."""
    previous = ds_logging.set_rank_source(None)
    try:
        yield ds_logging.set_rank_source
    finally:
        ds_logging.set_rank_source(previous)


def test_log_dist_speaks_only_on_the_listed_ranks(collected, rank_source):
    rank_source(lambda: 1)
    ds_logging.log_dist("to zero", ranks=[0])
    ds_logging.log_dist("to one", ranks=[1])
    ds_logging.log_dist("to all", ranks=[-1])
    ds_logging.log_dist("to everyone", ranks=None)
    assert collected == ["[Rank 1] to one", "[Rank 1] to all", "[Rank 1] to everyone"]


def test_without_a_process_group_the_rank_is_the_launchers(collected, rank_source, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    ds_logging.log_dist("no source", ranks=[3])
    rank_source(lambda: None)  # a source that has no process group yet
    ds_logging.log_dist("no group", ranks=[3])
    assert collected == ["[Rank 3] no source", "[Rank 3] no group"]


def test_set_rank_source_rejects_a_non_callable(rank_source):
    with pytest.raises(TypeError, match="callable"):
        rank_source(5)


def test_deepspeed_comm_registers_its_rank(collected, monkeypatch):
    import deepspeed.comm as dist

    assert ds_logging._rank_source is dist._rank_for_logs
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 2)
    monkeypatch.setenv("RANK", "0")
    ds_logging.log_dist("from comm", ranks=[2])
    assert collected == ["[Rank 2] from comm"]
