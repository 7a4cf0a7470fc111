"""ProcessTopology (every documented example, exactly) and PipelineParallelGrid's groups on two
gloo ranks."""
import pytest

from deepspeed.pipe.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                     ProcessTopology, _prime_factors)


@pytest.fixture
def xy():
    return ProcessTopology(axes=["x", "y"], dims=[2, 3])


@pytest.fixture
def pdm():
    return ProcessTopology(["pipe", "data", "model"], [2, 2, 2])


def test_row_major_mapping(xy):
    assert [xy.get_rank(x=i, y=j) for i in range(2) for j in range(3)] == [0, 1, 2, 3, 4, 5]
    assert xy.get_rank(x=0, y=1) == 1
    assert xy.axes == ["x", "y"] and xy.dims == [2, 3]
    assert xy.world_size() == 6
    assert xy.mapping[xy.ProcessCoord(x=1, y=2)] == 5
    assert str(xy) == str(xy.mapping)


def test_get_rank_errors(xy):
    with pytest.raises(ValueError) as err:
        xy.get_rank(x=0)
    assert str(err.value) == "get_rank() does not support slices. Use filter_match())"
    with pytest.raises(AssertionError, match="invalid"):
        xy.get_rank(x=2, y=0)
    with pytest.raises(ValueError, match="'z'"):
        xy.get_rank(x=0, y=0, z=0)


def test_axis_names_and_dims(xy):
    assert xy.get_axis_names() == ["x", "y"]
    assert xy.get_dim("y") == 3 and xy.get_dim("x") == 2
    assert xy.get_dim("pipe") == 0


def test_get_coord(xy):
    coord = xy.get_coord(1)
    assert (coord.x, coord.y) == (0, 1)
    assert coord == xy.ProcessCoord(x=0, y=1)
    assert type(coord).__name__ == "ProcessCoord" and coord._fields == ("x", "y")
    assert [tuple(xy.get_coord(r)) for r in range(6)] == [(i, j) for i in range(2)
                                                          for j in range(3)]
    for bad in (6, -1, "1"):
        with pytest.raises(ValueError) as err:
            xy.get_coord(bad)
        assert str(err.value) == f"rank {bad} not found in topology."


def test_get_rank_repr():
    ab = ProcessTopology(["a", "b"], [2, 2])
    assert ab.get_rank_repr(3) == "a_01-b_01"
    assert ab.get_rank_repr(3, omit_axes=["a"]) == "b_01"
    topo = ProcessTopology(["pipe", "data", "model"], [2, 2, 2])
    assert topo.get_rank_repr(5) == "model_01"
    assert topo.get_rank_repr(5, omit_axes=[]) == "pipe_01-data_00-model_01"
    assert topo.get_rank_repr(5, omit_axes=[], inner_sep="=", outer_sep="|") == \
        "pipe=01|data=00|model=01"
    assert PipeDataParallelTopology(2, 2).get_rank_repr(3) == ""


def test_axis_comm_lists(pdm):
    assert pdm.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert pdm.get_axis_comm_lists("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert pdm.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pdm.get_axis_comm_lists("tensor") == []


def test_filter_match_and_axis_list(pdm, xy):
    assert pdm.filter_match(pipe=0, data=1) == [2, 3]
    assert [pdm.get_coord(r) for r in (2, 3)] == [pdm.ProcessCoord(pipe=0, data=1, model=m)
                                                  for m in (0, 1)]
    assert pdm.filter_match() == list(range(8))
    assert xy.get_axis_list("x", 0) == [0, 1, 2]
    assert xy.get_axis_list("y", 0) == [0, 3]
    with pytest.raises(ValueError, match="'z'"):
        xy.filter_match(z=0)


def test_pipeline_topologies():
    pd = PipeDataParallelTopology(num_pp=2, num_dp=3)
    assert pd.get_axis_names() == ["pipe", "data"] and pd.dims == [2, 3]
    pmd = PipeModelDataParallelTopology(2, 2, 1)
    assert pmd.get_axis_names() == ["pipe", "data", "model"] and pmd.dims == [2, 1, 2]
    assert PipeModelDataParallelTopology(num_pp=1, num_mp=4, num_dp=2).dims == [1, 2, 4]


@pytest.mark.parametrize("axes,dims,match", [(["x"], [1, 2], "one dimension per axis"),
                                             (["x", "x"], [1, 2], "unique"),
                                             (["x"], [0], "'x'")])
def test_bad_topologies(axes, dims, match):
    with pytest.raises(ValueError, match=match):
        ProcessTopology(axes, dims)


def test_prime_factors():
    assert _prime_factors(1) == [] and _prime_factors(12) == [2, 2, 3]
    assert _prime_factors(9) == [3, 3] and _prime_factors(97) == [97]
    with pytest.raises(ValueError):
        _prime_factors(0)


# ---------------------------------------------------------------- the grid on two gloo ranks
def _grid_report(num_pp, num_dp):
    import torch

    from deepspeed import comm as dist
    from deepspeed.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid

    grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp))
    ones = torch.ones(1)
    dist.all_reduce(ones, group=grid.get_data_parallel_group())
    pipe_sum = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(pipe_sum, group=grid.get_pipe_parallel_group())
    slice_ones = torch.ones(1)
    dist.all_reduce(slice_ones, group=grid.get_slice_parallel_group())
    return {
        "stage": grid.get_stage_id(),
        "pipe": (grid.get_pipe_parallel_rank(), grid.get_pipe_parallel_world_size(),
                 dist.get_world_size(group=grid.get_pipe_parallel_group())),
        "data": (grid.get_data_parallel_rank(), grid.get_data_parallel_world_size(),
                 dist.get_world_size(group=grid.get_data_parallel_group())),
        "model": (grid.get_model_parallel_rank(), grid.get_model_parallel_world_size(),
                  dist.get_world_size(group=grid.get_model_parallel_group())),
        "slice": (grid.get_slice_parallel_rank(), grid.get_slice_parallel_world_size(),
                  dist.get_world_size(group=grid.get_slice_parallel_group())),
        "tensor": (grid.get_tensor_model_parallel_rank(),
                   grid.get_tensor_model_parallel_world_size()),
        "first_last": (grid.is_first_stage(), grid.is_last_stage()),
        "global": grid.get_global_rank(),
        "stage_to_global": [grid.stage_to_global(s) for s in range(num_pp)],
        "dp_sum": ones.item(),
        "pipe_rank_sum": pipe_sum.item(),
        "slice_sum": slice_ones.item(),
    }


def test_grid_two_stages(dist_pool):
    r0, r1 = dist_pool.run(_grid_report, world_size=2, args=(2, 1))
    assert (r0["stage"], r1["stage"]) == (0, 1)
    assert (r0["first_last"], r1["first_last"]) == ((True, False), (False, True))
    assert (r0["pipe"], r1["pipe"]) == ((0, 2, 2), (1, 2, 2))
    assert (r0["data"], r1["data"]) == ((0, 1, 1), (0, 1, 1))
    # one copy of the model spans both stages: each stage numbers its own mp_rank_XX files
    assert (r0["model"], r1["model"]) == ((0, 2, 2), (1, 2, 2))
    assert r0["slice"] == r1["slice"] == (0, 1, 1) and r0["tensor"] == (0, 1)
    assert (r0["global"], r1["global"]) == (0, 1)
    assert r0["stage_to_global"] == r1["stage_to_global"] == [0, 1]
    assert r0["dp_sum"] == r1["dp_sum"] == 1.0
    assert r0["pipe_rank_sum"] == r1["pipe_rank_sum"] == 1.0
    assert r0["slice_sum"] == r1["slice_sum"] == 1.0


def test_grid_two_replicas(dist_pool):
    r0, r1 = dist_pool.run(_grid_report, world_size=2, args=(1, 2))
    assert (r0["stage"], r1["stage"]) == (0, 0)
    assert r0["first_last"] == r1["first_last"] == (True, True)
    assert r0["pipe"] == r1["pipe"] == (0, 1, 1)
    assert (r0["data"], r1["data"]) == ((0, 2, 2), (1, 2, 2))
    assert r0["model"] == r1["model"] == (0, 1, 1)
    assert (r0["stage_to_global"], r1["stage_to_global"]) == ([0], [1])
    assert r0["dp_sum"] == r1["dp_sum"] == 2.0  # all_reduce of ones over the data group
    assert (r0["pipe_rank_sum"], r1["pipe_rank_sum"]) == (0.0, 1.0)


def _grid_errors():
    from deepspeed.pipe.topology import (PipeDataParallelTopology, PipelineParallelGrid,
                                         ProcessTopology)

    out = {}
    try:
        PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=2, num_dp=2))
    except ValueError as err:
        out["size"] = str(err)
    grid = PipelineParallelGrid()  # no topology: the world's prime factors, pipe first
    out["default"] = (grid.pipe_parallel_size, grid.data_parallel_size)
    # a topology without a pipe axis: one stage, every rank its own pipeline
    flat = PipelineParallelGrid(topology=ProcessTopology(["data"], [2]))
    out["flat"] = (flat.get_stage_id(), flat.get_pipe_parallel_world_size(),
                   flat.get_data_parallel_world_size(), flat.stage_to_global(0))
    return out


def test_grid_errors_and_defaults(dist_pool):
    for rank, out in enumerate(dist_pool.run(_grid_errors, world_size=2)):
        assert "4 ranks" in out["size"] and "2" in out["size"]
        assert out["default"] == (2, 1)
        assert out["flat"] == (0, 1, 2, rank)


def test_docstring_examples():
    import doctest

    import deepspeed.pipe.topology as topology

    assert doctest.testmod(topology).failed == 0


def test_upstream_paths():
    from deepspeed.runtime.pipe import ProcessTopology as Upstream
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid

    from deepspeed.pipe import PipelineParallelGrid as Grid
    assert Upstream is ProcessTopology and PipelineParallelGrid is Grid
