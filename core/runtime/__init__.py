"""Compatibility paths (`deepspeed.runtime.*`) that the DeepSpeed docs and the Hugging Face
integration import. Each module here only re-exports the real home; add a path only when a
documented import needs it, and list it in tests/core/test_compat_paths.py."""
