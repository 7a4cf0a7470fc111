"""``ds_to_universal``: convert one ZeRO checkpoint tag into a universal checkpoint.

    ds_to_universal --input_folder <save_dir or save_dir/tag> --output_folder <dir>
                    [--num_extract_workers N] [--num_merge_workers N] [--keep_temp_folder]
                    [--strict | --no_strict] [--inject_missing_state]

(also ``python -m deepspeed.checkpoint.ds_to_universal``, upstream's path, which setup.py maps
onto this module through ``plugins/zero/upstream_paths``; ``convert(...)`` from Python.) The
output layout is described in ``deepspeed.checkpoint.universal``. It lives in the ZeRO plugin
because reading the source is reading ZeRO's partition files and layout.

Two phases (``deepspeed.zero.ds_to_universal_phases``), each a process pool, so no process ever
holds more than one rank file or one parameter's fragments:

1. *extract* (per source rank): cut the rank's flat partitions into per-parameter fragments
   ``<output>/tmp/<param>/<rank>.pt`` (with their element offsets);
2. *merge* (per parameter): put the fragments of all ranks together into full-shape tensors.

Every file is a pure function of the input, so the output does not depend on the worker counts.

Pipeline checkpoints (``pipeline_stages`` in the model-states files: one ``mp_rank_<stage>``
model-states file per stage, the layers in ``layer_XX-model_states.pt``, and with ZeRO inside
the stages one set of ``zero_pp_rank_<dp>_mp_rank_<stage>`` files per stage) convert too, with
or without ZeRO (``deepspeed.zero.ds_to_universal_pipeline``): each stage is read like a
checkpoint of its own (without ZeRO, from the torch optimizer state in its model-states file)
and the stages are merged under the PipelineModule's global names, a tied weight once, the param
groups merged group by group. The result is what a single-stage model with those names would
have saved (``source.pipeline_stages`` records the origin): it loads with ``load_universal``
into a ``PipelineEngine`` at any number of stages (each stage reads its parameters by global
name), or into any non-pipeline engine whose ``state_dict`` names are the pipeline's global
names (an ``nn.Sequential`` of the same layers), at any data-parallel size and ZeRO stage 0-3.

Tensor-parallel checkpoints (``mp_world_size`` > 1: AutoTP's, or a pipeline's whose layers are
split over its grid's ``model`` axis) take the same road: every model-parallel rank is read as a
part, and the tensor ranks' slices of each parameter the model states list in ``param_slices``
are joined (``deepspeed.zero.ds_to_universal_tp``); loading cuts each rank's slice again, at
any tensor-parallel size. That holds for frozen parameters split over the tensor ranks (ZeRO-3
partitioned ones included: each rank's shards are merged, then the ranks' pieces joined) and for
a pipeline's tied weights split over them (each tensor rank's layer file holds its piece).

MoE checkpoints (``moe_checkpoint`` in the model-states file: experts in files of their own)
convert too (``deepspeed.zero.ds_to_universal_moe``), saved with ZeRO 1/2 (expert param groups
partitioned over their expert-data-parallel group), with ZeRO-3 (``ep_size`` 1: the experts
are ordinary parameters of its shards) or without ZeRO (optimizer state per expert-parallel
rank), frozen experts included: the result holds every expert under the global names of the
model with ``ep_size`` 1, and loads into such a model or at any other ``ep_size``. Inside a
pipeline each stage's experts convert the same way (the layout records the stage's
data-parallel ranks), with ZeRO-1 or without ZeRO; under tensor parallelism each tensor rank's
experts do, replicated experts taken once (their ZeRO partitions, spread over every tensor
rank's copies, joined) and tensor-parallel experts joined like any split parameter.
"""
import argparse
import os
import sys
from collections import OrderedDict

import torch

from deepspeed.checkpoint import universal
from deepspeed.checkpoint.atomic import CheckpointFormatError, load_file
from deepspeed.checkpoint.layout import LATEST_FILENAME, model_states_filename, read_latest
from deepspeed.zero import ds_to_universal_moe as moe
from deepspeed.zero import zero_to_fp32 as fp32_script
from deepspeed.zero.ds_to_universal_phases import (
    TEMP_DIRNAME, check_ranks_agree, checked_groups, extract_rank, finish, fresh_dirs,
    frozen_shapes, merge_jobs, merge_param, param_shapes, pool_map, rank_world, saved_loss_scaler,
    universal_info, write_module_frozen)
from deepspeed.zero.ds_to_universal_pipeline import STAGE_IO, convert_pipeline


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
    if model_states.get(fp32_script.PIPELINE_STAGES) is not None or \
            int(model_states.get("mp_world_size") or 1) > 1:  # pipeline or tensor parallel
        return convert_pipeline(checkpoint_dir, tag, output_folder, model_states,
                                num_extract_workers, num_merge_workers, keep_temp_folder,
                                strict, inject_missing_state)
    moe_state = model_states.get(moe.MOE_STATE_KEY)
    if moe_state is not None and moe_state.get("optimizer_files"):  # no ZeRO, ep > 1
        return moe.convert_plain(checkpoint_dir, tag, output_folder, model_states, strict,
                                 keep_temp_folder, STAGE_IO)
    shapes = param_shapes(model_states, inject_missing_state)
    world = rank_world(checkpoint_dir, strict)
    plan = moe.moe_plan(model_states, world)
    fresh_dirs(out_dir, temp_dir)

    summaries = pool_map(extract_rank, [(checkpoint_dir, r, world, temp_dir, 0, plan)
                                        for r in range(world)], num_extract_workers,
                         desc="extracting rank files")
    check_ranks_agree(summaries, strict)
    first = summaries[0]
    groups = checked_groups(first, shapes, model_states, strict)
    # the expert groups' names (``ep_size_<n>``) are the saved layout's, not the loader's
    hyper = moe.layout_free_hyper(first["param_groups"])
    if plan is not None:
        groups = moe.global_groups(plan, first["layout"], groups)
        # the module with every expert (from their files), under the ep-1 model's names
        model_states = moe.with_global_experts(checkpoint_dir, model_states, plan)
        model_states.pop(moe.MOE_STATE_KEY)
        model_states["param_shapes"] = [OrderedDict(g) for g in groups]
    sharded = frozen_shapes(model_states, first["frozen"])
    jobs = merge_jobs(groups, first["state_keys"], sharded, world, temp_dir, out_dir)
    frozen = OrderedDict(sharded)
    frozen.update(write_module_frozen(model_states, out_dir, set(sharded)))
    pool_map(merge_param, list(jobs.values()), num_merge_workers, desc="merging parameters")

    source = {"zero_stage": int(first["zero_stage"]), "dp_world_size": world,
              "ds_version": str(model_states.get("ds_version"))}
    if plan is not None:
        source["moe"] = [{k: v for k, v in layer.items()} for layer in moe_state["layers"]]
    info = universal_info(tag, source, groups, frozen, first["state_keys"],
                          first["optimizer_scalars"], hyper,
                          saved_loss_scaler(checkpoint_dir))
    return finish(checkpoint_dir, output_folder, tag, info,
                  _whole_module(model_states, out_dir, groups, frozen), keep_temp_folder)


# ---------------------------------------------------------------------- CLI
def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="ds_to_universal",
        description="Convert a DeepSpeed ZeRO, pipeline or tensor-parallel checkpoint into a "
                    "universal checkpoint, loadable with any data-parallel size, ZeRO stage, "
                    "number of pipeline stages or tensor-parallel size via "
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
