"""`zero_optimization.zenflow`: the ZenFlow section (`ZenFlowConfig`).

ZenFlow extends ZeRO-Offload (stage 2/3 with `offload_optimizer.device: cpu`): the most important
gradient columns are stepped every step on the device, the rest accumulate and the CPU optimizer
applies them every `update_interval` steps (in a background thread with `overlap_step`).

`"auto"` values resolve here, once, to the numbers this implementation uses (see
`resolved_update_interval` / `resolved_select_interval`), so the optimizer never sees "auto".
"""
from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from deepspeed.config.model import AUTO, DeepSpeedConfigModel

SELECT_STRATEGIES = ("auto", "step", "epoch")
AUTO_UPDATE_INTERVAL = 4  # the tutorial's value
AUTO_SELECTS_PER_UPDATE = 4  # "auto" select_interval: re-select every 4 CPU updates


def _interval(value, key):
    """ "auto" or a positive int (a whole float such as 4.0 is accepted); anything else names the
    key and what is allowed."""
    if value == AUTO:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"zero_optimization.zenflow.{key} must be \"auto\" or a positive "
                         f"integer, got {value!r}")
    return value


T = "tests/plugins/zero/test_zenflow.py::"


class ZenFlowConfig(DeepSpeedConfigModel):
    """Selective (top-k column) device updates over ZeRO-Offload."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "topk_ratio": T + "test_unimportant_columns_move_every_update_interval",
        **dict.fromkeys(("select_strategy", "select_interval", "update_interval"),
                        T + "test_select_interval_counts_epochs_and_update_interval_sets_the_"
                            "cpu_cadence"),
        "full_warm_up_rounds": T + "test_unimportant_columns_move_every_update_interval",
        "overlap_step": T + "test_overlap_step_lands_one_step_later_and_is_deterministic",
        # resolves select_interval in epochs; its effect is that interval
        "steps_per_epoch": T + "test_defaults_and_auto_values",
    }

    topk_ratio: float = Field(0.1, ge=0.0, le=1.0, description="fraction of each weight's "
                              "gradient columns updated every step on the device")
    select_strategy: str = Field("auto", description='"auto", "step" or "epoch": the unit of '
                                 "select_interval", json_schema_extra={"accepts_auto": True})
    select_interval: Union[Literal["auto"], int] = Field(
        "auto", description="how often (in steps or epochs) the important columns are re-selected")
    update_interval: Union[Literal["auto"], int] = Field(
        "auto", description="the CPU optimizer applies the accumulated rest every this many steps")
    full_warm_up_rounds: int = Field(0, ge=0, description="first steps with full (plain "
                                     "ZeRO-Offload) updates before selection starts")
    overlap_step: bool = Field(False, description="run the CPU step in a background thread, "
                               "overlapping the next forward/backward (its result lands one step "
                               "later)")
    offload: bool = False
    auto_ratio: float = Field(0.99, ge=0.0, le=1.0)
    pt_reserved_cores_perc: float = Field(0.5, ge=0.0, le=1.0)
    steps_per_epoch: Optional[int] = Field(None, ge=1, description='optimizer steps per epoch, '
                                           'needed by select_strategy "epoch"')

    without_effect = {
        "offload": "the selected columns' optimizer state always lives on the device here",
        "auto_ratio": 'update_interval "auto" is a fixed interval here '
                      f"({AUTO_UPDATE_INTERVAL} steps), not adapted at run time",
        "pt_reserved_cores_perc": "the CPU step thread shares PyTorch's intra-op thread pool; "
                                  "no cores are pinned",
    }

    @field_validator("select_strategy", mode="before")
    @classmethod
    def _strategy(cls, value):
        if value not in SELECT_STRATEGIES:
            raise ValueError(f"zero_optimization.zenflow.select_strategy must be one of "
                             f"{', '.join(repr(s) for s in SELECT_STRATEGIES)}, got {value!r}")
        return value

    @field_validator("select_interval", "update_interval", mode="before")
    @classmethod
    def _intervals(cls, value, info):
        return _interval(value, info.field_name)

    @model_validator(mode="after")
    def _epoch_needs_length(self):
        if self.select_strategy == "epoch" and self.steps_per_epoch is None:
            raise ValueError('zero_optimization.zenflow.select_strategy "epoch" needs '
                             "zero_optimization.zenflow.steps_per_epoch (optimizer steps per "
                             'epoch, an int >= 1); or use "step" / "auto"')
        return self

    # -- what "auto" means here -------------------------------------------------------------
    @property
    def resolved_update_interval(self) -> int:
        return AUTO_UPDATE_INTERVAL if self.update_interval == AUTO else int(self.update_interval)

    @property
    def resolved_select_interval(self) -> int:
        """In optimizer steps: "auto" is every `AUTO_SELECTS_PER_UPDATE` CPU updates; "epoch"
        counts epochs of `steps_per_epoch` steps. Re-selection waits for the next update
        boundary (when no unimportant gradient is pending), so intervals shorter than
        `update_interval` act as `update_interval`."""
        update = self.resolved_update_interval
        if self.select_interval == AUTO:
            return update * AUTO_SELECTS_PER_UPDATE
        steps = int(self.select_interval)
        if self.select_strategy == "epoch":
            steps *= int(self.steps_per_epoch)
        return max(steps, update)
