"""The `deepspeed` launcher: `runner` (the CLI), `launch` (per-node supervisor), `hostfile`
(resource parsing and filtering), `multinode_runner` (pdsh/MPI/SLURM command builders), `cores`
(CPU binding) and `environment` (what env reaches remote workers)."""
