"""Every test starts from an unconfigured `deepspeed.checkpointing` and an empty RNG tracker,
and leaves them that way (the settings are process-wide by design)."""
import pytest

from deepspeed.activation_checkpointing import get_cuda_rng_tracker
from deepspeed.activation_checkpointing import settings as ac_settings


@pytest.fixture(autouse=True)
def fresh_checkpointing_state():
    saved_state = ac_settings._STATE
    tracker = get_cuda_rng_tracker()
    saved_states, saved_seeds = tracker.get_states(), set(tracker.seeds_)
    ac_settings._STATE = ac_settings._State()
    tracker.reset()
    yield
    ac_settings._STATE = saved_state
    tracker.set_states(saved_states)
    tracker.seeds_ = saved_seeds
