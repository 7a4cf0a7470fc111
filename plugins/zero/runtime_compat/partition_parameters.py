"""``deepspeed.runtime.zero.partition_parameters`` (upstream path): ZeRO-3 construction and
gathering APIs."""
from deepspeed.zero.gathered_parameters import GatheredParameters  # noqa: F401
from deepspeed.zero.partition_parameters import (Init, ZeroParamStatus,  # noqa: F401
                                                 is_zero_param)
from deepspeed.zero.stage3 import (register_external_parameter,  # noqa: F401
                                   unregister_external_parameter)
