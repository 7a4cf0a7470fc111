"""Sequence parallelism (DeepSpeed-Ulysses, ALST for Hugging Face models)."""
