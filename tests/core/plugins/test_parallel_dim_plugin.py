"""A plugin adds a parallel dimension through ``deepspeed_parallel_dims``: the engine's topology
builds its groups with the right ranks (a plain dimension and a ``DeviceMesh``), the plugin and
the training script reach them through ``engine.topology``, and the engine's own "data"
dimension is untouched. The dimension lives and dies with the engine. The plugin's state goes
into checkpoints through ``deepspeed_stateful`` and comes back on load."""
from pathlib import Path

from hook_only import deepspeed_imports

FIXTURE = Path(__file__).with_name("parallel_dim_plugin.py")


def test_the_fixture_imports_nothing_of_deepspeed_but_the_hook_file():
    assert deepspeed_imports(FIXTURE) == {"deepspeed.hooks"}


def _train_with_a_new_dimension(block, save_dir):
    import torch

    import deepspeed
    from deepspeed import comm as dist
    from deepspeed import plugin_manager, topology
    from deepspeed.plugin_manager import PluginSpec

    installed = plugin_manager.installed_plugins()
    plugin_manager.installed_plugins = lambda: {
        **installed, "parallel_dim_example": PluginSpec(
            "parallel_dim_example", "parallel_dim_plugin:ParallelDimPlugin", "fixture", "0")}
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                  "parallel_dim_example": {"block": block}}
        def plugin_of(engine):
            return [p for p in engine.plugins.get_plugins() if hasattr(p, "sums")][0]

        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        for _ in range(2):
            engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
            engine.step()
        topo = engine.topology
        mesh = topo.mesh("ring")
        out = {
            "neighbours": topo.ranks("neighbours"),
            "lists": topo.rank_lists("neighbours"),
            "size_rank": (topo.size("neighbours"), topo.rank("neighbours")),
            "ring": topo.ranks("ring"), "across": topo.ranks("ring.across"),
            "mesh": (mesh.mesh_dim_names, mesh.mesh.tolist(),
                     dist.get_world_size(group=mesh.get_group("ring")),
                     mesh.get_group("ring") is topo.group("ring")),
            "sums": [p.sums for p in engine.plugins.get_plugins() if hasattr(p, "sums")][0],
            "data": (engine.dp_world_size, topo.size("data")),
            "current": topology.current() is topo,
        }
        engine.save_checkpoint(save_dir, tag="two")
        engine.destroy()
        out["after"] = (topology.current() is topo,
                        topology.current().built("neighbours") is None)

        resumed, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
        fresh = list(plugin_of(resumed).sums)
        resumed.load_checkpoint(save_dir, tag="two")
        loaded = list(plugin_of(resumed).sums)
        resumed.backward(resumed(torch.randn(2, 4)).pow(2).mean())
        resumed.step()
        out["resumed"] = (fresh, loaded, list(plugin_of(resumed).sums))
        resumed.destroy()
        return out
    finally:
        plugin_manager.installed_plugins = lambda: installed


def test_a_plugin_dimension_on_four_ranks(dist_pool, tmp_path):
    results = dist_pool.run(_train_with_a_new_dimension, world_size=4, args=(2, str(tmp_path)))
    for rank, out in enumerate(results):
        first = rank - rank % 2
        assert out["neighbours"] == [first, first + 1]
        assert out["lists"] == [[0, 1], [2, 3]]
        assert out["size_rank"] == (2, rank % 2)
        assert out["ring"] == [first, first + 1] and out["across"] == [rank % 2, rank % 2 + 2]
        assert out["mesh"] == (("across", "ring"), [[0, 1], [2, 3]], 2, True)
        assert out["sums"] == [2, 2]  # the plugin's all-reduce ran over its own group
        assert out["data"] == (4, 4)  # the engine still averages over the world
        assert out["current"] and out["after"] == (False, True)
        # a new engine starts empty, the checkpoint brings the sums back, training appends
        assert out["resumed"] == ([], [2, 2], [2, 2, 2])
