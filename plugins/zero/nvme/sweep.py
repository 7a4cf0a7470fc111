"""``ds_nvme_tune``: sweep the async I/O parameters over NVMe folders and print the best ``aio``
config section.

    ds_nvme_tune --nvme_dir /local_nvme --io_size 400M --loops 3

Every combination of the sweep (``--sweep_config`` JSON, else ``DEFAULT_SWEEP``) runs the ``ds_io``
benchmark for reads and writes (``--no_read`` / ``--no_write`` drop one); each run's output goes
to ``--log_dir``. The result is the best read and write speed and, as JSON ready to paste into a
DeepSpeed config, the ``aio`` section of the fastest read configuration (the fastest write one
with ``--no_read``). With ``--flush_page_cache`` the kernel's page cache is dropped before each
read (root only), so reads measure the device rather than memory.
"""
import argparse
import itertools
import json
import os
import sys

from deepspeed.zero.nvme.ds_io import io_device
from deepspeed.zero.nvme.io_bench import HandleConfig, parse_size, run_io

# key -> values; the keys are HandleConfig's fields ("io_parallel" is accepted for
# intra_op_parallelism, as upstream's sweep files spell it)
DEFAULT_SWEEP = {"block_size": ["128K", "1M"], "queue_depth": [4, 32, 128],
                 "intra_op_parallelism": [1, 2, 4, 8], "single_submit": [False, True],
                 "overlap_events": [True, False]}
ALIASES = {"io_parallel": "intra_op_parallelism"}
DROP_CACHES = "/proc/sys/vm/drop_caches"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ds_nvme_tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvme_dir", nargs="+", required=True, help="folder(s) on the NVMe device(s)")
    parser.add_argument("--sweep_config", default=None, help="JSON file: {parameter: [values]}")
    parser.add_argument("--no_read", action="store_true", help="skip the read sweep")
    parser.add_argument("--no_write", action="store_true", help="skip the write sweep")
    parser.add_argument("--io_size", default="400M", help="bytes per file, e.g. 4M, 400M, 1G")
    parser.add_argument("--gpu", action="store_true", help="use accelerator tensors")
    parser.add_argument("--gds", action="store_true", help="use the GPUDirect Storage handle")
    parser.add_argument("--flush_page_cache", action="store_true",
                        help=f"drop the page cache before each read (writes {DROP_CACHES}: root)")
    parser.add_argument("--log_dir", default="./_aio_bench_logs", help="one log per run")
    parser.add_argument("--loops", type=int, default=3, help="timed repetitions per run")
    parser.add_argument("--verbose", action="store_true", help="print every run's speeds")
    args = parser.parse_args(argv)
    if args.no_read and args.no_write:
        parser.error("--no_read and --no_write leave nothing to sweep")
    if args.loops < 1:
        parser.error(f"--loops must be >= 1, got {args.loops}")
    try:
        args.io_bytes = parse_size(args.io_size, "--io_size")
        args.configs = sweep_configs(load_sweep(args.sweep_config))
    except ValueError as err:
        parser.error(str(err))
    return args


def load_sweep(path):
    if path is None:
        return dict(DEFAULT_SWEEP)
    try:
        with open(path, encoding="utf-8") as f:
            sweep = json.load(f)
    except OSError as err:
        raise ValueError(f"cannot read --sweep_config '{path}': {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"--sweep_config '{path}' is not JSON: {err}") from err
    if not isinstance(sweep, dict):
        raise ValueError(f"--sweep_config '{path}' must hold an object {{parameter: [values]}}")
    return sweep


def sweep_configs(sweep):
    """Every HandleConfig of the sweep (parameters it omits keep HandleConfig's defaults)."""
    fields = set(HandleConfig.__dataclass_fields__)
    axes = {}
    for key, values in sweep.items():
        name = ALIASES.get(key, key)
        if name not in fields:
            raise ValueError(f"sweep parameter {key!r} is unknown; allowed: "
                             f"{', '.join(sorted(fields | set(ALIASES)))}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ValueError(f"sweep parameter {key!r} has no values")
        axes[name] = [_value(name, v) for v in values]
    names = list(axes)
    return [HandleConfig(**dict(zip(names, combo))) for combo in itertools.product(*axes.values())]


def _value(name, value):
    if name == "block_size":
        return parse_size(value, "block_size")
    kind = HandleConfig.__dataclass_fields__[name].type
    if kind in (bool, "bool"):
        if not isinstance(value, bool):
            raise ValueError(f"sweep parameter {name!r} takes true/false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"sweep parameter {name!r} takes positive integers, got {value!r}")
    return value


def flush_page_cache():
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("1\n")
    except OSError as err:
        raise SystemExit(f"ds_nvme_tune: --flush_page_cache cannot write {DROP_CACHES} "
                         f"({err.strerror}); run as root or drop the flag") from err


def _log_name(op, config):
    return (f"{op}_bs{config.block_size}_qd{config.queue_depth}_p{config.intra_op_parallelism}"
            f"_single{int(config.single_submit)}_overlap{int(config.overlap_events)}.txt")


def sweep(args, out=None):
    """{op: [(config, IoResult)]} for every op and config of ``args``; logs each run."""
    out = out or sys.stdout
    device = io_device(args.gpu, args.gds)
    os.makedirs(args.log_dir, exist_ok=True)
    ops = [op for op, skip in (("read", args.no_read), ("write", args.no_write)) if not skip]
    results = {op: [] for op in ops}
    for op in ops:
        for config in args.configs:
            if op == "read" and args.flush_page_cache:
                flush_page_cache()
            result = run_io(args.nvme_dir, args.io_bytes, op, config, loops=args.loops,
                            device=device, use_gds=args.gds)
            with open(os.path.join(args.log_dir, _log_name(op, config)), "w") as f:
                f.write(json.dumps(config.aio_section()) + "\n" + "\n".join(result.lines()) + "\n")
            if args.verbose:
                print(f"{op} {config}: {result.task_gbs:.3f} GB/sec", file=out)
            results[op].append((config, result))
    return results


def best(results):
    """(best read GB/s or None, best write GB/s or None, the config to recommend)."""
    fastest = {op: max(runs, key=lambda run: run[1].task_gbs) for op, runs in results.items()}
    read, write = fastest.get("read"), fastest.get("write")
    chosen = (read or write)[0]
    return (read[1].task_gbs if read else None, write[1].task_gbs if write else None, chosen)


def main(argv=None):
    args = parse_args(argv)
    if not args.flush_page_cache and not args.no_read:
        print("ds_nvme_tune: reads may be served from the page cache; pass --flush_page_cache "
              "(root) to measure the device")
    try:
        results = sweep(args)
    except (OSError, RuntimeError, ValueError) as err:
        raise SystemExit(f"ds_nvme_tune: {err}") from err
    read, write, config = best(results)
    shown = {"read": "n/a" if read is None else f"{read:.3f}",
             "write": "n/a" if write is None else f"{write:.3f}"}
    print(f"Best performance (GB/sec): read = {shown['read']}, write = {shown['write']}")
    print(json.dumps(config.aio_section(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
