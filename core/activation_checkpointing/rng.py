"""Named accelerator RNG streams, and the seeding scheme model parallelism needs.

Dropout inside a tensor-parallel region must draw *different* masks on the ranks of one
model-parallel group (each holds a different shard), while dropout elsewhere must draw the *same*
mask there (the activations are replicated). So two streams are kept: the accelerator's default
generator, and a named "model-parallel-rng" stream that code enters with `tracker.fork()`.

Everything goes through `get_accelerator()`'s RNG calls, so on the CPU accelerator the
"accelerator" generator is simply torch's CPU generator and the same code runs unchanged.
"""
import contextlib
from typing import Dict, Optional

import torch

from deepspeed.accelerator import get_accelerator
from deepspeed.activation_checkpointing import settings as _settings
from deepspeed.utils.logging import log_dist

# The stream Megatron-style code forks for dropout inside model-parallel regions.
MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
# Offset between the default seed and the model-parallel seeds, so the two streams never collide.
MODEL_PARALLEL_SEED_OFFSET = 2718


def get_accelerator_rng_state() -> torch.Tensor:
    return get_accelerator().get_rng_state()


def set_accelerator_rng_state(state: torch.Tensor) -> None:
    get_accelerator().set_rng_state(state)


class CudaRNGStatesTracker:
    """Named accelerator RNG states that code can temporarily switch to with `fork(name)`.

    The name says "Cuda" because that is the documented public name; the states are those of
    whatever accelerator is active (the CPU generator on the CPU accelerator).
    """

    def __init__(self):
        self.states_: Dict[str, torch.Tensor] = {}
        self.seeds_ = set()

    def reset(self) -> None:
        """Forget every stream and seed (done before re-seeding)."""
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> Dict[str, torch.Tensor]:
        """A snapshot of the streams, e.g. for a training checkpoint or a recompute."""
        return dict(self.states_)

    def set_states(self, states: Dict[str, torch.Tensor]) -> None:
        """Replace the streams with a snapshot from `get_states()`.

        The dict is copied: forks replace entries of the live dict, and a snapshot that is still
        held elsewhere (a pending recompute) must not change underneath its owner.
        """
        if not isinstance(states, dict):
            raise TypeError(f"set_states expects the dict returned by get_states(), got "
                            f"{type(states).__name__}")
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        """Create stream `name` seeded with `seed`, leaving the current accelerator state as is.

        Seeds must be unique as well as names: two streams from one seed would draw identical
        "independent" masks.
        """
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists (every stream needs its own seed)")
        if name in self.states_:
            raise ValueError(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        outer = get_accelerator_rng_state()
        get_accelerator().manual_seed(seed)
        self.states_[name] = get_accelerator_rng_state()
        set_accelerator_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG_TRACKER_NAME):
        """Run the block on stream `name`; afterwards the stream keeps its advance and the outer
        accelerator state is back exactly where it was."""
        if name not in self.states_:
            raise ValueError(f"cuda rng state {name} is not added (known: {sorted(self.states_)}); "
                             f"create it with add(name, seed) or model_parallel_cuda_manual_seed()")
        outer = get_accelerator_rng_state()
        set_accelerator_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = get_accelerator_rng_state()
            set_accelerator_rng_state(outer)


_CUDA_RNG_STATE_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    """The process-wide tracker (the one `checkpoint` saves and restores around a recompute)."""
    return _CUDA_RNG_STATE_TRACKER


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default stream with `seed` (same on every rank of a model-parallel group) and
    the model-parallel stream with `seed + 2718 + model-parallel rank` (different inside the
    group, equal across data-parallel replicas).

    Call it after `configure(mpu_=...)`, instead of `manual_seed`; without an mpu the
    model-parallel rank is 0. Seeding the default generator again afterwards would desynchronise
    the replicas' dropout.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"model_parallel_cuda_manual_seed expects an int seed, got {seed!r}")
    mpu = _settings.current().mpu
    mp_rank = _settings.model_parallel_rank(mpu)
    model_parallel_seed = seed + MODEL_PARALLEL_SEED_OFFSET + mp_rank
    log_dist(f"initializing model parallel seeds: model parallel rank {mp_rank}, "
             f"model parallel seed {model_parallel_seed}, data parallel seed {seed}", ranks=[0])
    _CUDA_RNG_STATE_TRACKER.reset()
    get_accelerator().manual_seed(seed)
    _CUDA_RNG_STATE_TRACKER.add(MODEL_PARALLEL_RNG_TRACKER_NAME, model_parallel_seed)


class RNGSnapshot:
    """CPU, accelerator and tracker states at one instant: a checkpointed segment captures one
    before its forward and replays it for the recompute, so dropout draws the same masks."""

    def __init__(self, cpu: torch.Tensor, accelerator: torch.Tensor,
                 tracker: Dict[str, torch.Tensor]):
        self.cpu = cpu
        self.accelerator = accelerator
        self.tracker = tracker

    @classmethod
    def capture(cls) -> "RNGSnapshot":
        return cls(torch.get_rng_state(), get_accelerator_rng_state(),
                   _CUDA_RNG_STATE_TRACKER.get_states())

    def restore(self) -> None:
        # CPU first: on the CPU accelerator both are one generator and hold the same state.
        torch.set_rng_state(self.cpu)
        set_accelerator_rng_state(self.accelerator)
        _CUDA_RNG_STATE_TRACKER.set_states(self.tracker)


@contextlib.contextmanager
def replayed_rng(snapshot: Optional[RNGSnapshot]):
    """Run the block from `snapshot`'s RNG states, then put back the states found on entry."""
    if snapshot is None:
        yield
        return
    outer = RNGSnapshot.capture()
    snapshot.restore()
    try:
        yield
    finally:
        outer.restore()
