"""The printed profile: summary, aggregated profile per depth, detailed module tree.

Backward is not measured op by op: its flops are estimated as (2 + recompute_fwd_factor) times
the forward's, which is what the FLOPS lines of the summary use.
"""
import os
import sys
from collections import defaultdict

from deepspeed.profiling.flops_profiler.units import (duration_to_string, flops_to_string,
                                                      macs_to_string, number_to_string,
                                                      params_to_string)
from deepspeed.utils.plots import BarPanel, bar_figure, write_png_beside

_NOTATIONS = """Notations:
data parallel size (dp_size), model parallel size(mp_size),
number of parameters (params), number of multiply-accumulate operations(MACs),
number of floating-point operations (flops), floating-point operations per second (FLOPS),
fwd latency (forward propagation latency), bwd latency (backward propagation latency),
step (weights update latency), iter latency (sum of fwd, bwd and step latency)"""

_NOTES = """Note: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. CrossEntropyLoss).
 They are not counted as submodules, thus not to be printed out. However they make up the difference between a parent's MACs (or latency) and the sum of its submodules'.
2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using that could be larger than the maximum system throughput.
3. The fwd latency listed in the top module's profile is directly captured at the module forward function in PyTorch, thus it's less than the fwd latency shown above which is captured in DeepSpeed."""


def _rate(flops, seconds):
    return flops_to_string(flops / seconds) if seconds > 0 else "n/a"


def _engine_facts(engine):
    if engine is None:
        return None
    mpu = engine.mpu
    mp_size = mpu.get_model_parallel_world_size() if mpu is not None else 1
    from deepspeed import comm as dist

    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return {"world_size": world_size,
            "dp_size": engine.dp_world_size,
            "mp_size": mp_size,
            "batch": engine.train_micro_batch_size_per_gpu()}


def summary_lines(profiler, profile_step):
    flops = profiler.get_total_flops()
    macs = profiler.get_total_macs()
    params = profiler.get_total_params()
    fwd = profiler.get_total_duration()
    facts = _engine_facts(profiler.ds_engine)
    mp_size = facts["mp_size"] if facts else 1
    bwd_factor = 2 + profiler.recompute_fwd_factor
    lines = ["-------------------------- DeepSpeed Flops Profiler --------------------------",
             f"Profile Summary at step {profile_step}:", _NOTATIONS]
    if facts:
        lines += [f"world size: {facts['world_size']}",
                  f"data parallel size: {facts['dp_size']}",
                  f"model parallel size: {facts['mp_size']}",
                  f"batch size per GPU: {facts['batch']}"]
    lines += [f"params per gpu: {params_to_string(params)}",
              f"params of model = params per GPU * mp_size: {params_to_string(params * mp_size)}",
              f"fwd MACs per GPU: {macs_to_string(macs)}",
              f"fwd flops per GPU: {number_to_string(flops)}",
              f"fwd flops of model = fwd flops per GPU * mp_size: "
              f"{number_to_string(flops * mp_size)}",
              f"bwd flops per GPU = {bwd_factor:g} * fwd flops per GPU: "
              f"{number_to_string(bwd_factor * flops)}",
              f"fwd+bwd flops per GPU = {bwd_factor + 1:g} * fwd flops per GPU: "
              f"{number_to_string((bwd_factor + 1) * flops)}",
              f"fwd latency: {duration_to_string(fwd)}",
              f"fwd FLOPS per GPU = fwd flops per GPU / fwd latency: {_rate(flops, fwd)}"]
    bwd = profiler.latencies.get("bwd")
    step = profiler.latencies.get("step")
    if bwd is not None:
        lines += [f"bwd latency: {duration_to_string(bwd)}",
                  f"bwd FLOPS per GPU = {bwd_factor:g} * fwd flops per GPU / bwd latency: "
                  f"{_rate(bwd_factor * flops, bwd)}",
                  f"fwd+bwd FLOPS per GPU = {bwd_factor + 1:g} * fwd flops per GPU / "
                  f"(fwd+bwd latency): {_rate((bwd_factor + 1) * flops, fwd + bwd)}"]
    if step is not None and bwd is not None:
        iteration = fwd + bwd + step
        lines += [f"step latency: {duration_to_string(step)}",
                  f"iter latency: {duration_to_string(iteration)}"]
        if facts and iteration > 0:
            lines.append(f"samples/second: {round(facts['batch'] / iteration, 2)}")
    return lines


def _modules_by_depth(model):
    depths = defaultdict(list)

    def walk(module, depth):
        depths[depth].append(module)
        for child in module.children():
            walk(child, depth + 1)

    walk(model, 0)
    return depths


def aggregated_profile_lines(profiler, module_depth=-1, top_modules=1):
    """Per depth, the ``top_modules`` module types with the most params, MACs and latency
    (modules of one type at one depth are summed)."""
    depths = _modules_by_depth(profiler.model)
    last = max(depths) if module_depth == -1 else min(module_depth, max(depths))
    lines = ["----------------------------- Aggregated Profile per GPU -----------------------------",
             "Top modules in terms of params, MACs or fwd latency at different model depths:"]
    for depth in range(last + 1):
        totals = defaultdict(lambda: [0, 0, 0.0])
        for module in depths[depth]:
            entry = totals[type(module).__name__]
            entry[0] += profiler.module_params(module)
            entry[1] += profiler.module_macs(module)
            entry[2] += profiler.module_duration(module)

        def top(index, fmt):
            ranked = sorted(totals.items(), key=lambda kv: kv[1][index], reverse=True)
            return {name: fmt(values[index]) for name, values in ranked[:top_modules]}

        lines += [f"depth {depth}:",
                  f"    params      - {top(0, params_to_string)}",
                  f"    MACs        - {top(1, macs_to_string)}",
                  f"    fwd latency - {top(2, duration_to_string)}"]
    return lines


def _percent(part, whole):
    return f"{100.0 * part / whole:.2f}%" if whole else "0.00%"


def detailed_profile_lines(profiler, module_depth=-1):
    """The module tree, each module followed by params, % params, MACs, % MACs, fwd latency,
    % latency and fwd FLOPS."""
    total_params = profiler.get_total_params()
    total_macs = profiler.get_total_macs()
    total_duration = profiler.get_total_duration()
    lines = ["------------------------------ Detailed Profile per GPU ------------------------------",
             "Each module profile is listed after its name in the following order: ",
             "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
             "percentage of total fwd latency, fwd FLOPS"]

    def stats(module):
        params = profiler.module_params(module)
        macs = profiler.module_macs(module)
        duration = profiler.module_duration(module)
        return (f"{params_to_string(params)} = {_percent(params, total_params)} Params, "
                f"{macs_to_string(macs)} = {_percent(macs, total_macs)} MACs, "
                f"{duration_to_string(duration)} = {_percent(duration, total_duration)} latency, "
                f"{_rate(profiler.module_flops(module), duration)}")

    def walk(module, prefix, depth, indent):
        head = f"{indent}{prefix}{type(module).__name__}("
        extra = module.extra_repr()
        children = list(module.named_children())
        expand = children and (module_depth == -1 or depth < module_depth)
        if not expand:
            lines.append(f"{head}{stats(module)}{', ' + extra if extra else ''})")
            return
        lines.append(f"{head}{stats(module)}{', ' + extra if extra else ''}")
        for name, child in children:
            walk(child, f"({name}): ", depth + 1, indent + "  ")
        lines.append(f"{indent})")

    walk(profiler.model, "", 0, "")
    lines.append("------------------------------------------------------------------------------")
    return lines


def write_profile(profiler, profile_step, module_depth, top_modules, detailed, output_file):
    lines = summary_lines(profiler, profile_step)
    lines += aggregated_profile_lines(profiler, module_depth, top_modules)
    if detailed:
        lines += detailed_profile_lines(profiler, module_depth)
        lines.append(_NOTES)
    text = "\n".join(lines) + "\n"
    if output_file is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(directory, exist_ok=True)
    with open(output_file, "w") as handle:
        handle.write(text)
    write_png_beside(output_file, lambda: flops_figure(profiler))


def named_modules_at_depth(model, depth):
    """``(qualified name, module)`` of the modules ``depth`` levels below ``model`` (the model
    itself, named by its class, at depth 0)."""
    if depth == 0:
        return [(type(model).__name__, model)]
    return [(name, module) for name, module in model.named_modules()
            if name and name.count(".") == depth - 1]


def flops_figure(profiler, depth=1):
    """The forward flops of each module at ``depth`` (default: the model's direct children),
    one bar per module, in model order."""
    modules = named_modules_at_depth(profiler.model, depth)
    return bar_figure([BarPanel([name for name, _ in modules],
                                [profiler.module_flops(m) / 1e6 for _, m in modules],
                                "forward MFLOPs", title=f"modules at depth {depth}")],
                      title=f"flops profile of {type(profiler.model).__name__}")
