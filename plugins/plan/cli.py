"""``ds_plan``: print per-rank memory, communication and estimated step time for a model on a
cluster, either for one layout (``--config`` or ``--layout``) or the best ``--top`` layouts of
a search, and write the best as a DeepSpeed config (``--write-config``).

    ds_plan --model llama-70b --cluster dgx-h100 --nodes 4 --global-batch 512 --seq-len 4096
"""
import argparse
import json
import os
import sys
import time

from deepspeed.plan.cluster import GB, PRESETS as CLUSTERS, cluster
from deepspeed.plan.comms import by_name
from deepspeed.plan.layout import Layout, deepspeed_config, layout_from_config
from deepspeed.plan.model_spec import PRESETS as MODELS, load_model
from deepspeed.plan.search import estimate, search


def parser():
    p = argparse.ArgumentParser(prog="ds_plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help=f"a preset ({', '.join(sorted(MODELS))}), a local Hugging Face config "
                        f"(path or cached name), or module:function returning (nn.Module, inputs)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sample")
    p.add_argument("--cluster", default="dgx-h100",
                   help=f"hardware preset: {', '.join(sorted(CLUSTERS) + ['cpu-local'])}")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--gpu-memory-gb", type=float, help="memory of one accelerator, GiB")
    p.add_argument("--host-memory-gb", type=float, help="CPU memory of one node, GiB")
    p.add_argument("--intra-bw-gbps", type=float, help="intra-node GB/s per accelerator")
    p.add_argument("--inter-bw-gbps", type=float, help="inter-node GB/s per accelerator")
    p.add_argument("--memory-bw-gbps", type=float,
                   help="GB/s of one accelerator's memory (bounds the optimizer step)")
    p.add_argument("--global-batch", type=int, help="samples per optimizer step (search)")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--stages", default="0,1,2,3", help="ZeRO stages the search may use")
    p.add_argument("--no-offload", action="store_true", help="search without CPU offload")
    p.add_argument("--max-tp", type=int, help="largest tensor-parallel degree to try (default: a node)")
    p.add_argument("--max-pp", type=int, default=16, help="largest pipeline degree to try")
    p.add_argument("--max-sp", type=int, default=8, help="largest sequence-parallel degree to try")
    p.add_argument("--top", type=int, default=10, help="rows of the ranked table")
    p.add_argument("--config", help="a DeepSpeed config JSON: plan this layout only")
    p.add_argument("--layout", help="plan this layout only: dp=8,tp=2,zero_stage=3,micro_batch=1,...")
    p.add_argument("--write-config", metavar="PATH", help="write the best layout's DeepSpeed config")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def _row(index, e, unit):
    m = e.memory
    comm = sum(by_name(e.collectives).values())

    def size(value):
        return f"{value / unit:.1f}"

    return [str(index), e.layout.label(), f"{e.layout.micro_batch}x{e.layout.grad_accum}",
            size(m.params), size(m.grads), size(m.optimizer), size(m.model_states),
            size(m.activations), size(sum(m.buffers.values())), size(m.peak), size(m.host),
            size(comm), f"{e.step_s:.3g}", f"{e.tokens_per_s:,.0f}"]


HEADER = ["#", "layout", "mbxga", "params", "grads", "optim", "states", "activ", "buffers",
          "peak", "host", "comm", "step s", "tokens/s"]


def render(estimates):
    """The ranked table, sizes in GiB (MiB when every peak is below one GiB)."""
    unit, name = (GB, "GiB") if max(e.memory.peak for e in estimates) >= GB else (2**20, "MiB")
    rows = [HEADER] + [_row(i + 1, e, unit) for i, e in enumerate(estimates)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADER))]
    lines = ["  ".join(cell.rjust(w) if c != 1 else cell.ljust(w)
                       for c, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines) + f"\n(memory per rank in {name}; comm: {name} logged per rank per step)"


def _parse_layout(text):
    values = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in Layout.__dataclass_fields__:
            raise ValueError(f"--layout: unknown key {key!r} (allowed: "
                             f"{', '.join(Layout.__dataclass_fields__)})")
        kind = Layout.__dataclass_fields__[key].type  # int, str or bool
        try:
            values[key] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            raise ValueError(f"--layout: {key}={value!r} is not a {kind.__name__}") from None
    return Layout(**values)


def main(argv=None):
    args = parser().parse_args(argv)
    started = time.perf_counter()
    try:
        hw = cluster(args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                     gpu_memory=args.gpu_memory_gb and int(args.gpu_memory_gb * GB),
                     host_memory=args.host_memory_gb and int(args.host_memory_gb * GB),
                     intra_bw=args.intra_bw_gbps and args.intra_bw_gbps * 1e9,
                     inter_bw=args.inter_bw_gbps and args.inter_bw_gbps * 1e9,
                     memory_bw=args.memory_bw_gbps and args.memory_bw_gbps * 1e9)
        spec = load_model(args.model, seq_len=args.seq_len)
        if args.config or args.layout:
            if args.layout:
                layout = _parse_layout(args.layout)
            else:
                with open(args.config) as f:
                    layout = layout_from_config(json.load(f), hw.world_size)
            estimates = [estimate(spec, layout, hw)]
        else:
            if not args.global_batch:
                raise ValueError("--global-batch is required for a search (or give --config / --layout)")
            stages = tuple(int(s) for s in args.stages.split(","))
            offloads = ("none",) if args.no_offload else ("none", "cpu")
            estimates = search(spec, hw, args.global_batch, top=args.top, stages=stages,
                               offloads=offloads, precision=args.precision, max_tp=args.max_tp,
                               max_pp=args.max_pp, max_sp=args.max_sp)
    except (ValueError, OSError) as error:
        print(f"ds_plan: error: {error}", file=sys.stderr)
        return 2
    print(f"model {spec.name}: {spec.total_params / 1e9:.2f}B params, {spec.num_layers} layers, "
          f"seq {spec.seq_len}; cluster {hw.name}: {hw.nodes} x {hw.gpus_per_node} x "
          f"{hw.gpu_memory / GB:.0f} GiB")
    if not estimates:
        print("no layout fits: add nodes, allow offload (drop --no-offload) or lower the batch")
        return 1
    if args.json:
        print(json.dumps([dict(layout=e.layout.as_dict(), peak=e.memory.peak, step_s=e.step_s,
                               tokens_per_s=e.tokens_per_s, fits=e.fits,
                               comm_bytes=by_name(e.collectives)) for e in estimates], indent=1))
    else:
        print(render(estimates))
        if not estimates[0].fits:
            print("this layout does NOT fit the cluster's memory")
    best = estimates[0].layout
    if best.pp > 1:
        print(f"pipeline: build the model as a PipelineModule with num_stages={best.pp}")
    if args.write_config:
        tmp = args.write_config + ".tmp"
        with open(tmp, "w") as f:
            json.dump(deepspeed_config(best), f, indent=2)
        os.replace(tmp, args.write_config)
        print(f"wrote {args.write_config} ({best.label()})")
    print(f"planned in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
