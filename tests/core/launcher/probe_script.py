"""Worker program for the launcher tests: records what the launcher gave it, then obeys flags.

It writes `<out>/rank<RANK>.json` with its environment, parsed --local_rank, argv, pid, parent pid,
CPU affinity and (with --allreduce) the gloo all_reduce of tensor([rank]).
"""
import argparse
import json
import os
import signal
import sys
import time

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "FROM_DS_ENV_FILE")

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=None)
parser.add_argument("--out", required=True)
parser.add_argument("--allreduce", action="store_true")
parser.add_argument("--fail_rank", type=int, default=-1)
parser.add_argument("--fail_mode", choices=("exit3", "sigkill"), default="exit3")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--read_pid_file", action="store_true")
args = parser.parse_args()

rank = int(os.environ["RANK"])
record = {
    "env": {key: os.environ.get(key) for key in KEYS},
    "local_rank_arg": args.local_rank,
    "argv": sys.argv[1:],
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "affinity": sorted(os.sched_getaffinity(0)),
}
if args.read_pid_file:
    import psutil

    runner_pid = psutil.Process(os.getppid()).ppid()
    with open(f"/tmp/{runner_pid}.deepspeed", encoding="ascii") as handle:
        record["pid_file"] = handle.read().strip()
if args.allreduce:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([rank])
    dist.all_reduce(value)
    record["allreduce"] = int(value.item())
    dist.destroy_process_group()
print(f"hello from rank {rank}", flush=True)
path = os.path.join(args.out, f"rank{rank}.json")
with open(path + ".tmp", "w", encoding="utf-8") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)

if rank == args.fail_rank:
    # fail only once every rank has written its record: the test reads the others' pids to
    # check the launcher ended them, and on a loaded machine a sibling may still be starting
    deadline = time.monotonic() + 60
    world = int(os.environ["WORLD_SIZE"])
    while (time.monotonic() < deadline and
           not all(os.path.exists(os.path.join(args.out, f"rank{r}.json")) for r in range(world))):
        time.sleep(0.05)
    if args.fail_mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
if args.sleep:
    time.sleep(args.sleep)
