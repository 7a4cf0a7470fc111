"""What each pipeline stage does, step by step (``deepspeed.runtime.pipe.schedule``).

A schedule is pure data: for one stage it yields, per step, a list of ``PipeInstruction``s (load
a micro-batch, run a forward, send an activation ...). The engine executes them; nothing here
touches tensors or process groups, so every schedule can be checked on plain lists.

Each step is atomic with respect to communication: every send a stage issues in step ``k`` is
matched by a receive its neighbour issues in the same step ``k``, in the same order on both
sides, so a barrier between successive steps can never deadlock and blocking point-to-point
calls are enough.

Buffers: a stage keeps ``num_pipe_buffers()`` slots for in-flight micro-batches; micro-batch
``j`` lives in slot ``j % num_pipe_buffers()``.
"""
from abc import ABC, abstractmethod


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class PipeSchedule(ABC):
    """Generates the per-step instruction lists of one stage of a pipeline.

    Subclasses implement ``steps()``; they should also specialise ``num_pipe_buffers()`` (the
    default, one buffer per micro-batch, is the most memory any schedule could need).

    Args:
        micro_batches: micro-batches per batch (the gradient-accumulation steps).
        stages: number of pipeline stages.
        stage_id: the stage this schedule is for, in ``[0, stages)``.
    """

    def __init__(self, micro_batches, stages, stage_id):
        _check_positive("micro_batches", micro_batches)
        _check_positive("stages", stages)
        if isinstance(stage_id, bool) or not isinstance(stage_id, int) \
                or not 0 <= stage_id < stages:
            raise ValueError(f"stage_id must be an integer in [0, {stages}), got {stage_id!r}")
        super().__init__()
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id
        self.prev_stage = self.stage_id - 1
        self.next_stage = self.stage_id + 1
        self.it = None

    @abstractmethod
    def steps(self):
        """Yield, for each step, the list of ``PipeInstruction``s this stage executes."""

    def num_pipe_buffers(self):
        """How many micro-batch buffers this stage must allocate."""
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id):
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id):
        return 0 <= stage_id < self.stages

    def _buffer_idx(self, micro_batch_id):
        """The buffer slot of a micro-batch (``micro_batch_id % num_pipe_buffers()``)."""
        if not self._valid_micro_batch(micro_batch_id):
            raise ValueError(f"micro_batch_id must be in [0, {self.micro_batches}), "
                             f"got {micro_batch_id}")
        return micro_batch_id % self.num_pipe_buffers()

    @property
    def stage(self):
        return self.stage_id

    @property
    def num_stages(self):
        return self.stages

    @property
    def num_micro_batches(self):
        return self.micro_batches

    @property
    def is_first_stage(self):
        return self.stage_id == 0

    @property
    def is_last_stage(self):
        return self.stage_id == self.stages - 1

    def __iter__(self):
        self.it = None
        return self

    def __next__(self):
        if self.it is None:
            self.it = self.steps()
        return next(self.it)


class InferenceSchedule(PipeSchedule):
    """Pipelined inference: micro-batch ``j`` is at stage ``s`` in step ``j + s``, so a batch
    takes ``micro_batches + stages - 1`` steps.

    Only two buffers are needed (the micro-batch being computed and the one being passed on),
    alternating with the micro-batch's parity. To keep blocking sends and receives from
    deadlocking, even stages send before they receive and odd stages receive before they send.
    """

    def steps(self):
        for step_id in range(self.micro_batches + self.stages - 1):
            micro_batch_id = step_id - self.stage_id
            prev_micro_batch_id = micro_batch_id - 1
            cmds = []
            if self._valid_micro_batch(micro_batch_id) and (self.is_first_stage
                                                            or self.is_last_stage):
                cmds.append(LoadMicroBatch(self._buffer_idx(micro_batch_id)))

            sends, recvs = [], []
            if self._valid_micro_batch(prev_micro_batch_id) and self._valid_stage(self.next_stage):
                sends.append(SendActivation(self._buffer_idx(prev_micro_batch_id)))
            if self._valid_micro_batch(micro_batch_id) and self._valid_stage(self.prev_stage):
                recvs.append(RecvActivation(self._buffer_idx(micro_batch_id)))
            cmds.extend(sends + recvs if self.stage_id % 2 == 0 else recvs + sends)

            if self._valid_micro_batch(micro_batch_id):
                cmds.append(ForwardPass(self._buffer_idx(micro_batch_id)))
            yield cmds

    def num_pipe_buffers(self):
        return 2


class TrainSchedule(PipeSchedule):
    """Synchronous 1F1B training: after filling the pipeline each stage alternates one forward
    and one backward, and the optimizer steps once every micro-batch has gone through both.

    Pipeline parallelism here is gradient accumulation, so convergence matches data-parallel
    training with the same batch size. A batch takes ``2 * (micro_batches + stages - 1)`` steps:

    * stage ``s`` works on forwards in steps with ``k + s`` even (micro-batch ``(k - s) / 2``)
      and on backwards in the others (micro-batch ``(k - (2 * stages - 1 - s)) / 2``), so
      neighbouring stages are always in opposite phases;
    * what a stage computed in step ``k - 1`` is sent in step ``k``: an activation to the next
      stage after a forward, a gradient to the previous one after a backward. The neighbour,
      being in the opposite phase, receives it for the work of that same step;
    * a forward step sends its gradient before receiving its activation and a backward step
      receives its gradient before sending its activation, so both ends of each link see the
      grad pair first;
    * the last step ends with ``ReduceTiedGrads``, ``ReduceGrads``, ``OptimizerStep``.
    """

    def steps(self):
        total_steps = 2 * (self.micro_batches + self.stages - 1)
        prev_micro_batch_id = -1
        for step_id in range(total_steps):
            micro_batch_id, is_forward = self._step_to_micro_batch(step_id)
            cmds = []
            if is_forward:
                # the gradient of the previous step's backward goes upstream ...
                if self._valid_micro_batch(prev_micro_batch_id) \
                        and self._valid_stage(self.prev_stage):
                    cmds.append(SendGrad(self._buffer_idx(prev_micro_batch_id)))
                # ... then this forward's input arrives from upstream
                if self._valid_micro_batch(micro_batch_id) and self._valid_stage(self.prev_stage):
                    cmds.append(RecvActivation(self._buffer_idx(micro_batch_id)))
            else:
                # this backward's gradient arrives from downstream ...
                if self._valid_micro_batch(micro_batch_id) and self._valid_stage(self.next_stage):
                    cmds.append(RecvGrad(self._buffer_idx(micro_batch_id)))
                # ... then the previous step's forward output goes downstream
                if self._valid_micro_batch(prev_micro_batch_id) \
                        and self._valid_stage(self.next_stage):
                    cmds.append(SendActivation(self._buffer_idx(prev_micro_batch_id)))

            if self._valid_micro_batch(micro_batch_id):
                buffer_id = self._buffer_idx(micro_batch_id)
                if is_forward:
                    # the first stage loads inputs, the last one labels
                    if self.is_first_stage or self.is_last_stage:
                        cmds.append(LoadMicroBatch(buffer_id))
                    cmds.append(ForwardPass(buffer_id))
                else:
                    cmds.append(BackwardPass(buffer_id))

            if step_id == total_steps - 1:
                cmds.extend([ReduceTiedGrads(), ReduceGrads(), OptimizerStep()])
            prev_micro_batch_id = micro_batch_id
            yield cmds

    def num_pipe_buffers(self):
        """The most forwards this stage has in flight before their backwards: its distance to
        the end of the pipeline, capped by the micro-batch count, and at least 2 (one buffer
        being received into while another is computed on)."""
        return max(2, min(self.stages - self.stage_id, self.micro_batches))

    def _step_to_micro_batch(self, step_id):
        """``(micro_batch_id, is_forward)`` of this stage's work in ``step_id``; the id is outside
        ``[0, micro_batches)`` while the pipeline fills or drains."""
        if (step_id + self.stage_id) % 2 == 0:
            return (step_id - self.stage_id) // 2, True
        return (step_id - (2 * self.stages - 1 - self.stage_id)) // 2, False


class DataParallelSchedule(PipeSchedule):
    """Plain data parallelism with gradient accumulation, written as a schedule (an example of
    the interface): load, forward, backward per micro-batch, then reduce and step."""

    def steps(self):
        for step_id in range(self.micro_batches):
            cmds = [LoadMicroBatch(buffer_id=0), ForwardPass(buffer_id=0),
                    BackwardPass(buffer_id=0)]
            if step_id == self.micro_batches - 1:
                cmds.extend([ReduceGrads(), OptimizerStep()])
            yield cmds

    def num_pipe_buffers(self):
        return 1


class PipeInstruction:
    """One action of a schedule step. Every keyword argument becomes an attribute (as in a
    namedtuple) for the engine to read; ``name`` is the class name and ``kwargs`` the dict.

    Instructions compare equal when they are of the same class with the same arguments, so
    schedules can be checked against expected lists.
    """

    def __init__(self, **kwargs):
        self.name = self.__class__.__name__
        self.kwargs = kwargs
        for key, val in kwargs.items():
            setattr(self, key, val)

    def __repr__(self):
        args = ", ".join(f"{key}={val!r}" for key, val in self.kwargs.items())
        return f"{self.name}({args})"

    def __eq__(self, other):
        if not isinstance(other, PipeInstruction):
            return NotImplemented
        return type(self) is type(other) and self.kwargs == other.kwargs

    def __hash__(self):
        return hash((type(self), tuple(sorted(self.kwargs))))


class OptimizerStep(PipeInstruction):
    """Take one optimizer step and zero the gradients. Comes after ``ReduceGrads`` and
    ``ReduceTiedGrads``; it may synchronise the data-parallel ranks (overflow checks)."""


class ReduceGrads(PipeInstruction):
    """All-reduce the stage's gradients among its data-parallel replicas."""


class ReduceTiedGrads(PipeInstruction):
    """All-reduce the gradients of tied modules (shared embeddings) among the stages that hold
    them. Which stages those are is only known after partitioning (at worst all of them), so it
    must sit where every stage reaches it: the last step of a schedule."""


class BufferOpInstruction(PipeInstruction):
    """An instruction that works on the pipeline buffer ``buffer_id``."""

    def __init__(self, buffer_id, **kwargs):
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """``buffers['inputs'][buffer_id] = next(data_iter)`` (inputs on the first stage, labels on
    the last)."""


class ForwardPass(BufferOpInstruction):
    """``buffers['outputs'][buffer_id] = forward(buffers['inputs'][buffer_id])``."""


class BackwardPass(BufferOpInstruction):
    """Backward from ``buffers['outputs'][buffer_id]`` with the gradients received for it (or
    from the loss on the last stage); gradients accumulate until ``OptimizerStep``."""


class SendActivation(BufferOpInstruction):
    """Blocking send of ``buffers['outputs'][buffer_id]`` to the next stage; paired with its
    ``RecvActivation`` in the same step."""


class RecvActivation(BufferOpInstruction):
    """Blocking receive from the previous stage into ``buffers['inputs'][buffer_id]``; paired
    with its ``SendActivation`` in the same step."""


class SendGrad(BufferOpInstruction):
    """Blocking send to the previous stage of the gradients of the activations it sent (those
    received with ``requires_grad``); paired with its ``RecvGrad`` in the same step."""


class RecvGrad(BufferOpInstruction):
    """Blocking receive from the next stage of the gradients of ``buffers['outputs'][buffer_id]``
    (``None`` where an output needs none); paired with its ``SendGrad`` in the same step."""


__all__ = ["PipeSchedule", "InferenceSchedule", "TrainSchedule", "DataParallelSchedule",
           "PipeInstruction", "OptimizerStep", "ReduceGrads", "ReduceTiedGrads",
           "BufferOpInstruction", "LoadMicroBatch", "ForwardPass", "BackwardPass",
           "SendActivation", "RecvActivation", "SendGrad", "RecvGrad"]
