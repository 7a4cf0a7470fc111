"""``deepspeed.runtime.data_pipeline``: upstream's import paths of the data-efficiency library,
re-exporting ``deepspeed.data_efficiency``."""
