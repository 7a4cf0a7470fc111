"""``deepspeed.plan``: will this model fit, with which layout, and how fast will it go?

Describe a model without weights, a cluster, and a layout; get per-rank memory, per-step
communication and a step-time estimate, or search every layout for a global batch::

    from deepspeed import plan
    spec = plan.describe_model("llama-70b", seq_len=4096)
    best = plan.search(spec, plan.cluster("dgx-h100", nodes=4), global_batch=512)[0]
    config = plan.deepspeed_config(best.layout)

``ds_plan`` is the same from the command line.
"""
from deepspeed.plan.cluster import Cluster, cluster
from deepspeed.plan.comms import Collective, by_name, per_step
from deepspeed.plan.layout import Layout, deepspeed_config, layout_from_config
from deepspeed.plan.memory import MemoryPlan, memory_per_rank
from deepspeed.plan.model_spec import (ModelSpec, from_measurements, from_module, from_transformers,
                                      load_model)
from deepspeed.plan.search import Estimate, estimate, layouts, search

describe_model = load_model

__all__ = ["Cluster", "cluster", "Collective", "by_name", "per_step", "Layout", "deepspeed_config",
           "layout_from_config", "MemoryPlan", "memory_per_rank", "ModelSpec", "from_measurements",
           "from_module", "from_transformers", "load_model", "describe_model", "Estimate", "estimate", "layouts",
           "search"]

# the other submodules (cli, measure, plugin) are reachable as attributes, as upstream's are
# after a bare ``import deepspeed``; the names above stay eager: ``search`` and ``cluster`` are
# both a submodule and a function, and the import above makes the function win
from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

__getattr__, __dir__ = lazy_exports(__name__)
