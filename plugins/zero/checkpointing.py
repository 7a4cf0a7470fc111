"""ZeRO optimizer checkpoints: one file per data-parallel rank, re-cut on demand.

Each rank writes ``zero_pp_rank_<dp rank>_mp_rank_<mp rank:02d>_optim_states.pt`` next to the
model states, holding its partition state dict (``deepspeed.zero.partition_state``): its fp32
partition, its optimizer state in the same flat coordinates, and the layout
(``deepspeed.zero.partition.describe``) that says which element of which parameter every
partition element is. Loading under the same layout reads only this rank's file; under another
layout (a different bucket size, or, with ``elastic_checkpoint``, a different number of ranks)
every rank reads all files, rebuilds whole parameters and moments, and cuts its new partition
from them, so nothing is lost.

Since no file of such a checkpoint holds the whole model, a save also puts the offline
consolidation script ``zero_to_fp32.py`` next to ``latest`` (``copy_zero_to_fp32``).
"""
import os

import torch

from deepspeed.checkpoint import atomic_torch_save, load_file
from deepspeed.checkpoint.atomic import write_file_atomically
from deepspeed.checkpoint.constants import (DS_VERSION, OPTIM_FILE_SUFFIX, OPTIMIZER_STATE_DICT,
                                            ZERO_FILE_PREFIX)
from deepspeed.checkpoint.collective import writes_shared_files
from deepspeed.version import __version__
from deepspeed.zero import partition as layout_math
from deepspeed.zero.partition_state import (ZeroCheckpointError, check_recut,
                                            load_partition_state_dict, partition_state_dict)

OPTIM_FILE = ZERO_FILE_PREFIX + "{dp_rank}_mp_rank_{mp_rank:02d}" + OPTIM_FILE_SUFFIX
ZERO_TO_FP32_FILENAME = "zero_to_fp32.py"


def optim_states_filename(dp_rank, mp_rank=0):
    return OPTIM_FILE.format(dp_rank=dp_rank, mp_rank=mp_rank)


# ---------------------------------------------------------------------- files
def copy_zero_to_fp32(engine, save_dir):
    """Put the offline consolidation script next to ``latest``, as DeepSpeed does, so the folder
    converts itself (``python zero_to_fp32.py . pytorch_model.bin``). The script is
    ``deepspeed.zero.zero_to_fp32``, which imports nothing from DeepSpeed. Written once per
    storage (global rank 0, or each node's first rank with node-local storage), atomically."""
    if not writes_shared_files(engine):
        return None
    from deepspeed.zero import zero_to_fp32

    with open(zero_to_fp32.__file__, "rb") as f:
        script = f.read()
    target = os.path.join(os.fspath(save_dir), ZERO_TO_FP32_FILENAME)
    write_file_atomically(target, lambda out: out.write(script))
    os.chmod(target, 0o755)
    return target


def save_rank_file(opt, checkpoint_dir, dp_rank, mp_rank, ds_config):
    path = os.path.join(checkpoint_dir, optim_states_filename(dp_rank, mp_rank))
    atomic_torch_save({OPTIMIZER_STATE_DICT: partition_state_dict(opt), "ds_config": ds_config,
                       DS_VERSION: str(__version__)}, path)
    return path


def _read(checkpoint_dir, dp_rank, mp_rank):
    path = os.path.join(checkpoint_dir, optim_states_filename(dp_rank, mp_rank))
    if not os.path.isfile(path):
        present = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith("_optim_states.pt"))
        raise ZeroCheckpointError(f"ZeRO optimizer file '{path}' does not exist; "
                                  f"'{checkpoint_dir}' holds {present or 'no optimizer files'}")
    return load_file(path)[OPTIMIZER_STATE_DICT]


def load_rank_file(opt, checkpoint_dir, dp_rank, mp_rank, elastic, saved_world=None,
                   saved_partitions=None):
    """Restore ``opt`` from the checkpoint's ZeRO files, re-cutting partitions when needed.
    ``saved_world`` (the model states' ``dp_world_size``) saves opening rank 0's file.
    With ``"checkpoint": {"load_universal": true}`` the folder is a universal checkpoint
    (``ds_to_universal``), cut for this layout by ``deepspeed.zero.universal``."""
    from deepspeed.checkpoint.universal import is_universal_checkpoint

    if bool(getattr(opt.config, "load_universal_checkpoint", False)):
        from deepspeed.zero.universal import load_universal_checkpoint

        load_universal_checkpoint(opt, checkpoint_dir)
        return
    if is_universal_checkpoint(checkpoint_dir):
        raise ZeroCheckpointError(
            f"'{checkpoint_dir}' is a universal checkpoint (written by ds_to_universal); set "
            f"\"checkpoint\": {{\"load_universal\": true}} in the config to load it")
    if saved_world is None:
        first = _read(checkpoint_dir, 0, mp_rank)
        saved_partitions = int(first["partition_count"])
        saved_world = saved_partitions * int(first.get("partition_replicas", 1))
    # MiCS saves fewer partitions than ranks (replicas hold the same one): a change of
    # mics_shard_size alone re-cuts them like a change of world size would
    saved_partitions = int(saved_partitions or saved_world)
    if saved_world != opt.world_size and not elastic:
        raise ZeroCheckpointError(
            f"the ZeRO checkpoint in '{checkpoint_dir}' was saved with {saved_world} "
            f"data-parallel ranks and this run has {opt.world_size}; set "
            f"\"zero_optimization\": {{\"elastic_checkpoint\": true}} to re-partition it")
    my_layout = layout_math.describe(opt.layouts, opt.param_names)
    if saved_world == opt.world_size and saved_partitions == opt.partition_count:
        mine = _read(checkpoint_dir, dp_rank, mp_rank)
        if mine["layout"] == my_layout:
            load_partition_state_dict(opt, mine)
            return
    check_recut(opt, checkpoint_dir)
    # ranks 0..partitions-1 hold one partition each (MiCS: the first shard group)
    files = [_read(checkpoint_dir, r, mp_rank) for r in range(saved_partitions)]
    load_partition_state_dict(opt, reshape(files, my_layout, opt.partition_count,
                                           opt.partition_rank))



def reshape(files, new_layout, world_size, rank):
    """A ``partition_state_dict`` for ``rank`` of ``world_size`` under ``new_layout``, built
    from every old rank's state dict (``files`` in old rank order)."""
    old_layout = files[0]["layout"]
    if len(old_layout) != len(new_layout):
        raise ZeroCheckpointError(f"the checkpoint has {len(old_layout)} optimizer param groups, "
                                  f"this optimizer has {len(new_layout)}")
    fp32, states = [], []
    for group, (old, new) in enumerate(zip(old_layout, new_layout)):
        numels = {n: k for b in old for n, k in zip(b["params"], b["numels"])}
        wanted = {n: k for b in new for n, k in zip(b["params"], b["numels"])}
        if numels != wanted:
            raise ZeroCheckpointError(
                f"param group {group}: the checkpoint's parameters "
                f"{sorted(set(numels) ^ set(wanted))[:10]} differ from this model's (names or "
                f"sizes); the model must have the same trainable parameters")

        def recut(partitions):
            whole = layout_math.assemble(old, partitions, numels)
            return layout_math.split(new, world_size, rank, whole, dtype=partitions[0].dtype)

        fp32.append(recut([f["single_partition_of_fp32_groups"][group] for f in files]))
        states.append({key: recut([f["optimizer_state"][group][key] for f in files])
                       for key in files[0]["optimizer_state"][group]})
    frozen = {}
    for name in files[0].get("frozen_shards") or {}:
        frozen[name] = torch.cat([f["frozen_shards"][name].reshape(-1) for f in files])
    out = dict(files[0])
    out.update(partition_count=world_size, layout=new_layout, frozen_shards=None,
               frozen_full=frozen, single_partition_of_fp32_groups=fp32, optimizer_state=states)
    return out
