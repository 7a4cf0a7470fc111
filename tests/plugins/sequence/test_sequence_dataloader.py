"""The Ulysses data-loader adapter: share, pre-shift labels, slice along the sequence."""
import pytest
import torch

from rank_errors import error_of
from sp_helpers import SP


def _adapt(batches_per_rank, seqlen=8):
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    parallel_state.initialize_sequence_parallel(SP)
    try:
        rank = dist.get_rank()
        # rank r's loader yields samples starting at 1 + 100 * r, 1 + 100 * r + 10, ...
        dl = [{"input_ids": torch.arange(1, seqlen + 1).unsqueeze(0) + 100 * rank + 10 * i,
               "labels": torch.arange(1, seqlen + 1).unsqueeze(0) + 100 * rank + 10 * i}
              for i in range(batches_per_rank)]
        adapter = UlyssesSPDataLoaderAdapter(
            dl, sp_rank=parallel_state.get_sequence_parallel_rank(),
            sp_group=parallel_state.get_sequence_parallel_group(),
            sp_world_size=parallel_state.get_sequence_parallel_world_size(), device="cpu")
        return len(adapter), [{k: v.tolist() for k, v in b.items()} for b in adapter]
    finally:
        parallel_state.destroy_sequence_parallel()


def test_adapter_slices_and_preshifts_labels(dist_pool):
    results = dist_pool.run(_adapt, world_size=SP, args=(1,))
    (len0, batches0), (len1, batches1) = results
    assert len0 == len1 == SP == len(batches0) == len(batches1)
    # the first yielded batch is rank 0's sample [1..8], split over the two ranks
    assert batches0[0]["input_ids"] == [[1, 2, 3, 4]]
    assert batches0[0]["shift_labels"] == [[2, 3, 4, 5]]
    assert batches0[0]["position_ids"] == [[0, 1, 2, 3]]
    assert batches1[0]["input_ids"] == [[5, 6, 7, 8]]
    assert batches1[0]["shift_labels"] == [[6, 7, 8, -100]]
    assert batches1[0]["position_ids"] == [[4, 5, 6, 7]]
    assert "labels" not in batches0[0]
    # then rank 1's sample
    assert batches0[1]["input_ids"] == [[101, 102, 103, 104]]
    assert batches1[1]["shift_labels"] == [[106, 107, 108, -100]]


def test_adapter_multiplies_iterations(dist_pool):
    for length, batches in dist_pool.run(_adapt, world_size=SP, args=(3,)):
        assert length == len(batches) == 3 * SP


def test_adapter_refuses_indivisible_sequence(dist_pool):
    for message in dist_pool.run(error_of, world_size=SP, args=(_adapt, 1, 7)):
        assert message is not None
        assert "sequence length 7 is not divisible by sequence_parallel_size 2" in message


def test_adapter_checks_its_arguments():
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    with pytest.raises(ValueError, match="sp_world_size must be an integer >= 1"):
        UlyssesSPDataLoaderAdapter([], sp_rank=0, sp_group=None, sp_world_size=0, device="cpu")
    with pytest.raises(ValueError, match="sp_rank 2 is outside 0..1"):
        UlyssesSPDataLoaderAdapter([], sp_rank=2, sp_group=None, sp_world_size=2, device="cpu")
