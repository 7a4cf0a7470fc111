"""``deepspeed.inference``: ``init_inference``'s engine and config, and AutoTP.

``deepspeed.init_inference`` (core) reaches this package only through the
``deepspeed_init_inference`` hook. ``config`` holds ``DeepSpeedInferenceConfig``, ``engine`` the
``InferenceEngine``, ``auto_tp`` the policy detection and sharding, ``layers`` the two
tensor-parallel Linear layers; ``deepspeed.module_inject`` re-exports the last two under their
upstream paths."""
from deepspeed.inference.config import DeepSpeedInferenceConfig
from deepspeed.inference.engine import InferenceEngine

__all__ = ["DeepSpeedInferenceConfig", "InferenceEngine"]
