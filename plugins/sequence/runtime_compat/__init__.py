"""`deepspeed.runtime.sequence_parallel`: the upstream path of the sequence-parallel plugin."""
