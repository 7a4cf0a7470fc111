"""Worker script for the e2e tests: joins the world through deepspeed.comm and reports it."""
import json
import os
import sys

import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

dist.init_distributed()
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
report = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
          "backend": dist.get_backend(), "sum_of_ranks": total.item(),
          "accelerator": get_accelerator()._name,
          "accelerator_module": type(get_accelerator()).__module__,
          "local_rank_env": os.environ.get("LOCAL_RANK")}
with open(os.path.join(sys.argv[-1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(report, f)
