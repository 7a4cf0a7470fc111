"""A plugin that adds a parallel dimension of its own, written from ``deepspeed.hooks`` alone
(plus pydantic for its config section and torch.distributed for its collective): the proof that
a new kind of parallelism needs no core change. ``test_parallel_dim_plugin`` registers it.

The ``"neighbours"`` dimension groups ranks in blocks of ``block`` consecutive ranks (a plain
``ParallelDim``); the ``"ring"`` mesh lays the world out as ``(world / block, block)`` with the
axes ``("across", "ring")`` (a ``ParallelMesh``, i.e. a ``DeviceMesh``). After every step the
plugin sums a one over its neighbours' group, through the group the engine's topology hands back,
and remembers the sums; the sums are its checkpointed state (``deepspeed_stateful``), so a
resumed run continues the list."""
import pydantic
import torch
import torch.distributed as tdist

from deepspeed.hooks import ParallelDim, ParallelMesh, hookimpl

SECTION = "parallel_dim_example"


class ParallelDimSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    enabled: bool = True
    block: int = pydantic.Field(2, ge=1)


class NeighbourSums:
    """The plugin's ``Stateful``: what a checkpoint carries for it."""

    def __init__(self):
        self.sums = []

    def state_dict(self):
        return {"sums": list(self.sums)}

    def load_state_dict(self, state_dict):
        self.sums = list(state_dict["sums"])


class ParallelDimPlugin:
    def __init__(self):
        self.state = NeighbourSums()

    @property
    def sums(self):
        return self.state.sums

    @hookimpl
    def deepspeed_config_sections(self):
        return {SECTION: ParallelDimSection}

    @hookimpl
    def deepspeed_parallel_dims(self, engine, config):
        block = config.section(SECTION).block
        world = tdist.get_world_size()
        return [ParallelDim("neighbours", tuple(tuple(range(first, first + block))
                                                for first in range(0, world, block))),
                ParallelMesh("ring", ("across", "ring"), (world // block, block))]

    @hookimpl
    def deepspeed_after_step(self, engine):
        ones = torch.ones(1)
        tdist.all_reduce(ones, group=engine.topology.group("neighbours"))
        self.state.sums.append(int(ones.item()))

    @hookimpl
    def deepspeed_stateful(self, engine):
        return {"neighbour_sums": self.state}
