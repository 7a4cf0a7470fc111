"""``deepspeed.elasticity``: elastic training.

``compute_elastic_config(ds_config, target_deepspeed_version, world_size=0)`` plans one global
batch size for many GPU counts; with ``"elasticity": {"enabled": true, ...}`` in the config the
engine trains with that plan at whatever world size it starts on, and
``deepspeed --elastic_training`` runs the workers under torch elastic rendezvous so a job
survives workers leaving and joining.
"""
from deepspeed.elasticity.config import (LATEST_ELASTICITY_VERSION, ElasticityConfig,
                                         ElasticityConfigError, ElasticityError,
                                         ElasticityIncompatibleWorldSize)
from deepspeed.elasticity.elasticity import (compute_elastic_config, elasticity_enabled,
                                             ensure_immutable_elastic_config)

__all__ = ["compute_elastic_config", "elasticity_enabled", "ensure_immutable_elastic_config",
           "ElasticityConfig", "ElasticityError", "ElasticityConfigError",
           "ElasticityIncompatibleWorldSize", "LATEST_ELASTICITY_VERSION"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
