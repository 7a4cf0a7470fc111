"""Worker for the multi-node launcher tests: joins the group the way a training script does.

`deepspeed.init_distributed()` reads whatever the launcher provided (RANK/WORLD_SIZE from the
per-node launcher, PMI_* from MPICH, SLURM_* from srun), then the rank all-reduces tensor([rank])
and writes `<out>/rank<R>.json` with where it ran: the node (the fake cluster's name for it, and
the address this machine's hostname resolves to on that node) and the launcher's variables.
"""
import argparse
import json
import os
import socket

import torch

import deepspeed
from deepspeed import comm as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=None)
parser.add_argument("--out", required=True)
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
dist.destroy_process_group()
path = os.path.join(args.out, f"rank{rank}.json")
with open(path + ".tmp", "w", encoding="utf-8") as handle:
    json.dump(record, handle)
os.replace(path + ".tmp", path)
