"""The `deepspeed` launcher: `runner` (the CLI), `launch` (per-node supervisor), `hostfile`
(resource parsing and filtering), `multinode_runner` (pdsh/MPI/SLURM command builders), `cores`
(CPU binding) and `environment` (what env reaches remote workers)."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
