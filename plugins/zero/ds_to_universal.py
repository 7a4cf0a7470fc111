"""``ds_to_universal``: convert one ZeRO checkpoint tag into a universal checkpoint.

    ds_to_universal --input_folder <save_dir or save_dir/tag> --output_folder <dir>
                    [--num_extract_workers N] [--num_merge_workers N] [--keep_temp_folder]
                    [--strict | --no_strict] [--inject_missing_state]

(also ``python -m deepspeed.checkpoint.ds_to_universal``, upstream's path, which setup.py maps
onto this module through ``plugins/zero/upstream_paths``; ``convert(...)`` from Python.) The
output layout is described in ``deepspeed.checkpoint.universal``. It lives in the ZeRO plugin
because reading the source is reading ZeRO's partition files and layout.

Two phases, each a process pool, so no process ever holds more than one rank file or one
parameter's fragments:

1. *extract* (per source rank): cut the rank's flat partitions into per-parameter fragments
   ``<output>/tmp/<param>/<rank>.pt`` (with their element offsets);
2. *merge* (per parameter): put the fragments of all ranks together into full-shape tensors.

Every file is a pure function of the input, so the output does not depend on the worker counts.
"""
import argparse
import os
import shutil
import sys
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import (CheckpointFormatError, atomic_torch_save,
                                         atomic_write_text, load_file)
from deepspeed.checkpoint.layout import LATEST_FILENAME, model_states_filename, read_latest
from deepspeed.zero.checkpoint_layout import partition_ranges
from deepspeed.zero.checkpointing import optim_states_filename

OPTIM_SUFFIX = "_optim_states.pt"
TEMP_DIRNAME = "tmp"


def optim_file(checkpoint_dir, rank):
    return os.path.join(checkpoint_dir, optim_states_filename(rank))


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def resolve_input(input_folder):
    """``(checkpoint_dir, tag)`` for a save dir (its ``latest`` tag) or a tag folder."""
    input_folder = os.path.abspath(os.fspath(input_folder))
    if os.path.isfile(os.path.join(input_folder, model_states_filename(0))):
        return input_folder, os.path.basename(input_folder.rstrip(os.sep))
    if not os.path.isdir(input_folder):
        raise FileNotFoundError(f"--input_folder '{input_folder}' does not exist")
    tag = read_latest(input_folder)
    if tag is None:
        raise FileNotFoundError(
            f"--input_folder '{input_folder}' is neither a checkpoint tag folder (no "
            f"{model_states_filename(0)}) nor a save dir with a '{LATEST_FILENAME}' file; pass "
            f"the tag folder, one of {sorted(os.listdir(input_folder))[:10]}")
    path = os.path.join(input_folder, tag)
    if not os.path.isfile(os.path.join(path, model_states_filename(0))):
        raise FileNotFoundError(f"'{input_folder}/{LATEST_FILENAME}' names tag '{tag}', but "
                                f"'{path}' holds no {model_states_filename(0)}")
    return path, tag


# ---------------------------------------------------------------------- source reading
def _rank_files(checkpoint_dir, strict):
    names = sorted(n for n in os.listdir(checkpoint_dir) if n.endswith(OPTIM_SUFFIX))
    if not names:
        raise CheckpointFormatError(f"'{checkpoint_dir}' holds no ZeRO optimizer files "
                                    f"(*{OPTIM_SUFFIX}); only ZeRO stage 1-3 checkpoints convert")
    if any("_mp_rank_00" not in n for n in names):
        raise CheckpointFormatError(f"'{checkpoint_dir}' has tensor/model-parallel ranks > 0 "
                                    f"({names[:4]}...); only model-parallel size 1 converts")
    world = int(_load(optim_file(checkpoint_dir, 0))["optimizer_state_dict"]["partition_count"])
    expected = {os.path.basename(optim_file(checkpoint_dir, r)) for r in range(world)}
    missing, extra = sorted(expected - set(names)), sorted(set(names) - expected)
    if missing:
        raise CheckpointFormatError(f"'{checkpoint_dir}' was saved by {world} ranks but lacks "
                                    f"{missing}")
    if extra and strict:
        raise CheckpointFormatError(f"'{checkpoint_dir}' holds {extra}, beyond the {world} ranks "
                                    f"its files name (--no_strict ignores them)")
    return world


def _param_shapes(model_states, inject_missing_state):
    """``[OrderedDict(name -> shape)]`` per group, from the model states (or, with
    ``inject_missing_state``, from the module's whole weights when the file lacks them)."""
    shapes = model_states.get("param_shapes")
    if shapes:
        return [OrderedDict((n, list(s)) for n, s in group.items()) for group in shapes]
    if not inject_missing_state:
        raise CheckpointFormatError("the model-states file has no 'param_shapes'; pass "
                                    "--inject_missing_state to take shapes from its module weights")
    return None


def _summary(state):
    return {"layout": state["layout"], "zero_stage": state["zero_stage"],
            "param_groups": state["param_groups"], "optimizer_scalars": state["optimizer_scalars"],
            "state_keys": [sorted(g) for g in state["optimizer_state"]],
            "frozen": sorted(state.get("frozen_shards") or {})}


def _extract_rank(job):
    """Phase 1 for one source rank: one fragment file per parameter it holds a slice of."""
    checkpoint_dir, rank, world, temp_dir = job
    state = _load(optim_file(checkpoint_dir, rank))["optimizer_state_dict"]
    for group, described in enumerate(state["layout"]):
        flat = state["single_partition_of_fp32_groups"][group]
        moments = state["optimizer_state"][group]
        for name, start, stop, at in partition_ranges(described, world, rank):
            n = stop - start
            fragment = {"start": start, "stop": stop, universal.FP32_KEY: flat[at:at + n].clone()}
            fragment.update({k: v[at:at + n].clone() for k, v in moments.items()})
            target = os.path.join(temp_dir, name)
            os.makedirs(target, exist_ok=True)
            atomic_torch_save(fragment, os.path.join(target, f"{rank}.pt"), check=False)
    for name, shard in (state.get("frozen_shards") or {}).items():
        target = os.path.join(temp_dir, name)
        os.makedirs(target, exist_ok=True)
        atomic_torch_save({"start": None, "stop": None, universal.FP32_KEY: shard.clone()},
                          os.path.join(target, f"{rank}.pt"), check=False)
    return _summary(state)


def _merge_param(job):
    """Phase 2 for one parameter: full-shape tensors from every rank's fragment."""
    name, shape, keys, world, temp_dir, out_dir, frozen = job
    numel = 1
    for size in shape:
        numel *= int(size)
    fragments = [(r, os.path.join(temp_dir, name, f"{r}.pt")) for r in range(world)]
    fragments = [(r, load_file(p)) for r, p in fragments if os.path.isfile(p)]
    full, covered = {}, 0
    if frozen:  # ZeRO-3 shards, padded at the end: rank order is element order
        flat = torch.cat([f[universal.FP32_KEY].reshape(-1) for _, f in fragments])
        covered = min(flat.numel(), numel)
        full[universal.FP32_KEY] = flat[:numel].clone()
    else:
        for _, fragment in fragments:
            start, stop = fragment["start"], fragment["stop"]
            covered += stop - start
            for key in keys:
                if key not in full:
                    full[key] = torch.zeros(numel, dtype=fragment[key].dtype)
                full[key][start:stop] = fragment[key]
    if covered != numel or not full:
        raise CheckpointFormatError(f"parameter {name!r}: the rank files cover {covered} of "
                                    f"its {numel} elements {tuple(shape)}; the checkpoint is "
                                    f"incomplete")
    for key, tensor in full.items():
        path = universal.param_file(out_dir, name, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": tensor.reshape(shape)}, path)
    return name


def _pool_map(fn, jobs, workers):
    """``map`` in this process for one worker (no start-up cost), else over a process pool;
    results come back in job order either way."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        return pool.map(fn, jobs, chunksize=1)


# ---------------------------------------------------------------------- assembling
def _check_ranks_agree(summaries, strict):
    first = summaries[0]
    for rank, summary in enumerate(summaries[1:], start=1):
        for key in ("layout", "zero_stage", "state_keys", "frozen"):
            if summary[key] != first[key]:
                raise CheckpointFormatError(f"rank {rank}'s optimizer file disagrees with rank "
                                            f"0's on {key!r}: the files are from different saves")
        if strict and summary["optimizer_scalars"] != first["optimizer_scalars"]:
            raise CheckpointFormatError(
                f"rank {rank}'s optimizer scalars {summary['optimizer_scalars']} differ from rank "
                f"0's {first['optimizer_scalars']} (--no_strict keeps rank 0's)")


def _groups(summary, shapes, model_states):
    """Per group, ``OrderedDict(name -> shape)`` of the parameters the layout holds, checked
    against the model states' shapes."""
    module = model_states.get("module") or {}
    known = {n: s for g in shapes for n, s in g.items()} if shapes is not None else None
    groups = []
    for described in summary["layout"]:
        group = OrderedDict()
        for bucket in described:
            for name, numel in zip(bucket["params"], bucket["numels"]):
                if known is not None:
                    if name not in known:
                        raise CheckpointFormatError(f"parameter {name!r} of the optimizer "
                                                    f"layout is missing from 'param_shapes'")
                    shape = known[name]
                else:
                    weight = module.get(name)
                    if weight is None or weight.numel() != numel:
                        raise CheckpointFormatError(
                            f"cannot infer the shape of {name!r}: the module weights hold "
                            f"{None if weight is None else tuple(weight.shape)} for {numel} "
                            f"elements (ZeRO-3 placeholders are empty)")
                    shape = list(weight.shape)
                if int(torch.Size(shape).numel()) != int(numel):
                    raise CheckpointFormatError(f"parameter {name!r}: shape {tuple(shape)} does "
                                                f"not hold the layout's {numel} elements")
                group[name] = list(shape)
        groups.append(group)
    return groups


def _frozen_shapes(model_states, frozen_names):
    recorded = model_states.get("frozen_param_shapes") or {}
    out = OrderedDict()
    for name in frozen_names:
        shape = list(recorded.get(name, []))
        if not shape or torch.Size(shape).numel() == 0:
            raise CheckpointFormatError(
                f"the ZeRO-3 frozen parameter {name!r} has no recorded full shape in "
                f"'frozen_param_shapes' ({recorded.get(name)}); the checkpoint was written "
                f"without it and cannot be re-assembled")
        out[name] = shape
    return out


def _write_module_frozen(model_states, out_dir, sharded):
    """Frozen parameters the module weights hold whole (stages 1/2, persistent ZeRO-3 ones):
    stored like the sharded ones, so every frozen parameter has a ``fp32.pt``."""
    module = model_states.get("module") or {}
    written = OrderedDict()
    for name, shape in (model_states.get("frozen_param_shapes") or {}).items():
        weight = module.get(name)
        if name in sharded or weight is None or weight.numel() == 0:
            continue
        path = universal.param_file(out_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_torch_save({"param": weight.float().clone()}, path)
        written[name] = list(shape)
    return written


def _whole_module(model_states, out_dir, groups, frozen):
    """The model states with each empty ZeRO-3 placeholder in ``module`` replaced by the whole
    weight, so any stage (and plain PyTorch) can load the module."""
    module = OrderedDict(model_states.get("module") or {})
    names = {n: s for g in groups for n, s in g.items()}
    names.update(frozen)
    shared = model_states.get("shared_params") or {}
    for key, value in list(module.items()):
        source = shared.get(key, key)
        if source in names and value.numel() != torch.Size(names[source]).numel():
            whole = universal.load_param_state(out_dir, source, mmap=False)
            module[key] = whole.to(value.dtype).clone()
    state = dict(model_states)
    state["module"] = module
    return state


def convert(input_folder, output_folder, num_extract_workers=4, num_merge_workers=2,
            keep_temp_folder=False, strict=True, inject_missing_state=False):
    """Convert one ZeRO checkpoint tag (a save dir's ``latest``, or a tag folder) into a universal
    checkpoint at ``output_folder/<tag>``; returns that folder."""
    checkpoint_dir, tag = resolve_input(input_folder)
    output_folder = os.path.abspath(os.fspath(output_folder))
    out_dir = os.path.join(output_folder, tag)
    temp_dir = os.path.join(output_folder, TEMP_DIRNAME)
    if os.path.abspath(checkpoint_dir) in (output_folder, out_dir):
        raise ValueError(f"--output_folder '{output_folder}' must differ from the input")
    model_states = load_file(os.path.join(checkpoint_dir, model_states_filename(0)))
    shapes = _param_shapes(model_states, inject_missing_state)
    world = _rank_files(checkpoint_dir, strict)
    os.makedirs(out_dir, exist_ok=True)
    shutil.rmtree(temp_dir, ignore_errors=True)
    os.makedirs(temp_dir)

    summaries = _pool_map(_extract_rank, [(checkpoint_dir, r, world, temp_dir)
                                          for r in range(world)], num_extract_workers)
    _check_ranks_agree(summaries, strict)
    first = summaries[0]
    groups = _groups(first, shapes, model_states)
    if strict and shapes is not None:
        recorded = {n for g in shapes for n in g}
        converted = {n for g in groups for n in g}
        if recorded != converted:
            raise CheckpointFormatError(
                f"'param_shapes' and the optimizer layout disagree on "
                f"{sorted(recorded ^ converted)[:10]} (--no_strict converts the layout's)")
    frozen = _frozen_shapes(model_states, first["frozen"])
    frozen.update(_write_module_frozen(model_states, out_dir, set(frozen)))
    jobs = [(n, s, sorted(set(k) | {universal.FP32_KEY}), world, temp_dir, out_dir, False)
            for g, k in zip(groups, first["state_keys"]) for n, s in g.items()]
    jobs += [(n, frozen[n], [universal.FP32_KEY], world, temp_dir, out_dir, True)
             for n in first["frozen"]]
    _pool_map(_merge_param, jobs, num_merge_workers)

    info = {
        "format": universal.FORMAT, "format_version": universal.FORMAT_VERSION, "tag": tag,
        "source": {"zero_stage": int(first["zero_stage"]), "dp_world_size": world,
                   "ds_version": str(model_states.get("ds_version"))},
        "group_params": [list(g) for g in groups],
        "param_shapes": {n: s for g in groups for n, s in g.items()},
        "frozen_param_shapes": dict(frozen),
        "state_keys": first["state_keys"],
        "optimizer_scalars": first["optimizer_scalars"],
        "param_groups": first["param_groups"],
        "loss_scaler": _load(optim_file(checkpoint_dir, 0))["optimizer_state_dict"].get(
            "loss_scaler"),
    }
    atomic_torch_save(_whole_module(model_states, out_dir, groups, frozen),
                      os.path.join(out_dir, model_states_filename(0)))
    for name in sorted(os.listdir(checkpoint_dir)):
        if name.startswith("rng_state_rank_") and name.endswith(".pt"):
            atomic_torch_save(load_file(os.path.join(checkpoint_dir, name)),
                              os.path.join(out_dir, name))
    atomic_torch_save(info, os.path.join(out_dir, universal.INFO_FILENAME))
    if not keep_temp_folder:
        shutil.rmtree(temp_dir)
    # the info file is written last: its presence marks a finished conversion
    atomic_write_text(os.path.join(output_folder, universal.LATEST_UNIVERSAL_FILENAME), tag)
    atomic_write_text(os.path.join(output_folder, LATEST_FILENAME), tag)
    return out_dir


# ---------------------------------------------------------------------- CLI
def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="ds_to_universal",
        description="Convert a DeepSpeed ZeRO checkpoint into a universal checkpoint, loadable "
                    "with any data-parallel size or ZeRO stage via "
                    "\"checkpoint\": {\"load_universal\": true}.")
    parser.add_argument("--input_folder", required=True,
                        help="ZeRO checkpoint: a save dir (its 'latest' tag) or a tag folder")
    parser.add_argument("--output_folder", required=True,
                        help="where to write the universal checkpoint (<output>/<tag>)")
    parser.add_argument("--num_extract_workers", type=int, default=4,
                        help="processes reading source rank files (default 4)")
    parser.add_argument("--num_merge_workers", type=int, default=2,
                        help="processes assembling parameters (default 2)")
    parser.add_argument("--keep_temp_folder", action="store_true",
                        help="keep <output>/tmp, the per-rank fragments")
    parser.add_argument("--strict", dest="strict", action="store_true", default=True,
                        help="fail when files, shapes or ranks disagree (default)")
    parser.add_argument("--no_strict", dest="strict", action="store_false",
                        help="convert what the optimizer layout covers despite disagreements")
    parser.add_argument("--inject_missing_state", action="store_true",
                        help="take parameter shapes from the module weights when the "
                             "model-states file lacks 'param_shapes'")
    args = parser.parse_args(argv)
    for flag in ("num_extract_workers", "num_merge_workers"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return args


def main(argv=None):
    args = parse_arguments(argv)
    try:
        out = convert(args.input_folder, args.output_folder, args.num_extract_workers,
                      args.num_merge_workers, args.keep_temp_folder, args.strict,
                      args.inject_missing_state)
    except (CheckpointFormatError, FileNotFoundError, ValueError) as err:
        print(f"ds_to_universal: error: {err}", file=sys.stderr)
        return 1
    print(f"ds_to_universal: wrote universal checkpoint '{out}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
