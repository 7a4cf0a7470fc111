#!/usr/bin/env python
"""Whole fp32 weights out of a ZeRO checkpoint, in process or as an offline script.

One file past 600 lines on purpose: a ZeRO save copies it into the checkpoint folder, where it
runs as a script on machines without DeepSpeed (or with another version), so it must stay a
single standalone file importing nothing from ``deepspeed`` (see "Standalone" below).

Under ZeRO no file holds the model: each data-parallel rank saved only its slice of the fp32
master weights (``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``), and under ZeRO-3 the model
states file holds empty placeholders. This module rebuilds an ordinary ``state_dict`` (same keys
and order as ``model.state_dict()``) from those slices, using the layout the ZeRO plugin records
next to them, so it needs torch but no process group, config or GPU. A pipeline checkpoint
(ZeRO-1 inside each stage) has one model-states file and one set of rank files per stage
(``mp_rank_<stage>``); every stage is rebuilt and the results merged under the pipeline's global
layer names (``3.weight``, ``tied_modules.<key>.weight``), buffers and frozen weights coming from
the per-layer ``layer_XX-model_states.pt`` files.

A ZeRO save copies this file to ``<save_dir>/zero_to_fp32.py`` so a checkpoint folder converts
itself, on any machine with torch (``deepspeed.zero.checkpointing.copy_zero_to_fp32``)::

    python zero_to_fp32.py . pytorch_model.bin                        # one file (old form)
    python zero_to_fp32.py <save_dir> <out_dir> [--safe_serialization] [--max_shard_size 5GB]
                           [-t global_step14] [--exclude_frozen_parameters] [-d]

Memory: rank files are opened with ``mmap=True`` and only their fp32 partitions are touched (the
optimizer moments are never read), one rank at a time, so the peak is about the size of the
result plus one rank's partition: under 2x the fp32 model.

Standalone: the copy must run where DeepSpeed is not installed (or is another version), so this
file imports nothing from ``deepspeed``. The one piece of layout arithmetic it needs,
``partition_ranges``, is therefore defined here, and ``deepspeed.zero.checkpoint_layout`` (the
rest of the arithmetic, used while training) re-exports it from here: one definition for the
writer and every reader. Importable as ``deepspeed.zero.zero_to_fp32`` and, as upstream
documents it, ``deepspeed.utils.zero_to_fp32``.
"""
import os
import sys

if __name__ == "__main__" and sys.path and sys.path[0] and os.path.abspath(
        sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # Run from inside the installed package, this folder comes first on sys.path and its
    # modules could shadow top-level ones torch imports; a copy in a checkpoint folder is
    # unaffected.
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from collections import OrderedDict  # noqa: E402

import torch  # noqa: E402

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "LazyTensor", "parse_size", "main"]

LATEST = "latest"
# a pipeline's model-states files record the number of stages; each stage (model-parallel
# rank) has its own optimizer files, and the stages' state dicts are merged (global layer names)
PIPELINE_STAGES = "pipeline_stages"
MODEL_STATES_NAMES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
OPTIM_FILE_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
SINGLE_FILE_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors")
# an MoE checkpoint (``deepspeed.moe``): the model-states file holds no expert and records the
# layout under this key; expert E (global id) of MoE layer L is in its own file, under the names
# of the model that holds every expert (``...deepspeed_experts.<E>.``)
MOE_STATE_KEY = "moe_checkpoint"
MOE_EXPERTS_INFIX = "deepspeed_moe.experts.deepspeed_experts."

_debug = False


def _log(message):
    if _debug:
        print(f"[zero_to_fp32] {message}", file=sys.stderr)


def _progress(iterable, desc, unit, leave=True):
    """A tqdm bar on stderr when stderr is a terminal. tqdm is imported here rather than through
    ``deepspeed.utils.progress`` because this file runs standalone, where tqdm may be missing
    (then: no bar)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, unit=unit, leave=leave, file=sys.stderr, disable=None,
                dynamic_ncols=True)


def _load(path):
    """Memory-mapped: tensors are paged in only when read, so skipped entries cost nothing."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _frozen_shapes(model_states):
    """``{name: shape}`` of the parameters saved with ``requires_grad=False``."""
    return model_states.get("frozen_param_shapes") or {}


# ------------------------------------------------------------------------- the layout
def partition_ranges(described_group, world_size, rank):
    """Where ``rank``'s flat partition of one optimizer param group comes from.

    ``described_group`` is one group of the layout recorded in every ``*_optim_states.pt``
    (``deepspeed.zero.partition.describe``): a list of buckets ``{"params": [names], "numels":
    [sizes], "padded": length}``. Each bucket's ``padded`` elements are cut into ``world_size``
    equal pieces and a rank's partition is the concatenation of its pieces over the buckets
    (ZeRO-3: one bucket per parameter). Returns ``[(name, start, stop, partition_start)]``:
    elements ``start:stop`` of the flattened parameter ``name`` sit at ``partition_start`` of
    the partition. Padding belongs to no parameter and is left out."""
    ranges, partition_offset = [], 0
    for bucket in described_group:
        piece = bucket["padded"] // world_size
        lo, hi = rank * piece, (rank + 1) * piece
        offset = 0
        for name, numel in zip(bucket["params"], bucket["numels"]):
            start, stop = max(offset, lo), min(offset + numel, hi)
            if start < stop:
                ranges.append((name, start - offset, stop - offset,
                               partition_offset + start - lo))
            offset += numel
        partition_offset += piece
    return ranges


# ------------------------------------------------------------------------- the checkpoint
class _ZeroCheckpoint:
    """One tag's files: the model states, and per rank where its optimizer file is. Rank files
    are either opened and dropped per read (lowest memory) or kept open (``keep_open``, for
    many small reads, as lazy tensors do)."""

    def __init__(self, checkpoint_dir, tag=None, keep_open=False, mp_rank=0):
        self.dir = _tag_dir(checkpoint_dir, tag)
        self.keep_open = keep_open
        self._open = {}
        names = MODEL_STATES_NAMES if mp_rank == 0 else \
            (f"mp_rank_{mp_rank:02d}_model_states.pt",)
        model_path = next((os.path.join(self.dir, n) for n in names
                           if os.path.isfile(os.path.join(self.dir, n))), None)
        if model_path is None:
            raise FileNotFoundError(f"can't find model states file in '{self.dir}' (looked for "
                                    f"{list(names)}); is it a DeepSpeed checkpoint?")
        self.model_states = _load(model_path)
        if self.model_states.get("module") is None and PIPELINE_STAGES in self.model_states:
            self.model_states["module"] = _pipeline_layer_entries(self.dir, self.model_states)
        split_experts = _with_moe_experts(self.dir, self.model_states, mp_rank)
        self.optim_paths = _optim_paths(self.dir, mp_rank)
        first = self._rank_state(0)
        if "layout" not in first or "partition_count" not in first:
            raise ValueError(f"'{self.optim_paths[0]}' has no ZeRO 'layout'/'partition_count': "
                             f"it was not written by this DeepSpeed's ZeRO optimizer")
        self.stage = int(first.get("zero_stage", 0))
        self.world = int(first["partition_count"])
        # MiCS: every shard group wrote the same partitions; the first group's files suffice
        replicas = int(first.get("partition_replicas", 1))
        if len(self.optim_paths) == self.world * replicas:
            self.optim_paths = self.optim_paths[:self.world]
        if len(self.optim_paths) != self.world:
            raise ValueError(f"'{self.dir}' holds {len(self.optim_paths)} ZeRO optimizer files "
                             f"but the checkpoint was saved with partition_count={self.world}; "
                             f"the checkpoint is incomplete or mixes several saves")
        self.layout = first["layout"]
        self.frozen_shard_names = list((first.get("frozen_shards") or {}).keys())
        self.numels = {n: k for group in self.layout for bucket in group
                       for n, k in zip(bucket["params"], bucket["numels"])
                       if not split_experts(n)}
        self.shapes = {}
        for group in self.model_states.get("param_shapes") or []:
            self.shapes.update(group)
        missing = sorted(set(self.numels) - set(self.shapes))
        if missing:
            raise ValueError(f"the model states file has no 'param_shapes' entry for the "
                             f"trained parameters {missing[:10]}")
        if not self.keep_open:
            self._open.clear()

    def _rank_state(self, rank):
        state = self._open.get(rank)
        if state is None:
            state = _load(self.optim_paths[rank])["optimizer_state_dict"]
            self._open[rank] = state
        return state

    def _ranks(self):
        """Each rank's partition state dict, in rank order; dropped after use unless kept
        (a progress bar over the rank files on a terminal)."""
        for rank in _progress(range(self.world), desc="reading ZeRO partitions", unit="rank",
                             leave=False):
            yield rank, self._rank_state(rank)
            if not self.keep_open:
                self._open.pop(rank, None)

    def frozen_shape(self, name):
        return torch.Size(_frozen_shapes(self.model_states)[name])

    def shape(self, name):
        """The full shape of a trained or ZeRO-3 frozen parameter."""
        return self.shapes[name] if name in self.numels else self.frozen_shape(name)

    def dtype(self, name):
        """The dtype ``materialise`` gives ``name``: fp32 masters for trained parameters, the
        stored dtype for frozen ones (no fp32 copy of them exists)."""
        return torch.float32 if name in self.numels else self.model_states["module"][name].dtype

    def materialise(self, names):
        """Whole tensors for trained (fp32 partitions) and ZeRO-3 frozen (``frozen_shards``)
        parameters among ``names``, built by visiting each rank's file once."""
        wanted = set(names)
        out = {n: torch.empty(self.numels[n], dtype=torch.float32)
               for n in names if n in self.numels}
        frozen = [n for n in names if n in self.frozen_shard_names and n not in self.numels]
        flat_frozen, frozen_numel = {}, {n: self.frozen_shape(n).numel() for n in frozen}
        for rank, state in self._ranks():
            partitions = state["single_partition_of_fp32_groups"]
            for group, described in enumerate(self.layout):
                partition = partitions[group]
                for name, start, stop, at in partition_ranges(described, self.world, rank):
                    if name in wanted:
                        out[name][start:stop] = partition[at:at + stop - start]
            for name in frozen:
                shard = state["frozen_shards"][name].reshape(-1)
                if name not in flat_frozen:
                    flat_frozen[name] = torch.empty(shard.numel() * self.world, dtype=shard.dtype)
                flat_frozen[name][rank * shard.numel():(rank + 1) * shard.numel()] = shard
        for name in frozen:
            if not 0 < frozen_numel[name] <= flat_frozen[name].numel():
                raise ValueError(
                    f"frozen parameter '{name}': 'frozen_param_shapes' records shape "
                    f"{list(self.frozen_shape(name))} but its ZeRO-3 shards hold "
                    f"{flat_frozen[name].numel()} elements (padding included); the checkpoint "
                    f"does not record the parameter's full shape")
            out[name] = flat_frozen[name][:frozen_numel[name]].clone()
        for name in list(out):
            shape = self.shape(name)
            out[name] = out[name].view(shape)
            _log(f"{name}: {tuple(shape)} {out[name].dtype}")
        return out


def _tag_dir(checkpoint_dir, tag):
    checkpoint_dir = os.fspath(checkpoint_dir)
    if tag is None:
        latest = os.path.join(checkpoint_dir, LATEST)
        if not os.path.isfile(latest):
            raise ValueError(f"Unable to find 'latest' file at {latest}; pass the tag "
                             f"(e.g. tag='global_step14' or -t global_step14) explicitly")
        with open(latest, encoding="utf-8") as f:
            tag = f.read().strip()
    path = os.path.join(checkpoint_dir, str(tag))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Directory '{path}' doesn't exist (checkpoint tag '{tag}' in "
                                f"'{checkpoint_dir}')")
    return path


def _mp_ranks(tag_dir):
    """The model-parallel ranks that saved ZeRO optimizer files in ``tag_dir``, sorted."""
    return sorted({int(m.group(2)) for m in map(OPTIM_FILE_RE.match, os.listdir(tag_dir)) if m})


def _pipeline_layer_entries(tag_dir, model_states, tensor_rank=0):
    """A pipeline stage's model-states file holds ``module: None``; its layers are in
    ``layer_XX-model_states.pt`` (keys local to the layer). The stage's buffers and frozen
    parameters (named ``<global layer>.<key>``) are read from there, in layer order; trained
    parameters come from the fp32 partitions as usual. (Buffers and frozen parameters of tied
    modules, ``tied_modules.*``, are not recovered.) A grid with a tensor (``model``) axis
    names the files ``layer_XX-model_YY-model_states.pt``: tensor rank ``tensor_rank``'s are
    read."""
    wanted = set(model_states.get("buffer_names") or ()) | \
        set(_frozen_shapes(model_states))
    trained = {n for group in model_states.get("param_shapes") or [] for n in group}
    layers = sorted({int(n.split(".", 1)[0]) for n in wanted | trained
                     if n.split(".", 1)[0].isdigit()})
    entries = OrderedDict()
    for idx in layers:
        paths = [os.path.join(tag_dir, f"layer_{idx:02d}{repr_}-model_states.pt")
                 for repr_ in ("", f"-model_{tensor_rank:02d}")]
        path = next((p for p in paths if os.path.isfile(p)), None)
        if path is None:
            continue
        for key, value in _load(path).items():
            name = f"{idx}.{key}"
            if name in wanted or name in trained:
                entries[name] = value
    return entries


def _with_moe_experts(tag_dir, model_states, mp_rank=0):
    """Put an MoE checkpoint's experts (their own files) into ``model_states["module"]``, after
    their layer's gate (``model.state_dict()`` order of the model holding every expert), and
    return a test for the trained names that are not whole in the fp32 partitions: the local
    expert names of layers split over ranks (their param groups are partitioned over the
    expert-data-parallel group, and the same local name is another expert on another rank).
    Those experts come from their files, in the dtype the model trained in."""
    moe = model_states.get(MOE_STATE_KEY)
    module = model_states.get("module")
    if moe is None or module is None:
        return lambda name: False
    items, split, after = list(module.items()), [], {}
    for layer_id, layer in enumerate(moe["layers"]):
        prefix = f"{layer['name']}.deepspeed_moe." if layer["name"] else "deepspeed_moe."
        gate = [i for i, (key, _) in enumerate(items) if key.startswith(f"{prefix}gate.")]
        after.setdefault(gate[-1] if gate else len(items) - 1, []).append((layer_id, layer))
        if int(layer["ep_size"]) > 1:
            split.append(f"{prefix}experts.deepspeed_experts.")
    merged = OrderedDict()
    for index, (key, value) in enumerate([(None, None)] + items, start=-1):
        if key is not None:
            merged[key] = value
        for layer_id, layer in after.get(index, ()):
            merged.update(_moe_layer_experts(tag_dir, layer_id, layer, mp_rank))
    model_states["module"] = merged
    return lambda name: any(name.startswith(p) for p in split)


def _moe_layer_experts(tag_dir, layer_id, layer, mp_rank):
    entries = OrderedDict()
    for expert in range(int(layer["num_experts"])):
        path = os.path.join(tag_dir, f"layer_{layer_id}_expert_{expert}_mp_rank_{mp_rank:02d}"
                                     f"_model_states.pt")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"MoE checkpoint '{tag_dir}': '{path}' (expert {expert} of "
                                    f"MoE layer {layer_id} '{layer['name']}') does not exist")
        entries.update(_load(path))
    return entries


def _plain_moe_state_dict(tag_dir, exclude_frozen_parameters, lazy_mode):
    """An MoE checkpoint saved without ZeRO: the model states plus the expert files hold the
    whole model, in the dtype it trained in."""
    path = os.path.join(tag_dir, MODEL_STATES_NAMES[0])
    if not os.path.isfile(path):
        return None
    states = _load(path)
    if states.get(MOE_STATE_KEY) is None or states.get("module") is None:
        return None
    _with_moe_experts(tag_dir, states)
    frozen = set(_frozen_shapes(states))
    out = OrderedDict()
    for key, value in states["module"].items():
        if exclude_frozen_parameters and key in frozen:
            continue
        out[key] = _stored_value(None, key, value, lazy_mode)
    _log(f"MoE checkpoint '{tag_dir}' without ZeRO: {len(out)} entries from the model states "
         f"and expert files")
    return out


def _optim_paths(tag_dir, mp_rank=0):
    by_rank = {}
    for name in os.listdir(tag_dir):
        match = OPTIM_FILE_RE.match(name)
        if match is not None and int(match.group(2)) == mp_rank:
            by_rank[int(match.group(1))] = os.path.join(tag_dir, name)
    if not by_rank:
        raise FileNotFoundError(f"'{tag_dir}' holds no '*_optim_states.pt' ZeRO optimizer files; "
                                f"it is not a ZeRO checkpoint")
    if sorted(by_rank) != list(range(len(by_rank))):
        raise ValueError(f"'{tag_dir}' holds ZeRO optimizer files of data-parallel ranks "
                         f"{sorted(by_rank)}; expected ranks 0..{len(by_rank) - 1} without gaps")
    return [by_rank[r] for r in range(len(by_rank))]


# ------------------------------------------------------------------------- the state dict
class LazyTensor:
    """A state-dict value read from the checkpoint only when ``contiguous()`` is called, so a
    caller can write a large model shard by shard. ``shape``, ``dtype`` and ``nbytes`` are known
    without reading."""

    def __init__(self, checkpoint, name, shape, dtype, value=None):
        self._checkpoint, self.name = checkpoint, name
        self.shape, self.dtype, self._value = torch.Size(shape), dtype, value

    def numel(self):
        return self.shape.numel()

    def element_size(self):
        return torch.empty(0, dtype=self.dtype).element_size()

    @property
    def nbytes(self):
        return self.numel() * self.element_size()

    def contiguous(self):
        if self._value is not None:
            return self._value.contiguous()
        return self._checkpoint.materialise([self.name])[self.name]

    def __repr__(self):
        return f"LazyTensor({self.name!r}, shape={tuple(self.shape)}, dtype={self.dtype})"


def _plan(checkpoint, exclude_frozen_parameters):
    """``[(key, source)]`` in ``model.state_dict()`` order; source is ``("fp32", name)`` (built
    from partitions), ``("module", name)`` (stored whole) or ``("alias", target key)``."""
    states = checkpoint.model_states
    module = states.get("module") or {}
    frozen = set(_frozen_shapes(states))
    shared = dict(states.get("shared_params") or {})
    plan = []
    for key, value in module.items():
        if key in shared:
            if not (exclude_frozen_parameters and shared[key] in frozen):
                plan.append((key, ("alias", shared[key])))
        elif key in checkpoint.numels:
            plan.append((key, ("fp32", key)))
        elif key in frozen:
            if exclude_frozen_parameters:
                continue
            sharded = key in checkpoint.frozen_shard_names
            plan.append((key, ("fp32", key) if sharded else ("module", key)))
        else:  # buffers (``buffer_names``) and any other stored entry
            plan.append((key, ("module", key)))
    listed = {key for key, _ in plan}
    plan.extend((n, ("fp32", n)) for n in checkpoint.numels if n not in listed)
    return plan


def _resolve(plan, values):
    out = OrderedDict()
    for key, (kind, name) in plan:
        if kind == "alias":
            if name not in values:
                raise ValueError(f"tied parameter '{key}' shares '{name}', which the checkpoint "
                                 f"does not hold")
            out[key] = values[name]
        else:
            out[key] = values[key]
    return out


def _stored_value(checkpoint, name, value, lazy_mode):
    """An entry stored whole (buffers, frozen weights, expert files): a ``LazyTensor`` holding it,
    or a clone, so the result does not keep the memory-mapped file alive."""
    if lazy_mode:
        return LazyTensor(checkpoint, name, value.shape, value.dtype, value=value)
    return value.clone()


def _built_values(checkpoint, names, lazy_mode):
    """``{name: tensor}`` of parameters built from the rank files: ``LazyTensor`` values that
    read them on ``contiguous()``, or the tensors, read in one pass over the rank files."""
    if not names:
        return {}
    if lazy_mode:
        return {n: LazyTensor(checkpoint, n, checkpoint.shape(n), checkpoint.dtype(n))
                for n in names}
    return checkpoint.materialise(list(names))


def _state_dict(checkpoint, exclude_frozen_parameters, lazy_mode):
    plan = _plan(checkpoint, exclude_frozen_parameters)
    values = _built_values(checkpoint, [n for _, (kind, n) in plan if kind == "fp32"], lazy_mode)
    module = checkpoint.model_states.get("module") or {}
    values.update({n: _stored_value(checkpoint, n, module[n], lazy_mode)
                   for _, (kind, n) in plan if kind == "module"})
    # tied parameters whose target is not otherwise in the result
    targets = OrderedDict((n, None) for _, (kind, n) in plan
                          if kind == "alias" and n not in values and n in checkpoint.numels)
    values.update(_built_values(checkpoint, targets, lazy_mode))
    return _resolve(plan, values)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False, lazy_mode=False):
    """The consolidated state dict (CPU) of the ZeRO checkpoint ``checkpoint_dir/<tag>`` (``tag``
    None: the one ``checkpoint_dir/latest`` names), keyed and ordered as ``model.state_dict()``.

    Trained parameters are the fp32 masters; frozen parameters and buffers keep the dtype they
    were stored in (no fp32 copy of them exists). Tied parameters share one tensor.
    ``lazy_mode=True`` returns ``LazyTensor`` values that read the checkpoint on ``contiguous()``.
    Raises ValueError without ``latest``, FileNotFoundError for a missing tag directory and
    ValueError when the number of rank files differs from the saved ``partition_count``.
    """
    return _consolidated(checkpoint_dir, tag, exclude_frozen_parameters, lazy_mode,
                         keep_open=lazy_mode)


def _consolidated(checkpoint_dir, tag, exclude_frozen_parameters, lazy_mode, keep_open):
    """The state dict of one ZeRO checkpoint, or of a pipeline's stages merged (each stage is
    a model-parallel rank with its own optimizer files; keys are global layer names)."""
    mp_ranks = _mp_ranks(_tag_dir(checkpoint_dir, tag))
    if not mp_ranks:
        plain = _plain_moe_state_dict(_tag_dir(checkpoint_dir, tag), exclude_frozen_parameters,
                                      lazy_mode)
        if plain is not None:
            return plain
    checkpoints = [_ZeroCheckpoint(checkpoint_dir, tag, keep_open=keep_open)]
    if mp_ranks not in ([], [0]):
        stages = checkpoints[0].model_states.get(PIPELINE_STAGES)
        if stages is None or mp_ranks != list(range(int(stages))):
            raise ValueError(f"'{checkpoints[0].dir}' holds ZeRO files of model-parallel ranks "
                             f"{mp_ranks}; only model-parallel size 1 checkpoints (or pipelines "
                             f"without tensor parallelism, one rank per stage) convert")
        checkpoints += [_ZeroCheckpoint(checkpoint_dir, tag, keep_open=keep_open, mp_rank=mp)
                        for mp in mp_ranks[1:]]
    merged = OrderedDict()
    for mp, checkpoint in enumerate(checkpoints):
        _log(f"ZeRO stage {checkpoint.stage} checkpoint '{checkpoint.dir}' of "
             f"{checkpoint.world} data-parallel ranks (model-parallel rank {mp})")
        for key, value in _state_dict(checkpoint, exclude_frozen_parameters, lazy_mode).items():
            merged.setdefault(key, value)  # tied weights: every stage holding them, same values
    return merged


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Load the consolidated fp32 weights into ``model`` (moved to CPU) and return it. The model
    is then a plain module: build a new engine before training it with DeepSpeed again."""
    state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=tag)
    model = model.cpu()
    model.load_state_dict(state_dict, strict=False)
    return model


# ------------------------------------------------------------------------- writing files
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size):
    """Bytes in ``5GB`` / ``500MB`` / ``1KiB`` / an int (decimal units, as Hugging Face)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = _SIZE_RE.match(str(size))
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"max_shard_size {size!r} is not a positive size; use e.g. '5GB', "
                         f"'500MB', '1KiB' or a number of bytes")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])


def _nbytes(value):
    return value.nbytes if isinstance(value, LazyTensor) else \
        value.numel() * value.element_size()


def _shards(state_dict, max_bytes):
    """Consecutive groups of keys each under ``max_bytes`` (a larger tensor gets its own)."""
    shards, current, size = [], [], 0
    for key, value in state_dict.items():
        nbytes = _nbytes(value)
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(key)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _save_file(tensors, path, safe):
    tmp = f"{path}.tmp"
    if safe:
        try:
            from safetensors.torch import save_file
        except ImportError as exc:
            raise ImportError("safe_serialization=True (--safe_serialization, or a .safetensors "
                              "output) needs the 'safetensors' package: pip install "
                              "safetensors") from exc
        seen, plain = set(), {}
        for key, tensor in tensors.items():
            ptr = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            # safetensors refuses tensors sharing memory: tied weights get their own copy
            plain[key] = tensor.clone() if ptr in seen else tensor.contiguous()
            seen.add(ptr)
        save_file(plain, tmp, metadata={"format": "pt"})
    else:
        torch.save(tensors, tmp)
    os.replace(tmp, path)


def _materialise_shard(state_dict, keys):
    """Real tensors for ``keys``; lazy values read in one pass over each checkpoint's rank
    files (one checkpoint per pipeline stage), and tied keys share one tensor in the shard."""
    lazy = [v for v in (state_dict[k] for k in keys) if isinstance(v, LazyTensor)]
    wanted = OrderedDict()  # checkpoint id -> (checkpoint, names)
    for v in lazy:
        if v._value is None:
            wanted.setdefault(id(v._checkpoint), (v._checkpoint, OrderedDict()))[1][v.name] = None
    built = {cid: checkpoint.materialise(list(names))
             for cid, (checkpoint, names) in wanted.items()}
    by_id, out = {}, OrderedDict()
    for key in keys:
        value = state_dict[key]
        if isinstance(value, LazyTensor):
            if id(value) not in by_id:
                by_id[id(value)] = built[id(value._checkpoint)][value.name] \
                    if value._value is None else value._value.clone()
            value = by_id[id(value)]
        out[key] = value
    return out


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir_or_file,
                                               max_shard_size="5GB", safe_serialization=False,
                                               tag=None, exclude_frozen_parameters=False):
    """Write the consolidated fp32 state dict: to one file when ``output_dir_or_file`` ends in
    .bin/.pt/.pth/.safetensors, else into that directory as Hugging Face checkpoint files
    (``pytorch_model.bin`` / ``model.safetensors``, or numbered shards of at most
    ``max_shard_size`` with a ``*.index.json``). Returns the list of files written."""
    output = os.fspath(output_dir_or_file)
    single = output.lower().endswith(SINGLE_FILE_SUFFIXES)
    if single:
        is_safe = output.lower().endswith(".safetensors")
        if safe_serialization and not is_safe:
            raise ValueError(f"safe_serialization=True but the output file '{output}' is not a "
                             f".safetensors file; name it *.safetensors or give a directory")
        safe_serialization = is_safe
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        state_dict = get_fp32_state_dict_from_zero_checkpoint(
            checkpoint_dir, tag, exclude_frozen_parameters=exclude_frozen_parameters)
        _save_file(state_dict, output, safe_serialization)
        _log(f"wrote {len(state_dict)} entries to '{output}'")
        return [output]

    max_bytes = parse_size(max_shard_size)
    os.makedirs(output, exist_ok=True)
    lazy = _consolidated(checkpoint_dir, tag, exclude_frozen_parameters, lazy_mode=True,
                         keep_open=False)
    shards = _shards(lazy, max_bytes)
    stem, ext = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    if len(shards) == 1:
        names = [f"{stem}{ext}"]
    else:
        names = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}{ext}" for i in range(len(shards))]
    weight_map = OrderedDict()
    for keys, name in _progress(list(zip(shards, names)), desc="writing shards", unit="shard"):
        _save_file(_materialise_shard(lazy, keys), os.path.join(output, name),
                   safe_serialization)
        weight_map.update((k, name) for k in keys)
        _log(f"wrote {len(keys)} entries to '{name}'")
    written = [os.path.join(output, n) for n in names]
    if len(shards) > 1:
        index = os.path.join(output, f"{stem}{ext}.index.json")
        total = sum(_nbytes(v) for v in OrderedDict((id(v), v) for v in lazy.values()).values())
        with open(index, "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        written.append(index)
    return written


# ------------------------------------------------------------------------- script
def _parser():
    parser = argparse.ArgumentParser(
        prog="zero_to_fp32.py",
        description="Consolidate the fp32 weights of a DeepSpeed ZeRO checkpoint into a "
                    "state dict file (or Hugging Face style shards). Needs no GPU or "
                    "distributed setup.")
    parser.add_argument("checkpoint_dir", help="the folder holding 'latest' and the tag folders, "
                                               "e.g. path/checkpoint-12")
    parser.add_argument("output_dir_or_file",
                        help="a file ending in .bin/.pt/.pth/.safetensors (one file), or a "
                             "directory for pytorch_model*.bin / model*.safetensors shards")
    parser.add_argument("-t", "--tag", default=None,
                        help="checkpoint tag (e.g. global_step14); default: read 'latest'")
    parser.add_argument("--exclude_frozen_parameters", action="store_true",
                        help="leave out parameters with requires_grad=False")
    parser.add_argument("--max_shard_size", default="5GB",
                        help="largest shard when writing a directory (default 5GB)")
    parser.add_argument("--safe_serialization", action="store_true",
                        help="write safetensors files (needs the safetensors package)")
    parser.add_argument("-d", "--debug", action="store_true", help="print what is done")
    return parser


def main(argv=None):
    global _debug
    args = _parser().parse_args(argv)
    _debug = args.debug
    written = convert_zero_checkpoint_to_fp32_state_dict(
        args.checkpoint_dir, args.output_dir_or_file, max_shard_size=args.max_shard_size,
        safe_serialization=args.safe_serialization, tag=args.tag,
        exclude_frozen_parameters=args.exclude_frozen_parameters)
    print(f"Saved fp32 state dict to {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
