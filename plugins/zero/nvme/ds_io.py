"""``ds_io``: one read or write benchmark of a folder with the DeepNVMe handle.

    ds_io --folder /local_nvme --io_size 400M --read --block_size 1M --queue_depth 32 \
          --intra_op_parallelism 8 --loops 3

Writes are the default (``--write`` says so explicitly); ``--read`` first writes the file
untimed. ``--gpu`` reads into / writes from accelerator tensors, ``--use_gds`` uses the GPUDirect
handle (``deepspeed.ops.gds``). The numbers are the handle's (task) and the whole transfer's
including buffer allocation and device copies (E2E); see ``io_bench``.
"""
import argparse
import sys

from deepspeed.zero.nvme.io_bench import HandleConfig, parse_size, run_io


def add_handle_arguments(parser):
    """The handle flags ``ds_io`` takes (``ds_nvme_tune`` sweeps the same parameters)."""
    parser.add_argument("--block_size", default="1M", help="bytes per I/O request (e.g. 128K, 1M)")
    parser.add_argument("--queue_depth", type=int, default=32, help="I/O requests in flight")
    parser.add_argument("--intra_op_parallelism", type=int, default=1,
                        help="threads each read/write is split across")
    parser.add_argument("--single_submit", action="store_true",
                        help="submit requests one at a time instead of in batches")
    parser.add_argument("--sequential_requests", action="store_true",
                        help="wait for each batch before the next (overlap_events off)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ds_io", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", nargs="+", required=True,
                        help="folder(s) to benchmark; one worker per folder")
    parser.add_argument("--io_size", default="4M", help="bytes per file, e.g. 4M, 400M, 1G")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--read", action="store_true", help="benchmark reads")
    mode.add_argument("--write", action="store_true", help="benchmark writes (the default)")
    add_handle_arguments(parser)
    parser.add_argument("--threads", type=int, default=1,
                        help="concurrent workers per folder, each with its own handle and file")
    parser.add_argument("--loops", type=int, default=3, help="timed repetitions (mean reported)")
    parser.add_argument("--validate", action="store_true", help="check every transfer's bytes")
    parser.add_argument("--gpu", action="store_true", help="use accelerator tensors")
    parser.add_argument("--use_accelerator_pin_memory", action="store_true",
                        help="pin host buffers with the accelerator instead of the handle")
    parser.add_argument("--use_gds", action="store_true", help="use the GPUDirect Storage handle")
    parser.add_argument("--handle", action="store_true",
                        help="accepted for upstream command lines: every run uses the handle")
    args = parser.parse_args(argv)
    try:
        args.io_bytes = parse_size(args.io_size, "--io_size")
        args.config = handle_config(args)
    except ValueError as err:
        parser.error(str(err))
    if args.loops < 1 or args.threads < 1:
        parser.error("--loops and --threads must be >= 1")
    return args


def handle_config(args):
    return HandleConfig(block_size=parse_size(args.block_size, "--block_size"),
                        queue_depth=args.queue_depth,
                        intra_op_parallelism=args.intra_op_parallelism,
                        single_submit=args.single_submit,
                        overlap_events=not args.sequential_requests)


def io_device(gpu, use_gds):
    """'cpu', or the accelerator's device when --gpu/--use_gds ask for one (an error without)."""
    if not (gpu or use_gds):
        return "cpu"
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.name == "cpu":
        flag = "--use_gds" if use_gds else "--gpu"
        raise SystemExit(f"ds_io: {flag} needs an accelerator device, and this machine's "
                         f"accelerator is the CPU; drop the flag to benchmark host buffers")
    return accelerator.current_device_name()


def main(argv=None):
    args = parse_args(argv)
    op = "read" if args.read else "write"
    device = io_device(args.gpu, args.use_gds)
    pin = "accelerator" if args.use_accelerator_pin_memory else "handle"
    try:
        result = run_io(args.folder, args.io_bytes, op, args.config, loops=args.loops,
                        threads=args.threads, device=device, pin=pin, use_gds=args.use_gds,
                        validate=args.validate)
    except (OSError, RuntimeError, ValueError) as err:
        raise SystemExit(f"ds_io: {err}") from err
    c = args.config
    print(f"ds_io: {op} {args.io_size} x {len(args.folder) * args.threads} file(s), "
          f"block_size={c.block_size} queue_depth={c.queue_depth} "
          f"intra_op_parallelism={c.intra_op_parallelism} single_submit={c.single_submit} "
          f"overlap_events={c.overlap_events} loops={args.loops}"
          f"{' validated' if args.validate else ''}")
    print("\n".join(result.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
