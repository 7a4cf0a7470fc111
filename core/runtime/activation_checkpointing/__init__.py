"""`deepspeed.runtime.activation_checkpointing` -> `deepspeed.activation_checkpointing`."""
