"""Async I/O (DeepNVMe aio_handle) write/read throughput against plain sequential file I/O.

    python tools/bench/aio_bench.py [--dir /tmp] [--io_size_mib 1024] [--loops 3]

Every contestant moves the same bytes to a file in --dir, on the same disk, in one run:

* ``dd``: ``open().write`` of the whole buffer + fsync, then ``readinto`` (what ``dd conv=fsync``
  does, one sequential stream);
* ``aio pN``: the native op with intra_op_parallelism N on a page-aligned locked buffer
  (``new_cpu_locked_tensor``), which takes the O_DIRECT path where the file system allows it;
* ``aio p4 unaligned``: the same on an ordinary tensor (buffered path).

Writes are timed to durable (fsync for the buffered writers; O_DIRECT chunks are on the device
when they complete, and the handle's file is fsynced too, so both pay the same). Before every
read the file's pages are dropped from the page cache (posix_fadvise DONTNEED, no root needed),
so reads come from the disk rather than from memory. Each read is checked byte-for-byte against
the source. The figure is the median GB/s (1e9 bytes/s) over --loops. A tool, not a test.
"""
import argparse
import os
import statistics
import sys
import time

import torch


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dd_round(src, path):
    view = memoryview(src.numpy())
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        f.write(view)
        os.fsync(f.fileno())
    t_write = time.perf_counter() - t0
    drop_cache(path)
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        f.readinto(memoryview(dst.numpy()))
    t_read = time.perf_counter() - t0
    return t_write, t_read, dst


def aio_round(handle, src, dst, path):
    if os.path.exists(path):
        os.remove(path)  # a fresh file each time, like dd's truncate
    t0 = time.perf_counter()
    handle.async_pwrite(src, path)
    handle.wait()
    fsync(path)
    t_write = time.perf_counter() - t0
    drop_cache(path)
    t0 = time.perf_counter()
    handle.sync_pread(dst, path)
    t_read = time.perf_counter() - t0
    return t_write, t_read, dst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--io_size_mib", type=int, default=1024)
    p.add_argument("--loops", type=int, default=3)
    p.add_argument("--block_size", type=int, default=1 << 20)
    p.add_argument("--queue_depth", type=int, default=32)
    args = p.parse_args(argv)

    from deepspeed.ops.aio import AsyncIOBuilder

    op = AsyncIOBuilder().load(verbose=False)
    size = args.io_size_mib << 20
    path = os.path.join(args.dir, f"ds_aio_bench_{os.getpid()}.bin")
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def handle(threads):
        return op.aio_handle(block_size=args.block_size, queue_depth=args.queue_depth,
                             single_submit=False, overlap_events=True, intra_op_parallelism=threads)

    contestants = {"dd (write+fsync / readinto)": lambda: dd_round(src, path)}
    for threads in (1, 2, 4):
        h = handle(threads)
        a_src = h.new_cpu_locked_tensor(size, src)
        a_src.copy_(src)
        a_dst = h.new_cpu_locked_tensor(size, src)
        contestants[f"aio p{threads} (aligned, O_DIRECT)"] = (
            lambda h=h, a_src=a_src, a_dst=a_dst: aio_round(h, a_src, a_dst, path))
    h4 = handle(4)
    plain_dst = torch.empty_like(src)
    contestants["aio p4 (unaligned, buffered)"] = lambda: aio_round(h4, src, plain_dst, path)

    results = {name: ([], []) for name in contestants}
    try:
        for _ in range(args.loops):
            for name, fn in contestants.items():  # interleaved, so disk drift hits all alike
                t_w, t_r, dst = fn()
                if not torch.equal(dst, src):
                    sys.exit(f"{name}: the bytes read back differ from those written")
                results[name][0].append(size / t_w / 1e9)
                results[name][1].append(size / t_r / 1e9)
    finally:
        if os.path.exists(path):
            os.remove(path)

    print(f"backend={op.backend()} io_size={args.io_size_mib} MiB dir={args.dir} loops={args.loops} "
          f"block_size={args.block_size} queue_depth={args.queue_depth} overlap_events=True")
    print("| contestant | write GB/s | read GB/s |\n|---|---|---|")
    for name, (w, r) in results.items():
        print(f"| {name} | {statistics.median(w):.2f} | {statistics.median(r):.2f} |")


if __name__ == "__main__":
    main()
