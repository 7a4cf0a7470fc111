"""``deepspeed.inference``: ``init_inference``'s engine and config, and AutoTP.

``deepspeed.init_inference`` (core) reaches this package only through the
``deepspeed_init_inference`` hook. ``config`` holds ``DeepSpeedInferenceConfig``, ``engine`` the
``InferenceEngine``, ``auto_tp`` the policy detection and sharding, ``policies`` the injection
policy classes (``HFBertLayerPolicy``), ``layers`` the two tensor-parallel Linear layers,
``vocab_parallel`` the split embedding and LM head, ``sharding`` how a rank's slice is chosen,
``checkpoint`` ``checkpoint=`` loading into shards, ``quantize`` weight-only int8,
``moe_inference`` the ``moe`` settings and expert slicing, ``kernel_inject`` the fused path,
``cuda_graph`` ``enable_cuda_graph``; ``deepspeed.module_inject`` re-exports AutoTP and the
layers under their upstream paths."""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "DeepSpeedInferenceConfig": "deepspeed.inference.config",
    "InferenceEngine": "deepspeed.inference.engine",
    "HFBertLayerPolicy": "deepspeed.inference.policies",
}

__all__ = ["DeepSpeedInferenceConfig", "InferenceEngine", "HFBertLayerPolicy"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
