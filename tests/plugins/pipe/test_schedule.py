"""Pipeline schedules: the golden listings of upstream v0.14.1, the buffer counts, and the
pairing / ordering properties that make blocking sends deadlock-free for every small shape."""
import pytest

from deepspeed.pipe.schedule import (BackwardPass, BufferOpInstruction, DataParallelSchedule,
                                     ForwardPass, InferenceSchedule, LoadMicroBatch,
                                     OptimizerStep, PipeInstruction, PipeSchedule,
                                     RecvActivation, RecvGrad, ReduceGrads, ReduceTiedGrads,
                                     SendActivation, SendGrad, TrainSchedule)

# The spec's shorthand: a letter code and a buffer id, or a bare name for the final reductions.
_BUFFER_OPS = {"L": LoadMicroBatch, "F": ForwardPass, "B": BackwardPass, "SA": SendActivation,
               "RA": RecvActivation, "SG": SendGrad, "RG": RecvGrad}
_PLAIN_OPS = {"RTG": ReduceTiedGrads, "RG": ReduceGrads, "OS": OptimizerStep}


def parse(step):
    """``"RG0 SA1 B0"`` -> [RecvGrad(0), SendActivation(1), BackwardPass(0)]."""
    cmds = []
    for token in step.split():
        code = token.rstrip("0123456789")
        if code == token:
            cmds.append(_PLAIN_OPS[code]())
        else:
            cmds.append(_BUFFER_OPS[code](int(token[len(code):])))
    return cmds


def listing(sched):
    return [list(step) for step in sched.steps()]


TAIL = "RTG RG OS"
TRAIN_GOLDEN = {
    (4, 2): [
        ["L0 F0", "SA0", "L1 F1", "RG0 SA1 B0", "L0 F0", "RG1 SA0 B1", "L1 F1", "RG0 SA1 B0", "",
         "RG1 B1 " + TAIL],
        ["", "RA0 L0 F0", "B0", "SG0 RA1 L1 F1", "B1", "SG1 RA0 L0 F0", "B0", "SG0 RA1 L1 F1",
         "B1", "SG1 " + TAIL],
    ],
    (2, 3): [
        ["L0 F0", "SA0", "L1 F1", "SA1", "", "RG0 B0", "", "RG1 B1 " + TAIL],
        ["", "RA0 F0", "SA0", "RA1 F1", "RG0 SA1 B0", "SG0", "RG1 B1", "SG1 " + TAIL],
        ["", "", "RA0 L0 F0", "B0", "SG0 RA1 L1 F1", "B1", "SG1", TAIL],
    ],
    (1, 2): [
        ["L0 F0", "SA0", "", "RG0 B0 " + TAIL],
        ["", "RA0 L0 F0", "B0", "SG0 " + TAIL],
    ],
}


@pytest.mark.parametrize("micro_batches,stages", sorted(TRAIN_GOLDEN))
def test_train_schedule_matches_golden_listing(micro_batches, stages):
    for stage_id, expected in enumerate(TRAIN_GOLDEN[(micro_batches, stages)]):
        sched = TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
        assert listing(sched) == [parse(step) for step in expected], f"stage {stage_id}"
        assert len(expected) == 2 * (micro_batches + stages - 1)


def test_train_schedule_golden_reprs_spelled_out():
    """The reductions are the real classes, in order, with the upstream reprs."""
    last = listing(TrainSchedule(4, 2, 0))[-1]
    assert [repr(c) for c in last] == ["RecvGrad(buffer_id=1)", "BackwardPass(buffer_id=1)",
                                       "ReduceTiedGrads()", "ReduceGrads()", "OptimizerStep()"]


def test_inference_schedule_matches_golden_listing():
    golden = [["L0 F0", "L1 SA0 F1", "L0 SA1 F0", "SA0"],
              ["", "L0 RA0 F0", "L1 RA1 F1", "L0 RA0 F0"]]
    for stage_id, expected in enumerate(golden):
        sched = InferenceSchedule(micro_batches=3, stages=2, stage_id=stage_id)
        assert listing(sched) == [parse(step) for step in expected]
        assert sched.num_pipe_buffers() == 2


def test_inference_schedule_middle_stages_order_sends_by_parity():
    """Even stages send before they receive, odd stages receive before they send."""
    even = listing(InferenceSchedule(3, 4, 2))[3]   # micro-batch 1 arrives, 0 leaves
    odd = listing(InferenceSchedule(3, 4, 1))[2]
    assert even == [SendActivation(0), RecvActivation(1), ForwardPass(1)]
    assert odd == [RecvActivation(1), SendActivation(0), ForwardPass(1)]


def test_data_parallel_schedule():
    sched = DataParallelSchedule(2, 1, 0)
    assert listing(sched) == [parse("L0 F0 B0"), parse("L0 F0 B0 RG OS")]
    assert sched.num_pipe_buffers() == 1


def test_train_num_pipe_buffers():
    for stages in range(1, 6):
        for micro_batches in range(1, 9):
            for stage_id in range(stages):
                n = TrainSchedule(micro_batches, stages, stage_id).num_pipe_buffers()
                assert n == max(2, min(stages - stage_id, micro_batches))
                if stages <= 2 or micro_batches <= 2:
                    assert n == 2
    assert [TrainSchedule(8, 4, s).num_pipe_buffers() for s in range(4)] == [4, 3, 2, 2]
    assert TrainSchedule(4, 2, 0).num_pipe_buffers() == 2


def test_base_schedule_defaults_and_properties():
    class Plain(PipeSchedule):
        def steps(self):
            yield [LoadMicroBatch(self._buffer_idx(0))]

    sched = Plain(micro_batches=5, stages=3, stage_id=1)
    assert sched.num_pipe_buffers() == 5
    assert (sched.stage, sched.num_stages, sched.num_micro_batches) == (1, 3, 5)
    assert (sched.prev_stage, sched.next_stage) == (0, 2)
    assert not sched.is_first_stage and not sched.is_last_stage
    assert Plain(1, 3, 0).is_first_stage and Plain(1, 3, 2).is_last_stage
    # schedules are iterable, and iterating again starts over
    assert list(sched) == [[LoadMicroBatch(0)]]
    assert list(sched) == [[LoadMicroBatch(0)]]


def test_schedule_without_steps_cannot_be_instantiated():
    class NoSteps(PipeSchedule):
        pass

    with pytest.raises(TypeError):
        NoSteps(1, 1, 0)


@pytest.mark.parametrize("args,bad", [((0, 2, 0), "micro_batches"), ((2, 0, 0), "stages"),
                                      ((2, 2, 2), "stage_id"), ((2, 2, -1), "stage_id")])
def test_schedule_rejects_bad_shapes(args, bad):
    with pytest.raises(ValueError, match=bad):
        TrainSchedule(*args)


def test_instruction_attributes_repr_and_equality():
    inst = PipeInstruction(a=1, b=2)
    assert (inst.a, inst.b, inst.name, inst.kwargs) == (1, 2, "PipeInstruction", {"a": 1, "b": 2})
    assert repr(OptimizerStep()) == "OptimizerStep()"
    assert repr(LoadMicroBatch(buffer_id=3)) == "LoadMicroBatch(buffer_id=3)"
    assert LoadMicroBatch(buffer_id=1).buffer_id == 1
    assert LoadMicroBatch(3).buffer_id == 3 and LoadMicroBatch(3).name == "LoadMicroBatch"
    assert isinstance(SendGrad(0), BufferOpInstruction)
    assert LoadMicroBatch(3) == LoadMicroBatch(buffer_id=3)
    assert LoadMicroBatch(3) != LoadMicroBatch(2)
    assert LoadMicroBatch(3) != ForwardPass(3)  # same kwargs, different instruction
    assert ReduceGrads() != OptimizerStep()
    assert len({ForwardPass(1), ForwardPass(1), BackwardPass(1)}) == 2


# ---------------------------------------------------------------- properties of 1F1B
def _micro_batch_trace(stages, micro_batches, stage_id):
    """Per step, the work of one stage with micro-batch ids recovered from the buffer ids: the
    j-th LoadMicroBatch/Forward/Backward/send/recv of a kind concerns micro-batch j, and its
    buffer id must be j % num_pipe_buffers."""
    sched = TrainSchedule(micro_batches, stages, stage_id)
    nbuf = sched.num_pipe_buffers()
    counts, trace = {}, []
    for step in sched.steps():
        events = []
        for cmd in step:
            kind = type(cmd)
            if isinstance(cmd, BufferOpInstruction):
                j = counts.get(kind, 0)
                counts[kind] = j + 1
                assert cmd.buffer_id == j % nbuf, (stages, micro_batches, stage_id, cmd, j)
                events.append((kind, j))
            else:
                events.append((kind, None))
        trace.append(events)
    return trace


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", list(range(1, 9)))
def test_train_schedule_properties(stages, micro_batches):
    traces = [_micro_batch_trace(stages, micro_batches, s) for s in range(stages)]
    total_steps = 2 * (micro_batches + stages - 1)
    for s, trace in enumerate(traces):
        assert len(trace) == total_steps
        flat = [(k, kind, j) for k, events in enumerate(trace) for kind, j in events]
        for kind in (ForwardPass, BackwardPass):
            assert [j for _, kd, j in flat if kd is kind] == list(range(micro_batches))
        when = {(kind, j): k for k, kind, j in flat if j is not None}
        for j in range(micro_batches):
            assert when[(ForwardPass, j)] < when[(BackwardPass, j)]
            if s > 0:  # an input arrives before the forward that needs it, in the same step
                assert when[(RecvActivation, j)] == when[(ForwardPass, j)]
            if s < stages - 1:  # the output gradient arrives in the step of the backward
                assert when[(RecvGrad, j)] == when[(BackwardPass, j)]
        loads = [j for _, kd, j in flat if kd is LoadMicroBatch]
        assert loads == (list(range(micro_batches)) if s in (0, stages - 1) else [])
        # the optimizer steps once, last thing of the last step, after the reductions
        for k, events in enumerate(trace):
            kinds = [kind for kind, _ in events]
            if k < total_steps - 1:
                assert not {OptimizerStep, ReduceGrads, ReduceTiedGrads} & set(kinds)
            else:
                assert kinds[-3:] == [ReduceTiedGrads, ReduceGrads, OptimizerStep]
                assert kinds.count(OptimizerStep) == 1

    # every send pairs with the neighbour's receive of the same micro-batch in the same step,
    # and the pairs on one link come in the same order on both sides
    for s in range(stages - 1):
        for k in range(total_steps):
            down = [(kind, j) for kind, j in traces[s][k] if kind in (SendActivation, RecvGrad)]
            up = [(kind, j) for kind, j in traces[s + 1][k] if kind in (RecvActivation, SendGrad)]
            mirror = {SendActivation: RecvActivation, RecvGrad: SendGrad}
            assert [(mirror[kind], j) for kind, j in down] == up, (stages, micro_batches, s, k)
    if stages == 1:
        kinds = {kind for trace in traces for events in trace for kind, _ in events}
        assert not kinds & {SendActivation, RecvActivation, SendGrad, RecvGrad}


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 5])
def test_inference_schedule_properties(stages, micro_batches):
    for s in range(stages):
        steps = listing(InferenceSchedule(micro_batches, stages, s))
        assert len(steps) == micro_batches + stages - 1
        forwards = [(k, c.buffer_id) for k, step in enumerate(steps) for c in step
                    if isinstance(c, ForwardPass)]
        assert forwards == [(j + s, j % 2) for j in range(micro_batches)]
        if s < stages - 1:
            nxt = listing(InferenceSchedule(micro_batches, stages, s + 1))
            for k in range(len(steps)):
                sends = [c.buffer_id for c in steps[k] if isinstance(c, SendActivation)]
                recvs = [c.buffer_id for c in nxt[k] if isinstance(c, RecvActivation)]
                assert sends == recvs


def test_upstream_path():
    from deepspeed.runtime.pipe import schedule

    assert schedule.TrainSchedule is TrainSchedule and schedule.LoadMicroBatch is LoadMicroBatch
