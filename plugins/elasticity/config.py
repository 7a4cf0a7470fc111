"""The ``elasticity`` config section and the errors of elastic training.

Every documented key with its documented default (config-json "Elastic Training Config"). The
errors keep upstream's names, since scripts and schedulers catch them by name.
"""
from typing import List

from pydantic import Field, field_validator, model_validator

from deepspeed.config import DeepSpeedConfigModel

LATEST_ELASTICITY_VERSION = 0.2
SUPPORTED_VERSIONS = (0.1, 0.2)
# the first DeepSpeed release with elasticity: older targets cannot run an elastic config
MINIMUM_DEEPSPEED_VERSION = "0.3.8"

FORMAT = """Elasticity should be enabled as:
"elasticity": {
  "enabled": true,
  "max_train_batch_size": 2000,
  "micro_batch_sizes": [2,4,6],
  "min_gpus": 1,
  "max_gpus" : 10000,
  "min_time": 20,
  "prefer_larger_batch": true,
  "ignore_non_elastic_batch_info": false,
  "version": 0.1
}"""


class ElasticityError(Exception):
    """Base of every elasticity error."""



# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
COMPUTE = "tests/plugins/elasticity/test_elastic_compute.py::"
ENGINE = "tests/plugins/elasticity/test_elastic_engine.py::"

class ElasticityConfigError(ElasticityError):
    """The ``elasticity`` section (or a config around it) is not usable."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """The current world size is not one the elastic batch size can be split over."""


class ElasticityConfig(DeepSpeedConfigModel):
    """Elastic training: one global batch size that many GPU counts can train with."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        **dict.fromkeys(("enabled", "max_train_batch_size"),
                        ENGINE + "test_engine_uses_the_elastic_plan"),
        **dict.fromkeys(("min_gpus", "max_gpus"), COMPUTE + "test_plan_matches_its_definition"),
        **dict.fromkeys(("version", "micro_batch_sizes"), COMPUTE + "test_worked_example_v01"),
        "prefer_larger_batch": COMPUTE + "test_prefer_larger_batch_false_picks_the_smaller_"
                                         "micro_batch",
        "model_parallel_size": COMPUTE + "test_model_parallel_size_counts_data_parallel_ranks_"
                                         "per_node",
        "num_gpus_per_node": COMPUTE + "test_v02_scales_by_nodes_and_trains_off_plan",
        "ignore_non_elastic_batch_info": ENGINE + "test_batch_keys_next_to_elasticity",
        "min_time": "tests/plugins/elasticity/test_elastic_min_time.py::"
                    "test_waiting_nodes_are_admitted_only_after_min_time",
    }
    enabled: bool = False
    max_train_batch_size: int = Field(2000, ge=1)
    """The largest acceptable global batch size."""
    micro_batch_sizes: List[int] = Field(default_factory=lambda: [2, 4, 6], min_length=1)
    """Acceptable micro-batch sizes per GPU (as ``train_micro_batch_size_per_gpu``)."""
    min_gpus: int = Field(1, ge=1)
    max_gpus: int = Field(10000, ge=1)
    min_time: int = Field(0, ge=0)
    """Minutes the elastic agent waits after each (re)start before taking in waiting nodes (0:
    at once); read by ``deepspeed --elastic_training`` from the script's --deepspeed_config."""
    version: float = LATEST_ELASTICITY_VERSION
    ignore_non_elastic_batch_info: bool = False
    """Silently ignore train_batch_size / micro-batch / accumulation keys outside this section
    (by default they are an error, since elasticity takes control of them)."""
    prefer_larger_batch: bool = True
    model_parallel_size: int = Field(1, ge=1)
    """Tensor / model parallel size (v0.2 only)."""
    num_gpus_per_node: int = Field(1, ge=1)
    """GPUs per node (v0.2 only): v0.2 scales by whole nodes."""

    @field_validator("micro_batch_sizes")
    @classmethod
    def _positive_micro_batches(cls, value):
        bad = [mb for mb in value if mb < 1]
        if bad:
            raise ValueError(f"every micro batch size must be a positive int, got {bad}")
        return value

    @field_validator("version")
    @classmethod
    def _known_version(cls, value):
        if value not in SUPPORTED_VERSIONS:
            raise ValueError(f"elasticity version {value} is not supported; allowed: "
                             f"{', '.join(str(v) for v in SUPPORTED_VERSIONS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus ({self.max_gpus}) is smaller than min_gpus "
                             f"({self.min_gpus})")
        too_big = [mb for mb in self.micro_batch_sizes if mb > self.max_train_batch_size]
        if too_big:
            raise ValueError(f"micro_batch_sizes {too_big} exceed max_train_batch_size "
                             f"({self.max_train_batch_size})")
        if self.num_gpus_per_node % self.model_parallel_size:
            raise ValueError(f"num_gpus_per_node ({self.num_gpus_per_node}) is not divisible by "
                             f"model_parallel_size ({self.model_parallel_size})")
        return self
