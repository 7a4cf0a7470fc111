"""The trace shows Domino's all-reduces in flight while the other piece computes: in forward,
the all-reduce that ends a block of piece 0 is launched before piece 1's matmuls of that block
start and waited for only after they end (then the MLP of piece 0 runs while piece 1's
attention all-reduce travels); in backward, each column-parallel Linear's input-gradient
all-reduce is launched before its weight-gradient matmul and waited for after it. With
``overlap=False`` every all-reduce is waited for before any other compute."""
from deepspeed.testing import run_distributed


def _before(trace, *events):
    positions = [trace.index(kind, label) for kind, label in events]
    assert positions == sorted(positions), list(zip(events, positions))


def _trace_on_two_ranks(overlap, hidden_chunks=1):
    from deepspeed.domino import record_overlap
    from deepspeed.utils import groups
    from domino_helpers import SHAPE, batches, domino_gpt, reference_gpt

    previous = groups.mpu
    try:
        groups.init_tensor_parallel_groups(2)
        model = domino_gpt(reference_gpt(), overlap=overlap, hidden_chunks=hidden_chunks)
        with record_overlap() as trace:
            model(batches(1)[0]).backward()
    finally:
        groups.set_mpu(previous)
    if hidden_chunks > 1:
        for block in ("attention", "mlp"):
            for i in (0, 1):  # piece 0's all-reduce is launched before piece 1 is computed
                label = f"layer 1 {block} {i}"
                _before(trace, ("launch", f"{label} piece 0"), ("launch", f"{label} piece 1"),
                        ("wait", f"{label} piece 0"))
        return len(trace.events)
    if not overlap:
        for i, (kind, label) in enumerate(trace.labels()):
            if kind == "launch":
                assert trace.labels()[i + 1:i + 3] == [("wait", label), ("waited", label)]
        assert trace.overlapped() == 0
        return len(trace.events)
    for layer in range(1, SHAPE["num_layers"] + 1):
        name = f"layer {layer}"
        # attention all-reduce of piece 0 overlaps piece 1's attention
        _before(trace, ("launch", f"{name} attention 0"), ("compute", f"{name} attention 1"),
                ("computed", f"{name} attention 1"), ("wait", f"{name} attention 0"))
        # piece 1's attention all-reduce overlaps piece 0's MLP
        _before(trace, ("launch", f"{name} attention 1"), ("compute", f"{name} mlp 0"),
                ("computed", f"{name} mlp 0"), ("wait", f"{name} attention 1"))
        # piece 0's MLP all-reduce overlaps piece 1's MLP
        _before(trace, ("launch", f"{name} mlp 0"), ("compute", f"{name} mlp 1"),
                ("computed", f"{name} mlp 1"), ("wait", f"{name} mlp 0"))
        for linear in ("qkv", "h_to_4h"):
            _before(trace, ("launch", f"backward {name} {linear}"),
                    ("compute", f"weight grad {name} {linear}"),
                    ("computed", f"weight grad {name} {linear}"), ("wait", f"backward {name} {linear}"))
    # all but the very last forward all-reduce (waited for at the end) overlap something
    assert trace.overlapped() == sum(kind == "launch" for kind, _ in trace.labels()) - 1
    # the last MLP all-reduce of layer 1 is still in flight while layer 2 starts on piece 0
    _before(trace, ("launch", "layer 1 mlp 1"), ("compute", "layer 2 attention 0"),
            ("wait", "layer 1 mlp 1"))
    return len(trace.events)


def test_all_reduces_are_in_flight_while_the_other_piece_computes():
    counts = run_distributed(_trace_on_two_ranks, world_size=2, args=(True,), timeout=600)
    assert counts[0] == counts[1] > 0


def test_blocking_mode_waits_at_once():
    run_distributed(_trace_on_two_ranks, world_size=2, args=(False,), timeout=600)


def test_hidden_pieces_launch_before_the_next_piece_is_computed():
    run_distributed(_trace_on_two_ranks, world_size=2, args=(True, 2), timeout=600)
