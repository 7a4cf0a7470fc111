"""Op builders (`deepspeed.ops.op_builder`): filled in by the native-ops work."""
