"""DeepSpeedConfigModel: the contract every section model (core and plugin) inherits."""
import warnings
from typing import Annotated, Optional

import pytest
from pydantic import Field, ValidationError

from deepspeed.config import ConfigDeprecationWarning, DeepSpeedConfigModel, deprecated_alias


class Offload(DeepSpeedConfigModel):
    device: str = "none"


class Section(DeepSpeedConfigModel):
    count: int = 3
    ratio: float = 1.0
    max_live_parameters: int = Field(1_000_000_000, alias="stage3_max_live_parameters")
    gather_16bit: Annotated[bool, deprecated_alias("gather_fp16")] = False
    offload: Annotated[Optional[Offload],
                       deprecated_alias("cpu_offload",
                                        convert=lambda on: {"device": "cpu"} if on else None)] = None
    renamed: int = Field(0, json_schema_extra={"deprecated_aliases": ["old_renamed"]})


@pytest.mark.parametrize("value, expected", [(1e9, 1_000_000_000), (5.0, 5), (7, 7)])
def test_int_fields_accept_integral_floats(value, expected):
    section = Section(count=value)
    assert section.count == expected and isinstance(section.count, int)


def test_int_fields_reject_fractional_floats():
    with pytest.raises(ValidationError, match="fractional part"):
        Section(count=5.5)


def test_unknown_key_forbidden():
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Section.model_validate({"cuont": 1})


def test_name_and_alias_both_populate():
    assert Section.model_validate({"stage3_max_live_parameters": 5}).max_live_parameters == 5
    assert Section.model_validate({"max_live_parameters": 6}).max_live_parameters == 6


def test_assignment_is_validated():
    section = Section()
    with pytest.raises(ValidationError):
        section.count = "many"
    section.count = 4.0
    assert section.count == 4


def test_deprecated_name_warns_and_sets_new_field():
    with pytest.warns(ConfigDeprecationWarning, match="'gather_fp16' is deprecated; use 'gather_16bit'"):
        section = Section.model_validate({"gather_fp16": True})
    assert section.gather_16bit is True
    assert "gather_16bit" in section.model_fields_set


def test_deprecated_name_with_converter():
    with pytest.warns(ConfigDeprecationWarning):
        section = Section.model_validate({"cpu_offload": True})
    assert section.offload == Offload(device="cpu")


def test_deprecated_name_via_json_schema_extra():
    with pytest.warns(ConfigDeprecationWarning, match="old_renamed"):
        assert Section.model_validate({"old_renamed": 9}).renamed == 9


def test_deprecated_warning_points_at_the_caller():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Section.model_validate({"gather_fp16": True})
    assert caught[0].filename == __file__


@pytest.mark.parametrize("data, old, new", [
    ({"gather_fp16": True, "gather_16bit": False}, "gather_fp16", "gather_16bit"),
    ({"cpu_offload": True, "offload": {"device": "nvme"}}, "cpu_offload", "offload"),
])
def test_deprecated_and_new_together_is_an_error(data, old, new):
    with pytest.raises(ValidationError) as info:
        Section.model_validate(data)
    assert (f"Cannot provide deprecated parameter '{old}' and replacing parameter '{new}' together"
            in str(info.value))


def test_deprecated_names_are_accepted_keys_but_not_fields():
    assert "gather_fp16" in Section.deprecated_aliases()
    assert Section.field_for_key("gather_fp16") is Section.model_fields["gather_16bit"]
    assert Section.field_for_key("stage3_max_live_parameters") is Section.model_fields["max_live_parameters"]
    assert Section.field_for_key("nope") is None


def test_to_dict_is_reloadable_and_uses_field_names():
    with pytest.warns(ConfigDeprecationWarning):
        section = Section.model_validate({"cpu_offload": True, "stage3_max_live_parameters": 2})
    dumped = section.to_dict()
    assert dumped["offload"] == {"device": "cpu"}
    assert dumped["max_live_parameters"] == 2
    assert "cpu_offload" not in dumped
    assert Section.model_validate(dumped) == section
