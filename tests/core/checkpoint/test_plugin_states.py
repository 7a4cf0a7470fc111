"""The ``plugin_states`` entry of the model-states file: each plugin's ``Stateful`` objects
(``deepspeed_stateful``) saved under the plugin's name, checked to load with
``weights_only=True``, and handed back on load, also from a file written before the entry
existed (each plugin's block at the top level). Checked on a bare engine stand-in carrying only
the enabled plugins' hooks, as the checkpoint code sees an engine."""
import pytest
import torch

from deepspeed.checkpoint.atomic import CheckpointFormatError
from deepspeed.checkpoint.model_state import PLUGIN_STATES, plugin_states, restore_plugin_states
from deepspeed.hooks import hookimpl
from deepspeed.testing.hooks import engine_stand_in, plugin_answering


def stateful(**objects):
    """A plugin handing the engine ``objects`` through ``deepspeed_stateful``."""
    return plugin_answering(stateful=objects)


class Counter:
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value, "weights": torch.full((2,), float(self.value))}

    def load_state_dict(self, state_dict):
        self.value = int(state_dict["value"])


def test_states_are_filed_under_each_plugin_and_restored():
    saving = engine_stand_in(alpha=stateful(steps=Counter(3), seen=Counter(7)),
                             beta=stateful(steps=Counter(5)), gamma=stateful())
    saved = plugin_states(saving, what="checkpoint 't'")
    assert set(saved) == {"alpha", "beta"}  # a plugin handing over nothing has no entry
    assert saved["alpha"]["steps"]["value"] == 3 and saved["beta"]["steps"]["value"] == 5
    assert torch.equal(saved["alpha"]["seen"]["weights"], torch.full((2,), 7.0))

    alpha, beta = Counter(), Counter()
    untouched = Counter(11)
    loading = engine_stand_in(alpha=stateful(steps=alpha, seen=Counter()),
                              beta=stateful(steps=beta, extra=untouched))
    restore_plugin_states(loading, {PLUGIN_STATES: saved, "steps": {"value": 99}})
    # the same name under two plugins stays apart; an object the file lacks keeps its state
    assert (alpha.value, beta.value, untouched.value) == (3, 5, 11)


def test_a_file_from_before_plugin_states_is_read_from_the_top_level():
    restored = Counter()
    engine = engine_stand_in(alpha=stateful(ds_alpha=restored, missing=Counter(4)))
    restore_plugin_states(engine, {"global_steps": 2, "ds_alpha": {"value": 6}})
    assert restored.value == 6
    # with a plugin_states entry the top level is never read, even under the same name
    restore_plugin_states(engine, {PLUGIN_STATES: {}, "ds_alpha": {"value": 8}})
    assert restored.value == 6


def test_state_that_would_not_load_weights_only_fails_the_save_naming_it():
    class Opaque:
        def state_dict(self):
            return {"ok": 1, "bad": object()}

        def load_state_dict(self, state_dict):
            pass

    engine = engine_stand_in(alpha=stateful(opaque=Opaque()))
    with pytest.raises(CheckpointFormatError, match=r"plugin_states\['alpha'\]\['opaque'\]"):
        plugin_states(engine, what="checkpoint 't'")


def test_an_object_that_is_not_stateful_is_refused_naming_plugin_and_entry():
    engine = engine_stand_in(alpha=stateful(thing=object()))
    with pytest.raises(TypeError, match=r"plugin 'alpha'.*'thing'.*missing load_state_dict, "
                                        r"state_dict"):
        plugin_states(engine, what="checkpoint 't'")


def test_each_implementation_gets_the_arguments_it_asks_for():
    seen = []

    class WantsEngine:
        @hookimpl
        def deepspeed_stateful(self, engine):
            seen.append(engine)
            return {}

    engine = engine_stand_in(alpha=WantsEngine())
    assert plugin_states(engine, what="t") == {} and seen == [engine]
