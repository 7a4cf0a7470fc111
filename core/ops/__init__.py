"""Native and fallback ops (`deepspeed.ops`); builders live in `deepspeed.ops.op_builder`."""
