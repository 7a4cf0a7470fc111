"""Worker for the multi-node launcher tests: joins the group the way a training script does.

`deepspeed.init_distributed()` reads whatever the launcher provided (RANK/WORLD_SIZE from the
per-node launcher, PMI_* from MPICH, SLURM_* from srun), then the rank all-reduces tensor([rank])
and writes `<out>/rank<R>.json` with where it ran: the node (the fake cluster's name for it, and
the address this machine's hostname resolves to on that node) and the launcher's variables.

`--then SCRIPT ARGS...` goes on to run SCRIPT in the same process, in the group already joined
(`deepspeed.initialize` adopts it), so one launch serves the probe's tests and the script's.
"""
import argparse
import json
import os
import runpy
import socket
import sys

import torch

import deepspeed
from deepspeed import comm as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=None)
parser.add_argument("--out", required=True)
parser.add_argument("--then", nargs=argparse.REMAINDER, default=None)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo", verbose=False)
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([rank])
dist.all_reduce(value)
record = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "local_rank_arg": args.local_rank,
    "node": os.environ.get("DS_FAKE_NODE"),
    "address": socket.gethostbyname(socket.gethostname()),
    "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "allreduce": int(value.item()),
}
dist.barrier()
if not args.then:
    dist.destroy_process_group()
path = os.path.join(args.out, f"rank{rank}.json")
with open(path + ".tmp", "w", encoding="utf-8") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)
if args.then:
    script, *script_args = args.then
    if args.local_rank is not None:
        script_args.insert(0, f"--local_rank={args.local_rank}")
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")
