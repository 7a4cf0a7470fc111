"""ZeRO-3 parameters: each rank keeps a 1/N shard of every parameter; the full tensor exists only
while something needs it.

A partitioned parameter keeps its identity (optimizers, hooks and ``named_parameters`` still see
the same ``torch.nn.Parameter``) and gains upstream's attributes:

    ds_id       a process-wide counter           ds_numel / ds_shape   the full size and shape
    ds_tensor   this rank's shard (ceil(numel/N) elements, the last one zero-padded)
    ds_status   NOT_AVAILABLE | INFLIGHT | AVAILABLE
    ds_persist  small parameters stay whole once the engine has gathered them
                (``param_persistence_threshold``; see ``apply_persistence``)

Outside a gather its ``.data`` is an empty placeholder (``numel() == 0``, as in current
upstream). ``gather`` all-gathers the shards of several parameters with one collective and
points each ``.data`` at its full buffer; ``release`` drops the buffer again. Both also exist as methods on the parameter
(``param.all_gather()``, ``param.partition()``) for code written against upstream.

``Init`` (``deepspeed.zero.Init``) partitions every module's parameters as soon as that
module's ``__init__`` returns, so a model larger than one process's memory can be built:
at most one module is whole at a time, and rank 0's initial values are what every rank keeps.

What ``Init`` changes in torch while it is open is listed, and done, in
``deepspeed.zero.torch_patches``.
"""
import contextlib
import functools
import itertools
import types

import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.hooks import PARAM_STATE_ACCESS
from deepspeed.utils.patching import PatchSet
from deepspeed.utils.transient_buffers import transient_empty
from deepspeed.zero.shard_comm import start_rank_major_gather
from deepspeed.zero.init_config import nvme_store, zero_section
from deepspeed.zero.param_access import SHARD_ONLY_ACCESS
from deepspeed.zero.param_status import ZeroParamStatus
from deepspeed.zero.torch_patches import (TORCH_FACTORIES, patch_module_apply,
                                          patch_module_construction, patch_tensor_factories)


_ids = itertools.count()


def is_zero_param(tensor):
    return hasattr(tensor, "ds_id")


def _placeholder(param, device=None):
    return torch.empty(0, dtype=param.dtype, device=device or param.device)


class Partitioner:
    """Shards, gathers and releases parameters over one data-parallel group.

    The seam for algorithms that shard over a smaller group (MiCS, ``deepspeed.zero.mics``):
    ``group`` is the group a parameter's shards live in (gathers run over it, gradients are
    reduce-scattered over it); ``replica_group``, when set, holds the ranks keeping identical
    copies of this rank's shard (reduced gradients are all-reduced over it);
    ``all_gather_into`` is the gather's transport."""

    replica_group = None  # plain ZeRO-3: one shard per data-parallel rank, no replicas

    def __init__(self, group=None, remote_device=None, pin_memory=False, shard_store=None):
        self.group = group
        self.shard_store = shard_store  # offload_param nvme: shards on disk between uses
        self.world_size = dist.get_world_size(group=group)
        self.rank = dist.get_rank(group=group)
        self.remote_device = remote_device  # "cpu": shards live on the host (offload_param)
        self.pin_memory = pin_memory
        self.live_numel = 0  # elements of non-persistent parameters gathered (or in flight)
        self.comm = None  # a ``shard_comm.ShardComm`` (ZeRO++, MiCS) choosing each gather's route

    # ------------------------------------------------------------------ partition
    def shard_numel(self, numel):
        return -(-max(numel, 1) // self.world_size)

    def partition(self, param, source_rank=0):
        """Make ``param`` (whole on every rank, or at least on ``source_rank``) partitioned:
        afterwards no rank holds its full data, whatever its size ("partitioned at
        allocation"); persistence is the engine's decision, taken when it first gathers."""
        if is_zero_param(param):
            return param
        with torch.no_grad():
            full = param.data
            if self.world_size > 1 and source_rank is not None:
                full = full.contiguous()
                dist.broadcast(full, src=self._global(source_rank), group=self.group)
            shard = self.shard_numel(full.numel())
            flat = torch.zeros(shard * self.world_size, dtype=full.dtype, device=full.device)
            flat.narrow(0, 0, full.numel()).copy_(full.reshape(-1))
            piece = flat.narrow(0, self.rank * shard, shard).clone()
        param.ds_id = next(_ids)
        param.ds_numel = full.numel()
        param.ds_shape = tuple(full.shape)
        param.ds_tensor = self._place(piece)
        param.ds_process_group = self.group
        param.ds_partitioner = self
        param.ds_persist = False
        param.ds_external_users = 0
        setattr(param, PARAM_STATE_ACCESS, SHARD_ONLY_ACCESS)  # until an optimizer adopts it
        _add_methods(param)
        param.data = _placeholder(param, full.device)
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE
        if self.shard_store is not None:
            self.shard_store.adopt(param)
        return param

    def fetch(self, param):
        """``param.ds_tensor`` resident in memory (read back from NVMe if offloaded there)."""
        if self.shard_store is not None:
            self.shard_store.fetch(param)
        return param.ds_tensor

    def settle(self, param):
        """Done with ``param.ds_tensor`` for now: an NVMe-offloaded shard goes back to disk."""
        if self.shard_store is not None:
            self.shard_store.settle(param)

    def all_gather_into(self, output, send, async_op=False):
        """Rank-major all-gather of every rank's ``send`` into ``output`` over ``group``;
        returns the work (None when already complete)."""
        return dist.all_gather_into_tensor(output, send, group=self.group, async_op=async_op)

    def _place(self, shard):
        if self.remote_device in ("cpu", "nvme"):
            shard = shard.to("cpu")
            if self.pin_memory:
                shard = get_accelerator().pin_memory(shard)
        return shard

    def _global(self, group_rank):
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    # ------------------------------------------------------------------ gather / release
    def gather(self, params, async_op=False):
        """Make ``params`` whole with one all-gather per dtype/device among them (not one per
        parameter: a collective's fixed latency would otherwise be paid hundreds of times a
        step). With ``async_op`` the all-gathers are only started; ``wait(params)`` (or a
        later ``gather``/``release``) finishes them."""
        todo = [p for p in params if p.ds_status is ZeroParamStatus.NOT_AVAILABLE]
        kinds = {}
        for param in todo:
            route = self.comm.route(self, param) if self.comm is not None else None
            kinds.setdefault((param.dtype, _compute_device(param), route), []).append(param)
        for (dtype, device, route), same in kinds.items():
            handle = _CoalescedGather(self, same, dtype, device, async_op, route)
            for param in same:
                param.ds_status = ZeroParamStatus.INFLIGHT
                param._ds_gather = handle
                if not param.ds_persist:
                    self.live_numel += param.ds_numel
        if not async_op:
            self.wait(params)  # those a prefetch started too

    def wait(self, params):
        for param in params:
            if param.ds_status is ZeroParamStatus.INFLIGHT:
                param._ds_gather.wait()

    def release(self, params, force=False):
        """Drop the full data of ``params`` (persistent ones stay, unless ``force``)."""
        for param in params:
            if param.ds_status is ZeroParamStatus.INFLIGHT:
                self.wait([param])
            if param.ds_persist and not force:
                continue
            if param.ds_status is ZeroParamStatus.AVAILABLE:
                param.data = _placeholder(param)
                param._ds_full = None
                param.ds_status = ZeroParamStatus.NOT_AVAILABLE
                if not param.ds_persist:
                    self.live_numel -= param.ds_numel

    def write_shard_from_full(self, param):
        """After ``param.data`` (whole) was modified: take this rank's shard from it."""
        self.load_full(param, param.data)

    def load_full(self, param, full):
        """Set ``param`` from a whole tensor ``full``: this rank's shard, and the full data
        too where it is resident (persistent or gathered)."""
        if full.numel() > param.ds_numel:  # shards concatenated over ranks: drop the padding
            full = full.reshape(-1).narrow(0, 0, param.ds_numel)
        if full.numel() != param.ds_numel:
            raise ValueError(f"parameter {param.ds_id} has {param.ds_numel} elements "
                             f"{tuple(param.ds_shape)}, got a tensor of {full.numel()}")
        if self.comm is not None and self.comm.load_full(self, param, full):
            return  # a shard stored in another form (MixZ++ int8)
        with torch.no_grad():
            piece = self.fetch(param)
            shard = piece.numel()
            flat = full.reshape(-1)
            start = self.rank * shard
            piece.zero_()
            length = max(0, min(shard, param.ds_numel - start))
            if length:
                piece.narrow(0, 0, length).copy_(flat.narrow(0, start, length))
            self.settle(param)
            if param.ds_status is ZeroParamStatus.AVAILABLE and param.data.data_ptr() != \
                    full.data_ptr():
                param.data.copy_(full.reshape(param.ds_shape))


def _all_gather_shards(partitioner, params, dtype, device, async_op=False):
    """Start one all-gather of the shards of ``params`` over the partitioner's group: every
    rank sends the concatenation of its shards, so the output is rank-major (rank ``r``'s block
    holds piece ``r`` of each parameter in turn). Returns (send buffer, output, work, shard
    sizes); the send buffer must live until the work completes."""
    return start_rank_major_gather(
        [partitioner.fetch(p) for p in params], partitioner.world_size, dtype, device,
        lambda output, send: partitioner.all_gather_into(output, send, async_op=async_op))


def _columns(output, world, sizes):
    """Each parameter's pieces in a rank-major all-gather output, as a (world, piece) view."""
    return output.view(world, sum(sizes)).split(sizes, dim=1)


class _CoalescedGather:
    """One all-gather for several parameters of one dtype and device (``_all_gather_shards``).

    A parameter's full data is the column of its pieces over the output's rank blocks; ``wait``
    copies the columns out (FSDP2's copy-out) into one flat buffer per persistence class, whose
    segments the parameters view: a persistent parameter, whole until the step, must not keep
    the other parameters' full data alive. A single parameter needs no copy: the output is
    its buffer. A ``route`` (``shard_comm``: ZeRO++, MiCS) replaces the plain all-gather."""

    def __init__(self, partitioner, params, dtype, device, async_op, route=None):
        self.partitioner = partitioner
        self.params = params
        self.device = device
        self.route = route
        self.world = route.world_size if route is not None else partitioner.world_size
        start = route.start if route is not None else _all_gather_shards
        self.send, self.output, self.work, self.sizes = start(
            partitioner, params, dtype, device, async_op)

    def wait(self):
        if self.params is None:
            return
        if self.work is not None and hasattr(self.work, "wait"):
            self.work.wait()
        if len(self.params) == 1:
            _point_at(self.params, [self.output])
        else:
            columns = _columns(self.output, self.world, self.sizes)
            for keep in (True, False):
                chosen = [i for i, p in enumerate(self.params) if p.ds_persist is keep]
                if chosen:
                    _point_at([self.params[i] for i in chosen],
                              _copy_out([columns[i] for i in chosen], self.output.dtype,
                                        self.device))
        for param in self.params:
            param._ds_gather = None
            param.ds_status = ZeroParamStatus.AVAILABLE
            self.partitioner.settle(param)
        if self.route is not None:
            self.route.gathered(self.params)
        self.params = self.output = self.send = self.work = None


def _copy_out(columns, dtype, device):
    """One flat buffer holding each (world, piece) column of a rank-major all-gather output as
    a whole parameter (its pieces back to back), filled by one foreach copy; returns the
    per-parameter segments."""
    sizes = [c.numel() for c in columns]
    flat = transient_empty(sum(sizes), dtype, device)
    segments = flat.split(sizes)
    torch._foreach_copy_([seg.view(c.shape) for seg, c in zip(segments, columns)], list(columns))
    return segments


def _point_at(params, buffers):
    """Each parameter's data becomes its (padded) full buffer, kept as ``_ds_full`` so that
    ``ResidentRefresh`` can write the next all-gather straight into it."""
    for param, full in zip(params, buffers):
        param.data = full.narrow(0, 0, param.ds_numel).view(param.ds_shape)
        param._ds_full = full


class ResidentRefresh:
    """Re-gathers parameters that are whole and stay whole (ZeRO-3's persistent ones, after
    each optimizer step) in place: one all-gather and one foreach copy into the full buffers
    they already view, with no per-parameter bookkeeping. The plan is made at the first
    refresh of a set and kept while every parameter still views the buffer it had then;
    otherwise (a parameter released or re-gathered since) a plain release and gather runs
    and the plan is made again."""

    def __init__(self):
        self._params = None
        self._targets = None  # per parameter: its full buffer as (world, piece)
        self._pointers = None

    def refresh(self, partitioner, params):
        if not params:
            return
        if not self._valid(params):
            partitioner.release(params, force=True)
            partitioner.gather(params)
            world = partitioner.world_size
            self._params = list(params)
            self._targets = [p._ds_full.view(world, -1) for p in params]
            self._pointers = [p.data.data_ptr() for p in params]
            return
        # the full buffers' device and dtype: shards may live on the host (offload_param)
        first = params[0].data
        _, output, _, sizes = _all_gather_shards(partitioner, params, first.dtype, first.device)
        if partitioner.shard_store is not None:
            for param in params:
                partitioner.settle(param)
        with torch.no_grad():
            torch._foreach_copy_(self._targets,
                                 list(_columns(output, partitioner.world_size, sizes)))

    def _valid(self, params):
        if self._params is None or len(self._params) != len(params):
            return False
        if len({(p.dtype, p.data.device) for p in params}) > 1:
            return False  # one send buffer needs one dtype and device: gather the plain way
        return all(a is b and a.ds_status is ZeroParamStatus.AVAILABLE and a.data.data_ptr() == ptr
                   for a, b, ptr in zip(self._params, params, self._pointers))


def by_partitioner(params):
    """``params`` grouped by the partitioner owning them, as [(partitioner, params)] in
    first-seen order (``zero.Init`` and the engine may have partitioned different parts of a
    model, and a collective runs within one partitioner's group)."""
    groups = {}
    for param in params:
        groups.setdefault(id(param.ds_partitioner), (param.ds_partitioner, []))[1].append(param)
    return list(groups.values())


def gather_params(params, async_op=False):
    """Make ``params`` whole: one coalesced all-gather per partitioner (and dtype)."""
    for partitioner, same in by_partitioner(params):
        partitioner.gather(same, async_op=async_op)


def release_params(params, force=False):
    for partitioner, same in by_partitioner(params):
        partitioner.release(same, force=force)


def apply_persistence(params, threshold, budget=None):
    """Mark the parameters that stay whole once gathered (``stage3_param_persistence_
    threshold``: fewer elements than this; ``stage3_model_persistence_threshold``: at most
    this many elements persisted in all). The engine decides this for its model, with its
    config, when it takes the model over; ``zero.Init`` never does, so a freshly built model
    holds no full parameter at all. Returns the number of elements persisted."""
    persisted = 0
    for param in params:
        keep = param.ds_numel < threshold and (budget is None
                                               or persisted + param.ds_numel <= budget)
        if param.ds_persist and not keep:
            param.ds_partitioner.release([param], force=True)
        elif keep and not param.ds_persist and param.ds_status is not \
                ZeroParamStatus.NOT_AVAILABLE:
            param.ds_partitioner.live_numel -= param.ds_numel  # whole already: now persistent
        param.ds_persist = keep
        persisted += param.ds_numel if keep else 0
    return persisted


def _compute_device(param):
    """Where the full parameter lives while gathered: the placeholder's device (the model's
    device), even when the shard sits on the host."""
    return param.data.device


def _add_methods(param):
    """Upstream's per-parameter conveniences."""
    def all_gather(self, param_list=None, async_op=False, hierarchy=0):
        self.ds_partitioner.gather(param_list or [self], async_op=async_op)

    def partition(self, param_list=None, hierarchy=0, has_been_updated=False):
        for p in (param_list or [self]):
            if has_been_updated:
                p.ds_partitioner.write_shard_from_full(p)
            p.ds_partitioner.release([p])  # persistent parameters stay whole

    def partition_numel(self):
        return self.ds_tensor.numel()

    def padding_size(self):
        return self.ds_tensor.numel() * self.ds_partitioner.world_size - self.ds_numel

    def ds_summary(self):
        return {"id": self.ds_id, "status": self.ds_status.name, "numel": self.ds_numel,
                "ds_numel": self.ds_numel, "shape": self.ds_shape, "ds_shape": self.ds_shape,
                "requires_grad": self.requires_grad, "persist": self.ds_persist,
                "partition_numel": self.ds_tensor.numel()}

    def all_gather_coalesced(self, params, safe_mode=False, quantize=False):
        """Start gathering ``params`` (one all-gather per partitioner and dtype) and return a
        handle whose ``wait()`` makes them whole. ``safe_mode`` (upstream's consistency
        check) always holds here: mixed dtypes are gathered separately. ``quantize`` needs a
        partitioner that quantizes its gathers (ZeRO++ ``zero_quantized_weights``)."""
        params = list(params)
        groups = by_partitioner(params)
        if quantize and not all(getattr(partitioner.comm, "quantized_weights", False)
                                for partitioner, _ in groups):
            raise ValueError("all_gather_coalesced(quantize=True): these parameters' gathers "
                             "are not quantized; enable zero_quantized_weights in the ZeRO "
                             "config, or pass quantize=False")
        for partitioner, own in groups:
            partitioner.gather(own, async_op=True)
        return CoalescedGatherHandle(groups)

    for fn in (all_gather, all_gather_coalesced, partition, partition_numel, padding_size,
               ds_summary):
        setattr(param, fn.__name__, types.MethodType(fn, param))


class CoalescedGatherHandle:
    """What ``param.all_gather_coalesced`` returns: ``wait()`` finishes the gathers."""

    def __init__(self, groups):
        self.groups = groups

    def wait(self):
        for partitioner, params in self.groups:
            partitioner.wait(params)


# ---------------------------------------------------------------------- zero.Init
# torch's own tensor constructors (upstream's names; transformers imports ``_orig_torch_arange``)
_orig_torch_empty = TORCH_FACTORIES["empty"]
_orig_torch_zeros = TORCH_FACTORIES["zeros"]
_orig_torch_ones = TORCH_FACTORIES["ones"]
_orig_torch_full = TORCH_FACTORIES["full"]
_orig_torch_arange = TORCH_FACTORIES["arange"]


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype, target_device=None):
    """Inside ``Init(dtype=...)`` buffers and temporaries a module builds with torch's
    constructors must match the dtype its parameters are cast to, else the first forward mixes
    dtypes. ``Init`` looks this function up by name each time it is entered, so a caller may
    swap it for the duration (transformers does, to exempt ``_orig_torch_arange``).
    ``target_device`` is used when the call names no device (None: torch's default)."""

    def wrapped(*args, **kwargs):
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if tensor.is_floating_point() and tensor.dtype != target_fp_dtype:
            tensor = tensor.to(target_fp_dtype)
        return tensor

    return wrapped


class Init:
    """Partition parameters as modules are constructed (context manager or decorator).

    ``remote_device`` "cpu"/"nvme" keeps shards on the host; ``dtype`` casts floating-point
    parameters before partitioning (default: the config's bf16/fp16 setting, else unchanged);
    ``config_dict_or_path`` supplies ``zero_optimization`` settings (offload, and
    ``override_module_apply``: whether ``Module.apply`` called during construction gathers the
    parameters first, default true); ``enabled=False`` makes it a no-op.
    ``mem_efficient_linear`` is accepted for compatibility (torch's Linear already saves only
    what backward needs)."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None, zero_param_parallel_group=None,
                 zero_quantized_weights=False, zero_quantized_nontrainable_weights=False,
                 sequence_data_parallel_group=None, param_swapper=None):
        self.enabled = enabled
        self.mem_efficient_linear = mem_efficient_linear
        self.dtype = dtype
        self.override_module_apply = True
        self._patches = PatchSet("zero.Init: module construction", self._patch)
        if not enabled:
            return
        if not dist.is_initialized():
            dist.init_distributed()
        group = data_parallel_group
        if group is None and mpu is not None:
            group = mpu.get_data_parallel_group()
        zero = zero_section(config_dict_or_path if config_dict_or_path is not None else config)
        if remote_device == "nvme" and zero is None:
            zero = {}
        if zero is not None:  # {} for remote_device "nvme" without a config
            self.dtype = self.dtype if self.dtype is not None else zero.get("dtype")
            self.override_module_apply = zero.get("override_module_apply", True)
        if remote_device is None and zero and zero["offload_device"] in ("cpu", "nvme"):
            remote_device = zero["offload_device"]
        store = None
        if remote_device == "nvme":
            store = nvme_store(zero, pin_memory)
        self.dp_process_group = group if group is not None else dist.get_world_group()
        self.partitioner = self._make_partitioner(group, remote_device=remote_device,
                                                  pin_memory=pin_memory, shard_store=store)
        if module is not None:  # upstream also accepts an already-built module
            partition_module(module, self.partitioner, self.dtype)

    def _make_partitioner(self, group, **kwargs):
        """The partitioner every module built inside shards over (``MiCS_Init``: its own)."""
        return Partitioner(group, **kwargs)

    def get_dp_process_group(self):
        """The communication group of all data-parallel ranks: ``data_parallel_group``, the
        ``mpu``'s, or else the world (``MiCS_Init`` partitions within a part of it)."""
        return self.dp_process_group

    def get_partition_rank(self):
        """This rank's position in the group parameters are partitioned over: it keeps piece
        number ``get_partition_rank()`` of every parameter built inside (``MiCS_Init``: its
        position in its shard group)."""
        return self.partitioner.rank

    def __enter__(self):
        if self.enabled:
            self._patches.install()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._patches.restore()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return wrapped

    def _patch(self, patches):
        """Make every module constructed inside the context partition its own parameters
        when built, and (with ``dtype``) torch's constructors build that dtype; the patches
        themselves are listed in ``deepspeed.zero.torch_patches``."""
        partitioner, dtype = self.partitioner, self.dtype
        patch_module_construction(
            patches, lambda module: partition_module(module, partitioner, dtype, recurse=False))
        if self.override_module_apply:
            patch_module_apply(patches, _gathered_for_apply)
        if dtype is not None:
            # looked up by name on each entry: transformers swaps it for the duration
            patch_tensor_factories(patches, globals()["zero_wrapper_for_fp_tensor_constructor"],
                                   dtype)


def publish_full(params, source_rank):
    """``params`` are whole and ``source_rank`` (a rank of their group) edited them: broadcast
    its full values, and every rank keeps its shard of them (and its full copy, while whole).
    Every rank passes the same parameters in the same order."""
    for param in params:
        partitioner = param.ds_partitioner
        if partitioner.world_size > 1:
            data = param.data.contiguous()
            dist.broadcast(data, src=partitioner._global(source_rank), group=partitioner.group)
            if data.data_ptr() != param.data.data_ptr():
                param.data.copy_(data)
        partitioner.write_shard_from_full(param)


@contextlib.contextmanager
def _gathered_for_apply(module):
    """``Module.apply`` inside ``Init``: every partitioned parameter of ``module``'s tree whole
    while ``fn`` runs (in ``ds_id`` order, the same on every rank), rank 0's edits kept by all
    ranks afterwards; what was gathered here is partitioned again."""
    params = sorted({id(p): p for p in module.parameters() if is_zero_param(p)}.values(),
                    key=lambda p: p.ds_id)
    gathered = [p for p in params if p.ds_status is not ZeroParamStatus.AVAILABLE]
    gather_params(gathered)
    try:
        yield
        with torch.no_grad():
            publish_full(params, source_rank=0)
    finally:
        release_params(gathered, force=True)


def partition_module(module, partitioner, dtype=None, recurse=True):
    """Partition the parameters of ``module`` (its own only, unless ``recurse``)."""
    for param in module.parameters(recurse=recurse):
        if is_zero_param(param):
            continue
        if dtype is not None and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
        partitioner.partition(param)
    return module
