"""`PipelineModule`: a model written as a sequence of layers, split into pipeline stages.

    net = PipelineModule(layers=[LayerSpec(nn.Linear, 8, 16), nn.ReLU(),
                                 LayerSpec(nn.Linear, 16, 4)],
                         num_stages=2, loss_fn=nn.MSELoss())

The forward is implicit: ``x = layer(x)`` over the layers this rank's stage owns. Each rank
builds only its own layers (``parts[stage_id]:parts[stage_id + 1]``); tied layers
(`TiedLayerSpec`) are built on every stage using them and kept identical: broadcast from the
lowest such stage at construction, gradients summed by `allreduce_tied_weight_gradients()`.

Checkpoints are written per global layer index (``layer_{idx:02d}[-{rank_repr}]-model_states.pt``),
so a model saved with one number of stages loads into another.
"""
import functools
import glob
import itertools
import logging
import os
from typing import Dict, List

import torch
from torch import nn

import deepspeed.comm as dist
from deepspeed import checkpointing
from deepspeed import topology as ds_topology
from deepspeed.accelerator import get_accelerator
from deepspeed.checkpoint import atomic_torch_save, load_file
from deepspeed.checkpoint.constants import LAYER_FILE_PREFIX
from deepspeed.hooks import REPLICATED_PARAM, ParallelDim
from deepspeed.pipe.layers import (LayerSpec, TiedLayerSpec, get_nested_attr, partition_layers,
                                   set_random_seed)
from deepspeed.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid
from deepspeed.utils.logging import log_dist
from deepspeed.pipe.partitioning import partition_uniform

PIPE_AXIS = "pipe"
DATA_AXIS = "data"
MODEL_AXIS = "model"
#: the topology dimension of the tied-weight groups, one instance per tie key
TIED_DIMENSION = "pipe.tied"


def _rank_and_world():
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _local_rank(world_size):
    try:
        return dist.get_local_rank()
    except RuntimeError:
        if world_size == 1:
            return 0
        raise


def _check_default(key, value, argument, given, default):
    """A config key may only fill in a PipelineModule argument left at its default."""
    if given != default:
        raise ValueError(f"the config's pipeline.{key} ({value!r}) contradicts the "
                         f"PipelineModule's {argument}={given!r}; set one of them")


class PipelineModule(nn.Module):
    """A sequence of layers partitioned over ``num_stages`` pipeline stages (or the ``pipe`` axis
    of ``topology``); see the module docstring. Attributes the engine uses: ``stage_id``,
    ``num_stages``, ``parts``, ``loss_fn``, ``forward_funcs``, ``tied_comms``, ``mpu()``."""

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False,
                 seed_fn=None, base_seed=1234, partition_method="parameters",
                 activation_checkpoint_interval=0,
                 activation_checkpoint_func=checkpointing.checkpoint, checkpointable_layers=None,
                 dynamic_shape=False):
        super().__init__()
        if checkpointable_layers is not None:
            assert isinstance(checkpointable_layers, list), (
                f"checkpointable_layers must be a list of layer class names, got "
                f"{type(checkpointable_layers).__name__}")
        if isinstance(activation_checkpoint_interval, bool) or not isinstance(
                activation_checkpoint_interval, int) or activation_checkpoint_interval < 0:
            raise ValueError(f"activation_checkpoint_interval must be a non-negative int, got "
                             f"{activation_checkpoint_interval!r}")
        if seed_fn is not None and not callable(seed_fn):
            raise TypeError(f"seed_fn must be callable, got {type(seed_fn).__name__}")
        if not callable(activation_checkpoint_func):
            raise TypeError(f"activation_checkpoint_func must be callable, got "
                            f"{type(activation_checkpoint_func).__name__}")

        self.micro_offset = 0
        self.loss_fn = loss_fn
        self.checkpointable_layers = checkpointable_layers
        self.seed_layers = seed_layers
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func
        self.dynamic_shape = dynamic_shape
        # the engine sets this from the config's checkpoint.parallel_write.pipeline_stage
        self.checkpoint_parallel_write_pipeline = False

        self._layer_specs = self._check_layers(layers)
        self._num_layers = len(self._layer_specs)
        self.forward_funcs = []
        self.fwd_map: Dict[str, int] = {}
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: Dict[str, List[str]] = {}
        self.tied_comms = {}
        self._topo = self._grid_obj = None
        if num_stages is not None or topology is not None:
            self._lay_out(num_stages, topology)
        # else: the config's pipeline.stages lays it out at deepspeed.initialize (pipeline_config)

    def _lay_out(self, num_stages, topology):
        """Place this rank in the pipeline's topology, then build its stage's layers."""
        self.global_rank, self.world_size = _rank_and_world()
        self.local_rank = _local_rank(self.world_size)
        self._topo = self._make_topology(num_stages, topology)
        self.num_stages = self._topo.get_dim(PIPE_AXIS)
        coord = self._topo.get_coord(self.global_rank)
        self.stage_id = getattr(coord, PIPE_AXIS)
        # the grid builds process groups (collective): only with a process group up; a
        # single-process module builds it on first use (see the `_grid` property)
        self._grid_obj = PipelineParallelGrid(self._topo) if dist.is_initialized() else None
        self._build_stage()

    def _build_stage(self):
        """Partition the layers over the stages and build this stage's (again, when the
        pipeline section changes the partition or the seeding of a module built already)."""
        for name in self.fwd_map:
            self._modules.pop(name, None)
        self.forward_funcs, self.fwd_map = [], {}
        self.tied_modules, self.tied_weight_attrs = nn.ModuleDict(), {}
        self.parts = partition_layers(self._layer_specs, self.num_stages, self.partition_method)
        self._local_start = self.parts[self.stage_id]
        self._local_stop = self.parts[self.stage_id + 1]
        self._log_partition()
        self._build()
        self.to(get_accelerator().device_name(self.local_rank))

        self.tied_comms = self._index_tied_modules()
        self._synchronize_tied_weights()

    def is_laid_out(self):
        """False for a module built without ``num_stages`` / ``topology`` until
        ``deepspeed.initialize`` lays it out by the config's ``pipeline.stages``."""
        return self._topo is not None

    def apply_pipeline_config(self, stages="auto", partition="best", seed_layers=False,
                              activation_checkpoint_interval=0):
        """Apply the config's ``pipeline`` section (``deepspeed.initialize`` calls it before
        the engine exists). A key left at its default leaves the module's argument in charge;
        a key set applies where the argument was left at its default (and lays out a module
        built without ``num_stages`` / ``topology``); a key contradicting an argument given is
        a ValueError naming both. Returns True when the stage's layers were (re)built."""
        rebuild = False
        if seed_layers and not self.seed_layers:
            self.seed_layers = rebuild = True
        if partition != "best" and partition != self.partition_method:
            _check_default("partition", partition, "partition_method", self.partition_method,
                           "parameters")
            self.partition_method, rebuild = partition, True
        if activation_checkpoint_interval:
            _check_default("activation_checkpoint_interval", activation_checkpoint_interval,
                           "activation_checkpoint_interval", self.activation_checkpoint_interval,
                           0)
            self.activation_checkpoint_interval = activation_checkpoint_interval
        if not self.is_laid_out():
            if stages == "auto":
                raise RuntimeError("must provide num_stages or topology to PipelineModule, or "
                                   "set the config's pipeline.stages")
            self._lay_out(stages, None)
            return True
        if stages != "auto" and stages != self.num_stages:
            raise ValueError(f"the config's pipeline.stages ({stages}) contradicts the "
                             f"PipelineModule's {self.num_stages} stages (num_stages / "
                             f"topology); set one of them")
        if rebuild:
            self._build_stage()
        return rebuild

    # ------------------------------------------------------------------------- construction
    @staticmethod
    def _check_layers(layers) -> list:
        try:
            specs = list(layers)
        except TypeError:
            raise TypeError(f"PipelineModule layers must be a sequence of layers (a list or an "
                            f"nn.Sequential), got {type(layers).__name__}") from None
        for idx, layer in enumerate(specs):
            if isinstance(layer, PipelineModule):
                raise NotImplementedError(f"layer {idx}: a PipelineModule inside a PipelineModule "
                                          f"(recursive build) is not implemented")
            if not (isinstance(layer, (LayerSpec, nn.Module)) or callable(layer)):
                raise TypeError(f"layer {idx}: {layer!r} is neither an nn.Module, a LayerSpec nor "
                                f"a callable")
        return specs

    def _make_topology(self, num_stages, topology):
        if topology is None:
            if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
                raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
            if self.world_size % num_stages != 0:
                raise RuntimeError(f"num_stages ({num_stages}) must divide distributed world size "
                                   f"({self.world_size})")
            return PipeDataParallelTopology(num_stages, self.world_size // num_stages)
        if topology.get_dim(PIPE_AXIS) < 1:
            raise ValueError(f"topology {topology.get_axis_names()} has no '{PIPE_AXIS}' axis")
        if topology.world_size() != self.world_size:
            raise RuntimeError(f"topology world size ({topology.world_size()}) differs from the "
                               f"distributed world size ({self.world_size})")
        if num_stages is not None and num_stages != topology.get_dim(PIPE_AXIS):
            raise RuntimeError(f"num_stages ({num_stages}) differs from the topology's pipe "
                               f"dimension ({topology.get_dim(PIPE_AXIS)})")
        return topology

    def _log_partition(self):
        if not logging.getLogger("DeepSpeed").isEnabledFor(logging.DEBUG):
            return
        lines = [f"Partitioning pipeline stages with method {self.partition_method}"]
        for stage in range(self.num_stages):
            start, stop = self.parts[stage], self.parts[stage + 1]
            lines.append(f"stage={stage} layers={stop - start}")
            lines += [f"    {idx:2d}: {self._layer_name(idx)}" for idx in range(start, stop)]
        log_dist("\n".join(lines), ranks=[0], level=logging.DEBUG)

    def _layer_name(self, idx):
        layer = self._layer_specs[idx]
        if isinstance(layer, LayerSpec):
            return repr(layer)
        if isinstance(layer, nn.Module):
            return type(layer).__name__
        return getattr(layer, "__name__", repr(layer))

    def _seed_layer(self, seed):
        if self.seed_fn is not None:
            self.seed_fn(seed)
        else:
            set_random_seed(seed)

    def _build(self):
        for layer_idx in range(self._local_start, self._local_stop):
            layer = self._layer_specs[layer_idx]
            name = str(layer_idx)
            if self.seed_layers:
                self._seed_layer(self.base_seed + layer_idx)
            if isinstance(layer, TiedLayerSpec):
                key = str(layer.key)
                if key not in self.tied_modules:
                    self.tied_modules[key] = layer.build()
                    self.tied_weight_attrs[key] = layer.tied_weight_attr
                module = self.tied_modules[key]
                if layer.forward_fn is None:
                    self.forward_funcs.append(module)
                else:
                    self.forward_funcs.append(functools.partial(layer.forward_fn, module))
            elif isinstance(layer, LayerSpec):
                module = layer.build()
                self.add_module(name, module)
                self.forward_funcs.append(module)
            elif isinstance(layer, nn.Module):
                self.add_module(name, layer)
                self.forward_funcs.append(layer)
            else:
                self.forward_funcs.append(layer)
            self.fwd_map[name] = len(self.forward_funcs) - 1

    # ------------------------------------------------------------------------- tied layers
    def _tie_keys(self) -> List[str]:
        """Tie keys in order of first use: every rank creates the groups in this order."""
        keys = []
        for layer in self._layer_specs:
            if isinstance(layer, TiedLayerSpec) and str(layer.key) not in keys:
                keys.append(str(layer.key))
        return keys

    def _other_coords(self):
        """Every combination of the non-pipe coordinates, in row-major order."""
        axes = [a for a in self._topo.get_axis_names() if a != PIPE_AXIS]
        for values in itertools.product(*(range(self._topo.get_dim(a)) for a in axes)):
            yield dict(zip(axes, values))

    def _index_tied_modules(self) -> dict:
        """One group per tie key and per combination of the other axes, holding the ranks of
        the stages using the key (lowest stage first). Collective over the world."""
        tied_comms = {}
        if self.num_stages == 1:
            return tied_comms
        for key in self._tie_keys():
            stages = sorted({self.stage_owner(idx) for idx, layer in enumerate(self._layer_specs)
                             if isinstance(layer, TiedLayerSpec) and str(layer.key) == key})
            lists = [[self._topo.get_rank(**{PIPE_AXIS: stage}, **other) for stage in stages]
                     for other in self._other_coords()]
            # one dimension of the process-group topology per tie key
            tied, = ds_topology.current().add(ParallelDim(TIED_DIMENSION, tuple(map(tuple, lists)),
                                                       key=key))
            for ranks in lists:
                group = tied.group
                if self.global_rank not in ranks:
                    continue
                assert key in self.tied_modules, f"tied key {key!r} was not built on this stage"
                module = self.tied_modules[key]
                tied_comms[key] = {"ranks": ranks, "group": group,
                                   "weight_attr": self.tied_weight_attrs[key], "module": module}
                if self.global_rank != ranks[0]:
                    # a copy of a weight the lowest stage holds: the engine counts it once in
                    # norms (the module's untied parameters are this stage's own)
                    for attr in self.tied_weight_attrs[key]:
                        setattr(get_nested_attr(module, attr), REPLICATED_PARAM, True)
        return tied_comms

    def _synchronize_tied_weights(self):
        """Broadcast every tied weight from the lowest stage that uses it."""
        for comm in self.tied_comms.values():
            for attr in comm["weight_attr"]:
                weight = get_nested_attr(comm["module"], attr)
                dist.broadcast(weight.data, src=min(comm["ranks"]), group=comm["group"])

    def allreduce_tied_weight_gradients(self):
        """Sum the gradients of the tied weights over the stages sharing them (a stage without a
        gradient contributes zeros)."""
        for weight, group in self.get_tied_weights_and_groups():
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            dist.all_reduce(weight.grad, group=group)

    def get_tied_weights_and_groups(self):
        """``[(weight, group), ...]`` for every tied weight on this rank."""
        return [(get_nested_attr(comm["module"], attr), comm["group"])
                for comm in self.tied_comms.values() for attr in comm["weight_attr"]]

    # ------------------------------------------------------------------------- forward
    def forward(self, forward_input):
        self.micro_offset += 1

        def exec_range_func(start, end):
            local_micro_offset = self.micro_offset + 1

            def exec_func(*inputs):
                if len(inputs) == 1:
                    inputs = inputs[0]
                for idx, layer in enumerate(self.forward_funcs[start:end]):
                    self.curr_layer = idx + start + self._local_start
                    if self.seed_layers:
                        self._seed_layer(self.base_seed * local_micro_offset + self.curr_layer)
                    inputs = layer(inputs)
                return inputs

            return exec_func

        num_layers = len(self.forward_funcs)
        if self.activation_checkpoint_interval == 0:
            return exec_range_func(0, num_layers)(forward_input)
        x = forward_input
        for start in range(0, num_layers, self.activation_checkpoint_interval):
            end = min(start + self.activation_checkpoint_interval, num_layers)
            if not isinstance(x, tuple):
                x = (x, )
            if self._is_checkpointable(self.forward_funcs[start:end]):
                x = self.activation_checkpoint_func(exec_range_func(start, end), *x)
            else:
                x = exec_range_func(start, end)(*x)
        return x

    def _is_checkpointable(self, funcs):
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in funcs)
        # only segments holding parameters are worth recomputing
        for f in funcs:
            module = f
            if isinstance(f, functools.partial) and f.args:
                module = f.args[0]  # a tied layer's forward_fn
            if isinstance(module, nn.Module) and next(module.parameters(), None) is not None:
                return True
        return False

    # ------------------------------------------------------------------------- queries
    def stage_owner(self, layer_idx):
        assert 0 <= layer_idx < self._num_layers, (
            f"layer index {layer_idx} out of range [0, {self._num_layers})")
        for stage in range(self.num_stages):
            if self.parts[stage] <= layer_idx < self.parts[stage + 1]:
                return stage
        raise RuntimeError(f"layer {layer_idx} is owned by no stage (parts={self.parts})")

    def topology(self):
        """The ProcessTopology of the pipeline."""
        return self._topo

    @property
    def _grid(self):
        if self._grid_obj is None:
            if not self.is_laid_out():
                raise RuntimeError("this PipelineModule has no stages yet: pass num_stages or "
                                   "topology, or hand it to deepspeed.initialize with the "
                                   "config's pipeline.stages")
            if not dist.is_initialized():
                raise RuntimeError("the pipeline grid needs a process group: call "
                                   "deepspeed.init_distributed() first")
            if dist.get_world_size() != self._topo.world_size():
                raise RuntimeError(f"this PipelineModule was built without a process group for "
                                   f"a world of {self._topo.world_size()}, but the world now has "
                                   f"{dist.get_world_size()} ranks; build it after "
                                   f"deepspeed.init_distributed()")
            self._grid_obj = PipelineParallelGrid(self._topo)
        return self._grid_obj

    @_grid.setter
    def _grid(self, grid):
        self._grid_obj = grid

    def mpu(self):
        """The PipelineParallelGrid (the model-parallel unit the engine uses)."""
        return self._grid

    def num_pipeline_stages(self):
        return self.num_stages

    def get_additional_losses(self):
        """A dict ``{name: loss}`` of model-specific losses to report; None by default."""
        return None

    def _coord(self, axis, default=0):
        if self._topo.get_dim(axis) == 0:
            return default
        return getattr(self._topo.get_coord(self.global_rank), axis)

    # ------------------------------------------------------------------------- checkpoints
    def ckpt_prefix(self, checkpoints_path, tag):
        """``checkpoints_path/tag/module[-{axis}_{coord:02d} for each axis but data]``."""
        rank_name = "module"
        coord = self._topo.get_coord(self.global_rank)
        for axis in self._topo.get_axis_names():
            if axis != DATA_AXIS:
                rank_name += f"-{axis}_{getattr(coord, axis):02d}"
        return os.path.join(checkpoints_path, str(tag), rank_name)

    def ckpt_layer_path(self, ckpt_dir, local_layer_idx):
        """``ckpt_dir/layer_{global_idx:02d}[-{rank_repr}]-model_states.pt``."""
        idx = local_layer_idx + self._local_start
        path = os.path.join(ckpt_dir, f"{LAYER_FILE_PREFIX}{idx:02d}")
        rank_repr = self._topo.get_rank_repr(rank=self.global_rank)
        if rank_repr != "":
            path += f"-{rank_repr}"
        return path + "-model_states.pt"

    def ckpt_layer_path_list(self, ckpt_dir, local_layer_idx):
        """Every checkpoint file of a layer (one per model-parallel rank), sorted."""
        idx = local_layer_idx + self._local_start
        return sorted(glob.glob(os.path.join(ckpt_dir, f"{LAYER_FILE_PREFIX}{idx:02d}-*model_states.pt")))

    def save_state_dict(self, save_dir, checkpoint_engine=None, exclude_frozen_params=False):
        """Write each local layer's state_dict to its `ckpt_layer_path`. Data-parallel rank 0 of
        the stage writes them all, or, with ``checkpoint_parallel_write_pipeline``, the
        data-parallel ranks share them out."""
        dp_rank = self._coord(DATA_AXIS)
        dp_size = max(self._topo.get_dim(DATA_AXIS), 1)
        num_layers = len(self.forward_funcs)
        if self.checkpoint_parallel_write_pipeline:
            offsets = partition_uniform(num_layers, dp_size)
            start, end = offsets[dp_rank], offsets[dp_rank + 1]
        else:
            if dp_rank != 0:
                return
            start, end = 0, num_layers
        os.makedirs(save_dir, exist_ok=True)
        for idx in range(start, end):
            layer = self.forward_funcs[idx]
            if not isinstance(layer, nn.Module):
                continue  # callables and tied forward_fn uses hold no state of their own
            state = layer.state_dict()
            if exclude_frozen_params:
                for name, param in layer.named_parameters():
                    if not param.requires_grad:
                        state.pop(name, None)
            # clone: a view would otherwise drag its whole storage into the file
            state = type(state)((k, v.detach().clone() if torch.is_tensor(v) else v)
                                for k, v in state.items())
            path = self.ckpt_layer_path(save_dir, idx)
            if checkpoint_engine is not None:
                checkpoint_engine.save(state, path)
            else:
                atomic_torch_save(state, path)

    def _layer_file(self, load_dir, local_layer_idx):
        own = self.ckpt_layer_path(load_dir, local_layer_idx)
        if os.path.isfile(own):
            return own
        files = self.ckpt_layer_path_list(load_dir, local_layer_idx)
        mp_rank, mp_size = self._coord(MODEL_AXIS), max(self._topo.get_dim(MODEL_AXIS), 1)
        if len(files) == 1:
            return files[0]
        if files and len(files) == mp_size:
            return files[mp_rank]
        global_idx = local_layer_idx + self._local_start
        if not files:
            raise FileNotFoundError(f"no checkpoint file for pipeline layer {global_idx} in "
                                    f"'{load_dir}' (expected {os.path.basename(own)})")
        raise RuntimeError(f"pipeline layer {global_idx}: {len(files)} checkpoint files in "
                           f"'{load_dir}' for {mp_size} model-parallel ranks; cannot choose")

    def load_state_dir(self, load_dir, checkpoint_engine=None, strict=True):
        """Load each local layer from its file in ``load_dir`` (written by `save_state_dict`,
        with any number of stages), then re-synchronise the tied weights (collective)."""
        for idx, layer in enumerate(self.forward_funcs):
            if not isinstance(layer, nn.Module):
                continue
            path = self._layer_file(load_dir, idx)
            if checkpoint_engine is not None:
                state = checkpoint_engine.load(path)
            else:
                state = load_file(path)
            layer.load_state_dict(state, strict=strict)
        self._synchronize_tied_weights()


__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec"]
