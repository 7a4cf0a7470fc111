"""Bucketed reduce-scatter of gradients into each rank's partition (ZeRO stages 1, 2 and 3).

Stage 2 registers a post-accumulate-grad hook on every parameter: as backward produces a
gradient it is copied into its bucket's flat send buffer and freed (``contiguous_gradients``;
with it off a gradient stays in ``param.grad`` until its bucket is launched, and all of the
bucket's are copied then), and when a bucket is full it is reduce-scattered (asynchronously
with ``overlap_comm``, so communication runs while backward continues). Buckets are
launched strictly in bucket order on every rank: collectives pair up by issue order, so a
rank whose backward produced gradients in another order (or not at all for an unused
parameter) must not issue a different sequence; buckets holding parameters of a ZeRO-3 leaf
module (whose gradients depend on routing) wait for the end of backward. Stage 1 keeps
full gradients through accumulation and reduce-scatters all buckets at the boundary. ZeRO-3
works as stage 2 over ``ShardRun``s: runs of whole sharded parameters, one collective each.

Without ``reduce_scatter`` a bucket is all-reduced and each rank keeps its piece, or, with
``use_multi_rank_bucket_allreduce`` off, reduced to each piece's owner by one reduce per rank.

Each received piece is averaged (``gradient_averaging``) and *added* to the rank's fp32 gradient
partition, so micro-batches accumulate there. A param group partitioned over its own process
group (``deepspeed.hooks.GRADIENT_GROUP``: experts over their expert-data-parallel group) is
reduce-scattered over that group, still divided by the data-parallel world size. Under MiCS
(``deepspeed.zero.mics``) the group is a shard group and each received piece is then all-reduced
over the replica group, so it sums every data-parallel rank's gradient.
"""
from collections import deque

import torch

from deepspeed import comm as dist
from deepspeed.gradient_averaging import (communication_dtype, scale_after_reduce,
                                          scale_before_reduce)
from deepspeed.utils.transient_buffers import transient_empty
from deepspeed.zero.shard_comm import plain_reduce_scatter
from deepspeed.zero.z3_leaf_module import z3_leaf_parameter

MAX_BUCKETS_IN_FLIGHT = 2  # with overlap_comm: double buffering bounds the extra memory


class _AllOf:
    """The handles of several asynchronous collectives as one (``wait`` joins them all)."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            if work is not None and hasattr(work, "wait"):
                work.wait()


class UnusedParameterError(RuntimeError):
    """``ignore_unused_parameters: false`` and a parameter received no gradient."""


class GradientReducer:

    def __init__(self, buckets, grad_partitions, *, config, zero_config, group, rank, world_size,
                 param_names, after_grad_taken=None, group_comms=None, replica_group=None):
        # units of reduction, in launch order: stage 1/2 ``Bucket``s, ZeRO-3 ``ShardRun``s;
        # each places a gradient into its send buffer and owns one piece of a partition
        self.buckets = buckets
        self.grad_partitions = grad_partitions  # per group: fp32 flat tensor (rank's partition)
        self.config = config
        self.group = group
        self.rank = rank
        self.world_size = world_size  # the data-parallel size every average divides by
        # per optimizer param group: (process group, this rank in it) its buckets reduce over
        # (experts: their expert-data-parallel group); default the data-parallel group
        self.group_comms = group_comms
        # MiCS: the ranks holding the same partition; each reduced piece is summed over them
        self.replica_group = replica_group
        self.overlap = bool(zero_config.overlap_comm)
        self.use_reduce_scatter = bool(zero_config.reduce_scatter)
        self.contiguous = bool(zero_config.contiguous_gradients)
        # without reduce_scatter: one all-reduce of the whole bucket, or a reduce per owner
        self.multi_rank_allreduce = bool(zero_config.use_multi_rank_bucket_allreduce)
        self.ignore_unused = bool(zero_config.ignore_unused_parameters)
        self.param_names = param_names
        self.after_grad_taken = after_grad_taken  # ZeRO-3: release the gathered parameter
        # the reduce-scatter collective: a ``shard_comm.ShardComm`` (qgZ, MiCS) may replace it
        self.reduce_scatter = plain_reduce_scatter
        self._where = {}  # id(param) -> bucket index
        for index, bucket in enumerate(self.buckets):
            for param in bucket.params:
                self._where[id(param)] = index
        self._handles = []
        self.partitions_zeroed()  # the optimizer built them zeroed
        self._reset()

    def _reset(self):
        self._inputs = [None] * len(self.buckets)
        self._waiting = [[] for _ in self.buckets]  # contiguous_gradients off: grads not copied
        self._ready = [0] * len(self.buckets)
        self._next = 0
        self._pending = deque()
        self._seen = set()
        self._eager_limit = None  # buckets below this index may launch during backward

    # ------------------------------------------------------------------ stage 2: during backward
    def attach_hooks(self):
        for bucket in self.buckets:
            for param in bucket.params:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))

    def detach_hooks(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _grad_ready(self, param):
        index = self._where[id(param)]
        if self.contiguous:
            self.buckets[index].place_grad(self._input(index), param, param.grad)
            param.grad = None  # stage 2 keeps only the partition: the full gradient goes now
        else:  # copied with the rest of its bucket at launch (_take_waiting_grads)
            self._waiting[index].append(param)
        if self.after_grad_taken is not None:
            self.after_grad_taken(param)
        self._seen.add(id(param))
        self._ready[index] += 1
        self._launch_ready()

    def _input(self, index):
        if self._inputs[index] is None:
            bucket = self.buckets[index]
            dtype = communication_dtype(self.config, bucket.dtype)
            # a ZeRO-3 run writes every element itself (gradients, padding, missing ones at
            # launch), so its buffer is not zeroed up front: its pages are touched only as
            # backward delivers gradients, not all at once at the activation peak
            buffer = transient_empty(bucket.padded, dtype, bucket.device)
            if not getattr(bucket, "fills_itself", False):
                buffer.zero_()
            self._inputs[index] = buffer
        return self._inputs[index]

    def _first_leaf_bucket(self):
        """Index of the first bucket holding a parameter of a ZeRO-3 leaf module (an MoE block):
        which of its parameters get a gradient depends on each rank's routing, so such a
        bucket can be complete on one rank while another is still gathering the leaf for its
        backward; launching it then would pair a reduce-scatter with an all-gather. It and
        the buckets after it wait for the end of backward."""
        return next((index for index, bucket in enumerate(self.buckets)
                     if any(z3_leaf_parameter(p) for p in bucket.params)), len(self.buckets))

    def _launch_ready(self):
        if self._eager_limit is None:
            self._eager_limit = self._first_leaf_bucket()
        while (self._next < self._eager_limit
               and self._ready[self._next] == len(self.buckets[self._next].params)):
            self._launch(self._next)
            self._next += 1

    def finish(self):
        """End of a backward: reduce what is left (in bucket order), wait for everything."""
        for index in range(self._next, len(self.buckets)):
            if self._ready[index] < len(self.buckets[index].params):
                self._check_unused(index)
            self._launch(index)
        while self._pending:
            self._complete(self._pending.popleft())
        self._reset()

    def _check_unused(self, index):
        if self.ignore_unused:
            return
        bucket = self.buckets[index]
        missing = [self.param_names.get(id(p), "?") for p in bucket.params
                   if id(p) not in self._seen]
        raise UnusedParameterError(
            f"zero_optimization.ignore_unused_parameters is false and parameter(s) "
            f"{missing[:10]} received no gradient in this backward pass; make every parameter "
            f"take part in the loss or set ignore_unused_parameters: true")

    # ------------------------------------------------------------------ stage 1: at the boundary
    def reduce_param_grads(self, params):
        """Reduce-scatter the full gradients accumulated in ``param.grad`` and free them."""
        for index, bucket in enumerate(self.buckets):
            flat = self._input(index)
            for param in bucket.params:
                if param.grad is not None:
                    bucket.place_grad(flat, param, param.grad)
            self._launch(index)
        while self._pending:
            self._complete(self._pending.popleft())
        for param in params:
            param.grad = None
        self._reset()

    # ------------------------------------------------------------------ the collective
    def _take_waiting_grads(self, index):
        bucket = self.buckets[index]
        for param in self._waiting[index]:
            if param.grad is not None:
                bucket.place_grad(self._input(index), param, param.grad)
                param.grad = None
        self._waiting[index] = []

    def _launch(self, index):
        bucket = self.buckets[index]
        if self._waiting[index]:
            self._take_waiting_grads(index)
        if getattr(bucket, "fills_itself", False):
            bucket.zero_missing(self._input(index), self._seen)
        flat = scale_before_reduce(self._input(index), self.config)
        self._inputs[index] = None
        group, rank = (self.group, self.rank) if self.group_comms is None \
            else self.group_comms[bucket.group]
        if self.use_reduce_scatter:
            received = self._receive_buffer(bucket, flat)
            work = self.reduce_scatter(received, flat, group, self.overlap)
        elif self.multi_rank_allreduce:  # documented alternative: all-reduce, keep our piece
            work = dist.all_reduce(flat, group=group, async_op=self.overlap)
            received = flat.narrow(0, rank * bucket.piece, bucket.piece)
        else:  # use_multi_rank_bucket_allreduce off: one reduce to each piece's owner
            work = _AllOf([dist.reduce(flat.narrow(0, owner * bucket.piece, bucket.piece),
                                       dst=owner if group is None
                                       else dist.get_global_rank(group, owner),
                                       group=group, async_op=self.overlap)
                           for owner in range(dist.get_world_size(group=group))])
            received = flat.narrow(0, rank * bucket.piece, bucket.piece)
        self._pending.append((work, received, bucket, flat))
        limit = MAX_BUCKETS_IN_FLIGHT if self.overlap else 0
        while len(self._pending) > limit:
            self._complete(self._pending.popleft())

    def _target(self, bucket):
        return self.grad_partitions[bucket.group].narrow(0, bucket.partition_offset, bucket.piece)

    def _receive_buffer(self, bucket, flat):
        """Where this rank's reduced piece lands: straight in the gradient partition when it
        holds nothing yet (the first reduction since ``partitions_zeroed``) and has the
        communication dtype and device, saving a piece-sized buffer and an add; else a new
        buffer, added in ``_complete``."""
        target = self._target(bucket)
        if id(bucket) in self._empty_targets and target.dtype == flat.dtype \
                and target.device == flat.device:
            self._empty_targets.discard(id(bucket))
            return target
        self._empty_targets.discard(id(bucket))
        return transient_empty(bucket.piece, flat.dtype, flat.device)

    def partitions_zeroed(self):
        """The optimizer zeroed every gradient partition: the next reduction of each bucket
        may write its piece in place."""
        self._empty_targets = {id(bucket) for bucket in self.buckets}

    def _complete(self, entry):
        work, received, bucket, _send_buffer = entry  # the buffer must live until the wait
        if work is not None and hasattr(work, "wait"):
            work.wait()
        if self.replica_group is not None:
            dist.all_reduce(received, group=self.replica_group)
        scale_after_reduce(received, self.config, self.world_size)
        target = self._target(bucket)
        if received.data_ptr() != target.data_ptr():
            target.add_(received.to(device=target.device, dtype=target.dtype))
