"""ZeRO stages 1 and 2: fp32 master weights, optimizer state and (stage 2) gradients partitioned
across the data-parallel ranks; and the optimizer half of stage 3, whose parameters arrive
already sharded (``deepspeed.zero.partition_parameters``): one layout bucket each, reduced in
runs of many (``partition.ShardRun``).

Per step, on every rank:

    backward     stage 2: each bucket of gradients is reduce-scattered as soon as it is complete
                 (``gradient_reduction``), accumulating into this rank's fp32 gradient partition;
                 stage 1: full gradients accumulate in ``param.grad`` and are reduce-scattered at
                 the accumulation boundary
    step         unscale + overflow check (fp16, agreed by all ranks) -> clip with the global norm
                 (partition norms summed over ranks) -> the basic optimizer steps this rank's
                 fp32 partition (on the host with offload; swapped through NVMe sub-group by
                 sub-group with ``offload_optimizer.device: nvme``) -> the updated partition is
                 cast into the model's own buffers -> one all-gather per bucket publishes it

A param group whose parameters declare ``deepspeed.hooks.GRADIENT_GROUP`` (MoE experts, split
into their own groups by ``split_params_into_different_moe_groups_for_optimizer``) is laid out,
reduce-scattered, stepped and all-gathered over that group instead (``group_comms``), its
gradients still divided by the data-parallel world size like the core's all-reduce does; groups
without the attribute take exactly the old path.

The class is also the engine's precision policy (see ``deepspeed.precision.mixed_precision``
for the protocol), and the optimizer ``deepspeed.initialize`` returns. Checkpoint (de)serialising
of the partitions lives in ``deepspeed.zero.checkpointing``.
"""
import itertools

import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.hooks import (GRADIENT_GROUP, GRADIENT_NORM_GROUP, PARAM_STATE_ACCESS,
                             REPLICATED_PARAM)
from deepspeed.precision import OptimizerFace
from deepspeed.precision.loss_scaler import log_overflow, loss_scaler_from_config
from deepspeed.utils.logging import logger
from deepspeed.utils.timer import NoopTimer
from deepspeed.utils.transient_buffers import transient_empty
from deepspeed.zero.fragment_access import FragmentAccessMixin
from deepspeed.zero.gradient_reduction import GradientReducer
from deepspeed.zero.offload.partial import device_twin, split_partition, sync_hyperparameters
from deepspeed.zero.partition import build_layout, build_shard_layout, shard_runs


def _partitioning_of(module, dp_group, rank, world_size):
    """(group, rank in it, its size, replica group) of the partitioner sharding ``module``'s
    ZeRO-3 parameters (``Partitioner``'s seam; one for the whole model)."""
    partitioner = next((p.ds_partitioner for p in module.parameters()
                        if hasattr(p, "ds_partitioner")), None)
    if partitioner is None or partitioner.replica_group is None:
        return dp_group, rank, world_size, None
    return (partitioner.group, partitioner.rank, partitioner.world_size,
            partitioner.replica_group)


class DeepSpeedZeroOptimizer(FragmentAccessMixin, OptimizerFace):
    """Wraps the basic optimizer (built over the model's parameters) so that it steps this
    rank's fp32 partitions instead."""

    def __init__(self, optimizer, *, config, zero_config, module, dp_group=None, nvme_swapper=None,
                 offload_device=None, timers=None):
        self.optimizer = optimizer
        self.timers = timers if timers is not None else NoopTimer()  # wall_clock_breakdown
        self.config = config
        self.zero_config = zero_config
        self.stage = int(zero_config.stage)
        self.module = module
        self.dp_group = dp_group
        self.world_size = dist.get_world_size(group=dp_group)
        self.rank = dist.get_rank(group=dp_group)
        # the group ZeRO-3's parameters are sharded in (MiCS: a shard group, whose shards are
        # replicated across ``replica_group``); stages 1/2 and plain ZeRO-3: the dp group
        self.partition_group, self.partition_rank, self.partition_count, self.replica_group = \
            _partitioning_of(module, dp_group, self.rank, self.world_size) if self.stage >= 3 \
            else (dp_group, self.rank, self.world_size, None)
        self.loss_scaler = loss_scaler_from_config(config) if config.fp16_enabled else None
        self.overflow = False
        self.param_names = {id(p): n for n, p in module.named_parameters()}
        self._all_params = list(module.parameters())

        groups = []
        for group in optimizer.param_groups:
            trainable = [p for p in group["params"] if p.requires_grad]
            if any(p in optimizer.state for p in trainable):
                logger.warning("the optimizer passed to ZeRO already holds state; it is reset "
                               "(partitions start a fresh optimizer state)")
            groups.append(trainable)
        # per param group: (process group, rank in it, its size, norm weight); a group whose
        # parameters declare deepspeed.hooks.GRADIENT_GROUP (experts) is partitioned over it
        self.group_comms = self._group_comms(groups, optimizer.param_groups)
        if self.stage >= 3:  # parameters are already sharded: one bucket per parameter
            self.layouts = build_shard_layout(groups, self.partition_count, self.partition_rank)
        else:
            self.layouts = build_layout(groups, [c[2] for c in self.group_comms],
                                        zero_config.reduce_bucket_size)
        self.partitioned_params = [layout.params for layout in self.layouts]
        for params in self.partitioned_params:
            for param in params:
                setattr(param, PARAM_STATE_ACCESS, self)  # deepspeed.utils.safe_get_full_*

        # the backend's device: NCCL takes no host tensors, so the overflow flag and the norm's
        # sum of squares are reduced here even when the gradients live on the host (offload)
        self.comm_device = torch.device(get_accelerator().current_device_name())
        device = next((b.device for layout in self.layouts for b in layout.buckets),
                      self.comm_device)
        self.master_device = torch.device(offload_device) if offload_device else device
        # fp16.fp16_master_weights_and_grads (ZeRO-Offload; the plugin checks): fp16 masters
        # and gradient partitions, half their bytes (DeepSpeedCPUAdam keeps fp32 moments)
        self.master_dtype = torch.float16 if config.fp16_master_weights_and_grads else torch.float32
        pin = bool(getattr(zero_config.offload_optimizer, "pin_memory", False))
        self.sub_group_size = max(int(zero_config.sub_group_size), 1)
        # partial offload (offload_optimizer.ratio < 1): the sub-groups past each group's cut
        # stay on ``device``, stepped there by a twin of the optimizer (deepspeed.zero.offload.
        # partial); ``device_optimizer`` is None when everything sits in one place
        offload = zero_config.offload_optimizer
        ratio = float(offload.ratio) if offload_device and offload is not None else 1.0
        self.resident_device = device
        self._resident = set()  # id() of the sub-groups kept on ``device``
        self.chunks = []  # per group: fp32 Parameters covering the rank's partition in order
        self.grad_partitions = []
        optimizer.state.clear()
        resident_groups = []
        for layout, group in zip(self.layouts, optimizer.param_groups):
            flat = self._concatenated([self._read_piece(b) for b in layout.buckets])
            chunks, resident = [], []
            for piece, offloaded in split_partition(flat, ratio, self.sub_group_size):
                if offloaded:
                    chunks.append(torch.nn.Parameter(self._maybe_pin(piece.clone(), pin)))
                else:
                    resident.append(torch.nn.Parameter(piece.to(device, copy=True)))
                    self._resident.add(id(resident[-1]))
                    chunks.append(resident[-1])
            self.chunks.append(chunks)
            self.grad_partitions.append(self._maybe_pin(
                torch.zeros(layout.partition_numel, dtype=self.master_dtype,
                            device=self.master_device), pin))
            group["params"] = [c for c in chunks if id(c) not in self._resident]
            resident_groups.append(dict(group, params=resident))
        self.device_optimizer = (device_twin(optimizer, device, resident_groups)
                                 if self._resident else None)
        self._segments = [self._chunk_segments(g) for g in range(len(self.layouts))]
        self._chunk_starts = {}  # id(chunk) -> (group, offset in the group's partition)
        for group, chunks in enumerate(self.chunks):
            start = 0
            for chunk in chunks:
                self._chunk_starts[id(chunk)] = (group, start)
                start += chunk.numel()

        if self.stage >= 3 and nvme_swapper is None:  # NVMe swaps the chunks' storage out
            self._shards_view_masters()
        release = None
        if self.stage >= 3:
            def release(param):
                if not param.ds_persist:  # persistent ones stay whole until the step
                    param.ds_partitioner.release([param])
        if self.stage >= 3:  # gradients of many parameters per reduce-scatter
            units = shard_runs(self.layouts, zero_config.reduce_bucket_size)
        else:
            units = [b for layout in self.layouts for b in layout.buckets]
        self.reducer = GradientReducer(units, self.grad_partitions, config=config,
                                       zero_config=zero_config, group=dp_group, rank=self.rank,
                                       world_size=self.world_size, param_names=self.param_names,
                                       after_grad_taken=release,
                                       group_comms=[c[:2] for c in self.group_comms],
                                       replica_group=self.replica_group)
        if self.stage >= 2:
            self.reducer.attach_hooks()
        # ZeRO-3: per partitioner, the in-place refresh of the persistent parameters
        self._refreshers = None
        self.swapper = nvme_swapper(optimizer) if nvme_swapper is not None else None
        if self.swapper is not None:  # fast_init: the first writes are queued together
            self.swapper.swap_out_all(self.offloaded_chunks,
                                      wait_each=not zero_config.offload_optimizer.fast_init)

    def _group_comms(self, groups, param_groups):
        """Per param group ``(process group, this rank in it, its size, norm weight)``: the
        data-parallel group, unless its parameters declare ``GRADIENT_GROUP``; then all of
        them must declare the same one. The norm weight makes the data-parallel sum of the
        partitions' squares count each distinct gradient once: 1 for the data-parallel group
        and for parameters whose copies differ between groups (``GRADIENT_NORM_GROUP``),
        ``|group| / dp world size`` for identical copies."""
        # MiCS: each gradient element sits on dp size / shard size replicas of its partition
        default = (self.partition_group, self.partition_rank, self.partition_count,
                   1.0 if self.partition_count == self.world_size
                   else self.partition_count / self.world_size)
        out = []
        for index, params in enumerate(groups):
            declared = {id(getattr(p, GRADIENT_GROUP, None)): p for p in params}
            if len(declared) > 1:
                name = param_groups[index].get("name")
                label = f"{index}" + (f" ({name!r})" if name else "")
                with_group = [self.param_names.get(id(p), "?") for p in params
                              if getattr(p, GRADIENT_GROUP, None) is not None][:3]
                without = [self.param_names.get(id(p), "?") for p in params
                           if getattr(p, GRADIENT_GROUP, None) is None][:3]
                raise ValueError(
                    f"ZeRO stage {self.stage}: optimizer param group {label} mixes parameters "
                    f"reduced over different process groups (deepspeed.hooks.GRADIENT_GROUP), "
                    f"e.g. {with_group} declare one and {without or 'others'} "
                    f"{'do not' if without else 'another'}; ZeRO partitions each param group "
                    f"over one process group, so put them in separate param groups (for MoE: "
                    f"deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer)")
            group = getattr(next(iter(declared.values())), GRADIENT_GROUP, None) \
                if declared else None
            if group is None:
                out.append(default)
                continue
            if self.stage >= 3:
                raise NotImplementedError(
                    f"ZeRO stage 3 cannot partition optimizer param group {index}: its "
                    f"parameters declare their own gradient process group "
                    f"(deepspeed.hooks.GRADIENT_GROUP, e.g. MoE experts), but ZeRO-3 shards "
                    f"every parameter over the whole data-parallel group; use ZeRO stage 1 or 2")
            world = dist.get_world_size(group=group)
            shared = all(getattr(p, GRADIENT_NORM_GROUP, None) is not None for p in params)
            weight = 1.0 if shared else world / self.world_size
            out.append((group, dist.get_rank(group=group), world, weight))
        return out

    def _shards_view_masters(self):
        """ZeRO-3 with fp32 parameters: each shard becomes a view of the fp32 master chunk
        that copies it, so a rank keeps its partition once instead of twice (-partition
        bytes of live memory: 6.1 MiB per rank on the 3.2 M-parameter bench GPT, where the
        bucketed path otherwise peaked 15-25 MiB above the per-parameter one). Every value
        stays the same: the master was read from the shard, and the write-back after each
        step copied it back bit for bit (it now skips the copy, ``_write_back``); an edit of
        the weights (``GatheredParameters(modifier_rank=...)``, ``load_full``) reaches the
        master at once, which ``refresh_fp32_param`` did anyway. Only where a shard is a plain
        resident fp32 tensor on the master's device: ZeRO++/MiCS routes (``comm``), NVMe
        shards and 16-bit models keep their own copy."""
        for group, chunks in enumerate(self.chunks):
            for chunk, segments in zip(chunks, self._segments[group]):
                for at, bucket, offset, length in segments:
                    param = bucket.params[0]
                    shard = param.ds_tensor
                    if (offset or length != shard.numel() or not bucket.resident
                            or param.ds_partitioner.comm is not None
                            or shard.dtype != chunk.dtype or shard.device != chunk.device
                            or not shard.is_contiguous()):
                        continue
                    view = chunk.data.narrow(0, at, length)
                    if torch.equal(view, shard):
                        param.ds_tensor = view

    def _rank_in(self, bucket):
        """This rank's index in the process group ``bucket``'s param group is partitioned over."""
        return self.group_comms[bucket.group][1]

    def _read_piece(self, bucket):
        piece = bucket.piece_of(self._rank_in(bucket)).detach().to(
            self.master_device, self.master_dtype, copy=True)
        bucket.settle()
        return piece

    def _concatenated(self, pieces):
        """The rank's whole partition of a group, only to be cut into chunks that copy it: a
        transient buffer, so freeing it does not leave glibc's heap (and every later
        activation) sized for the whole partition (see ``transient_buffers``)."""
        if not pieces:
            return torch.zeros(0, dtype=self.master_dtype, device=self.master_device)
        flat = transient_empty(sum(p.numel() for p in pieces), pieces[0].dtype, pieces[0].device)
        return torch.cat(pieces, out=flat)

    @staticmethod
    def _maybe_pin(tensor, pin):
        return get_accelerator().pin_memory(tensor) if pin and tensor.device.type == "cpu" \
            else tensor

    @property
    def all_chunks(self):
        return [c for chunks in self.chunks for c in chunks]

    @property
    def offloaded_chunks(self):
        """The sub-groups the basic optimizer steps (all of them without partial offload)."""
        return [c for c in self.all_chunks if id(c) not in self._resident]

    @property
    def resident_chunks(self):
        """Partial offload: the sub-groups ``device_optimizer`` steps where they were built."""
        return [c for c in self.all_chunks if id(c) in self._resident]

    def optimizer_for(self, chunk):
        """The optimizer that steps (and holds the state of) sub-group ``chunk``."""
        return self.device_optimizer if id(chunk) in self._resident else self.optimizer

    def _chunk_segments(self, group):
        """For each chunk of ``group``: [(offset in chunk, bucket, offset in piece, length)]."""
        out, start = [], 0
        buckets = self.layouts[group].buckets
        for chunk in self.chunks[group]:
            segs, stop = [], start + chunk.numel()
            for bucket in buckets:
                lo = max(start, bucket.partition_offset)
                hi = min(stop, bucket.partition_offset + bucket.piece)
                if lo < hi:
                    segs.append((lo - start, bucket, lo - bucket.partition_offset, hi - lo))
            out.append(segs)
            start = stop
        return out

    # ------------------------------------------------------------------ optimizer face
    def step(self, closure=None):
        """Step the partitions and publish them; the engine unscales and clips first."""
        if closure is not None:
            raise ValueError("ZeRO optimizers do not support a closure in step()")
        self.optimizer_step()
        self.after_optimizer_step()

    def state_dict(self):
        from deepspeed.zero.checkpointing import partition_state_dict

        return partition_state_dict(self)

    def load_state_dict(self, state_dict, load_from_fp32_weights=None):
        from deepspeed.zero.checkpointing import load_partition_state_dict

        load_partition_state_dict(self, state_dict, load_from_fp32_weights)

    def refresh_fp32_params(self):
        """Re-derive this rank's fp32 partition from the model's (possibly 16-bit) weights."""
        with torch.no_grad():
            for group, chunks in enumerate(self.chunks):
                for chunk, segments in zip(chunks, self._segments[group]):
                    self._swap_in(chunk)
                    for at, bucket, offset, length in segments:
                        chunk.data.narrow(0, at, length).copy_(
                            bucket.piece_of(self._rank_in(bucket)).narrow(0, offset, length))
                        bucket.settle()
                    self._swap_out(chunk)

    # ------------------------------------------------------------------ precision protocol
    def scale_loss(self, loss):
        return loss.float() * self.cur_scale if self.loss_scaler is not None else loss

    def accumulate_micro_grads(self):
        """Stage 2 reduces every micro-batch: finish this backward's buckets."""
        if self.stage >= 2:
            self.timers("zero_reduce_wait").start()
            self.reducer.finish()
            self.timers("zero_reduce_wait").stop()

    def reduce_gradients(self):
        """At the accumulation boundary (the plugin's reduce hook)."""
        if self.stage < 2:
            self.timers("zero_reduce").start()
            self.reducer.reduce_param_grads(
                [p for params in self.partitioned_params for p in params])
            self.timers("zero_reduce").stop()

    def reduction_grads(self):
        return []  # the plugin reduces; the core all-reduce never runs under ZeRO

    def unscale_grads(self):
        """Unscale the fp32 gradient partitions; False when any rank saw inf/nan (fp16)."""
        if self.loss_scaler is None:
            self.overflow = False
            return True
        if self.cur_scale != 1.0:
            for grads in self.grad_partitions:
                grads.mul_(1.0 / self.cur_scale)
        bad = torch.zeros(1, device=self.comm_device)
        for grads in self.grad_partitions:
            if grads.numel() and not torch.isfinite(grads).all():
                bad.fill_(1.0)
                break
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank skips, or none
        self.overflow = bool(bad.item())
        return not self.overflow

    def clip_grad_norm(self, max_norm, norm_group=None):
        """Global L2 norm of the gradients (each rank holds a disjoint partition), and clip.
        With ``norm_group`` (pipeline stages) the norm spans the group too, and this rank's
        fragments of parameters marked ``REPLICATED_PARAM`` are left out (counted elsewhere)."""
        squares = torch.zeros(1, dtype=torch.float64, device=self.comm_device)
        # each rank holds a disjoint piece of each gradient (expert groups: of its experts',
        # and the expert-data-parallel groups together span the data-parallel group), so the
        # data-parallel sum below counts every distinct gradient element once
        for grads, comm in zip(self.grad_partitions, self.group_comms):
            if grads.numel():
                part = grads.double().pow(2).sum().to(self.comm_device)
                squares += part if comm[3] == 1.0 else part * comm[3]
        if norm_group is not None:
            for params in self.partitioned_params:
                for param in params:
                    if getattr(param, REPLICATED_PARAM, False):
                        frag = self.fragment_of(param)
                        if frag.length:
                            piece = self.grad_partitions[frag.group].narrow(
                                0, frag.partition_offset, frag.length)
                            squares -= piece.double().pow(2).sum().to(self.comm_device) \
                                * self.group_comms[frag.group][3]
        dist.all_reduce(squares, group=self.dp_group)
        if norm_group is not None:
            dist.all_reduce(squares, group=norm_group)
        total = float(squares.sqrt())
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for grads in self.grad_partitions:
                grads.mul_(coef)
        return total

    def master_params(self):
        return self.all_chunks

    def model_param_of(self, stepped):
        """Flat partitions stand for no single parameter (universal checkpoints load through
        this plugin's own reader)."""
        return None

    def optimizer_step(self):
        """Step this rank's partition and cast it into the model's buckets."""
        self.timers("zero_optimizer_step").start()
        try:
            self._optimizer_step()
        finally:
            self.timers("zero_optimizer_step").stop()

    def _optimizer_step(self):
        if self.device_optimizer is not None:  # partial offload: the part kept on the device
            self._attach_grads(self.resident_chunks)
            sync_hyperparameters(self.optimizer, self.device_optimizer)
            self.device_optimizer.step()
            self._write_back_chunks(self._resident)
        if self.swapper is None:
            self._attach_grads(self.offloaded_chunks)
            self.optimizer.step()
            self._write_back_chunks({id(c) for c in self.offloaded_chunks})
            return
        self._step_sub_groups()

    def _write_back_chunks(self, which):
        """``_write_back`` every sub-group whose id() is in ``which``."""
        for group, chunks in enumerate(self.chunks):
            for chunk, segments in zip(chunks, self._segments[group]):
                if id(chunk) in which:
                    self._write_back(chunk, segments)

    def _step_sub_groups(self):
        """NVMe: one sub-group in memory at a time; with ``pipeline_read`` the next one is read
        while it steps, with ``pipeline_write`` its write runs while the next one steps."""
        order = [(g, i) for g, chunks in enumerate(self.chunks) for i in range(len(chunks))
                 if id(chunks[i]) not in self._resident]
        real_groups = self.optimizer.param_groups
        try:
            for position, (group, index) in enumerate(order):
                chunk = self.chunks[group][index]
                self.swapper.swap_in(chunk)
                if self.swapper.read_ahead and position + 1 < len(order):
                    # offload_optimizer.pipeline_read: the next sub-group is read while this
                    # one steps
                    nxt = order[position + 1]
                    self.swapper.prefetch(self.chunks[nxt[0]][nxt[1]])
                self._attach_grads([chunk])
                # a private copy of the group, so group-level counters advance once per step
                single = dict(real_groups[group], params=[chunk])
                self.optimizer.param_groups = [single]
                self.optimizer.step()
                real_groups[group].update({k: v for k, v in single.items() if k != "params"})
                self._write_back(chunk, self._segments[group][index])
                chunk.grad = None
                self.swapper.swap_out(chunk)
        finally:
            self.optimizer.param_groups = real_groups

    def _attach_grads(self, chunks):
        for chunk in chunks:
            group, start = self._chunk_starts[id(chunk)]
            grad = self.grad_partitions[group].narrow(0, start, chunk.numel())
            # partial offload: gradients are reduced on the offload device; a resident
            # sub-group takes a copy of its part where it lives
            chunk.grad = grad if grad.device == chunk.device else grad.to(chunk.device)

    def _write_back(self, chunk, segments):
        """Cast the stepped ``chunk`` into the buckets' pieces: one foreach copy for all pieces
        held in memory (ZeRO-3 has a segment per parameter, and a copy call each cost ~1% of
        the demo GPT's step); a shard kept on NVMe is read, written and put back one at a time,
        so at most one is resident."""
        targets, sources = [], []
        data = chunk.detach()
        with torch.no_grad():
            for source, (_, bucket, offset, length) in zip(_cut(data, segments), segments):
                target = bucket.piece_of(self._rank_in(bucket))
                if offset or length != target.numel():  # usually the whole piece: no view
                    target = target.narrow(0, offset, length)
                if target.data_ptr() == source.data_ptr():
                    continue  # a ZeRO-3 shard viewing its master chunk: stepped in place
                if bucket.resident:
                    targets.append(target)
                    sources.append(source)
                else:
                    target.copy_(source)
                    bucket.settle()
            if targets:
                torch._foreach_copy_(targets, sources)

    def after_optimizer_step(self):
        """Publish every rank's updated piece to all ranks (ZeRO-3: only the persistent
        parameters are whole between steps; the rest are gathered when next used)."""
        self.timers("zero_allgather").start()
        try:
            self._publish()
        finally:
            self.timers("zero_allgather").stop()

    def _publish(self):
        if self.stage >= 3:  # one all-gather refreshes every resident persistent parameter
            from deepspeed.zero.partition_parameters import (ResidentRefresh, ZeroParamStatus,
                                                             by_partitioner)

            resident = [p for params in self.partitioned_params for p in params
                        if p.ds_persist and p.ds_status is ZeroParamStatus.AVAILABLE]
            if self._refreshers is None:
                self._refreshers = {}
            for partitioner, params in by_partitioner(resident):
                self._refreshers.setdefault(id(partitioner), ResidentRefresh()) \
                    .refresh(partitioner, params)
            return
        gather_size = max(int(self.zero_config.allgather_bucket_size), 1)
        for layout in self.layouts:
            for bucket in layout.buckets:
                group, rank, world, _ = self.group_comms[bucket.group]
                if world == 1:
                    continue
                if not self.zero_config.allgather_partitions:
                    for owner in range(world):
                        dist.broadcast(bucket.piece_of(owner),
                                       src=self._global_rank(owner, group), group=group)
                elif bucket.padded <= gather_size:
                    dist.all_gather_into_tensor(bucket.buffer, bucket.piece_of(rank).clone(),
                                                group=group)
                else:
                    self._gather_in_chunks(bucket, max(gather_size // world, 1))

    def _gather_in_chunks(self, bucket, per_rank):
        group, rank, world, _ = self.group_comms[bucket.group]
        for start in range(0, bucket.piece, per_rank):
            length = min(per_rank, bucket.piece - start)
            received = torch.empty(length * world, dtype=bucket.buffer.dtype,
                                   device=bucket.buffer.device)
            dist.all_gather_into_tensor(
                received, bucket.piece_of(rank).narrow(0, start, length).clone(), group=group)
            for owner in range(world):
                bucket.piece_of(owner).narrow(0, start, length).copy_(
                    received.narrow(0, owner * length, length))

    def _global_rank(self, group_rank, group=None):
        if group is None:
            return group_rank
        return dist.get_global_rank(group, group_rank)

    def update_scale(self, overflow):
        if self.loss_scaler is None:
            return
        attempted = self.loss_scaler.cur_scale
        self.loss_scaler.update_scale(overflow)
        if overflow and dist.get_rank() == 0:
            log_overflow(0, attempted, self.loss_scaler.cur_scale)

    def zero_grad(self, set_to_none=True):
        for grads in self.grad_partitions:
            grads.zero_()
        self.reducer.partitions_zeroed()
        for chunk in self.all_chunks:
            chunk.grad = None
        for param in self._all_params:
            param.grad = None

    # ------------------------------------------------------------------ NVMe helpers
    def _swap_in(self, chunk):
        if self.swapper is not None and id(chunk) not in self._resident:
            self.swapper.swap_in(chunk)

    def _swap_out(self, chunk):
        if self.swapper is not None and id(chunk) not in self._resident:
            self.swapper.swap_out(chunk)

    def forget_resident(self):
        """Drop the refresh plans of ZeRO-3's persistent parameters (``empty_partition_cache``
        released them): a plan views the full buffers, which would otherwise stay allocated;
        the next step makes new plans for whatever is whole again by then."""
        self._refreshers = None

    def destroy(self):
        self.reducer.detach_hooks()
        if self.swapper is not None:
            self.swapper.close()


def _cut(data, segments):
    """The stretches of ``data`` that ``segments`` ((offset, bucket, offset in piece, length))
    name: one ``split`` when they tile it in order (ZeRO-3, a segment per parameter: a
    ``narrow`` each was most of the write-back's cost), else a ``narrow`` per segment."""
    starts = [at for at, _, _, _ in segments]
    lengths = [length for _, _, _, length in segments]
    if list(itertools.accumulate(lengths, initial=0)) == starts + [data.numel()]:
        return data.split(lengths)
    return [data.narrow(0, at, length) for at, length in zip(starts, lengths)]
