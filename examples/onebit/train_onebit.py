"""The 1-bit Adam / 0/1 Adam / 1-bit LAMB tutorials on the demo GPT, on CPU or GPU.

    deepspeed --num_gpus 2 examples/onebit/train_onebit.py --optimizer OneBitAdam
    deepspeed --num_gpus 2 examples/onebit/train_onebit.py --optimizer ZeroOneAdam
    deepspeed --num_gpus 2 examples/onebit/train_onebit.py --optimizer OneBitLamb
    # the MPI backend (pip install 'deepspeed[1bit]'):
    mpirun -np 2 python examples/onebit/train_onebit.py --comm_backend_name mpi

The config is the tutorials' (``freeze_step`` about 20% of the run, ``comm_backend_name``
"nccl", which on a CPU-only machine compresses over gloo just the same). The first
``freeze_step`` steps are plain Adam/LAMB with full-precision gradient all-reduce; after that
only 1-bit momenta cross the wire. Rank 0 prints the loss and the bytes each step sent, from a
``deepspeed.comm`` observer; at the end it checks that the replicas are identical.
"""
import argparse
import os
import sys

import torch

import deepspeed
from deepspeed import comm as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import positive_int, replicas_identical  # noqa: E402  (examples/)
from gpt import GPT, GPTConfig, MarkovTokens  # noqa: E402

MODEL = GPTConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=64)


def optimizer_section(name, steps, backend):
    warmup = max(1, steps // 5)
    params = {"lr": 5e-3, "betas": [0.9, 0.95], "cuda_aware": False,
              "comm_backend_name": backend}
    if name == "ZeroOneAdam":
        params.update(var_freeze_step=warmup, var_update_scaler=16, local_step_scaler=50,
                      local_step_clipper=4)
    else:
        params["freeze_step"] = warmup
    if name == "OneBitLamb":
        params.update(lr=2e-2, max_coeff=1.0, min_coeff=0.01, coeff_beta=0.9)
    return {"type": name, "params": params}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--optimizer", default="OneBitAdam",
                        choices=["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
    parser.add_argument("--comm_backend_name", default="nccl",
                        choices=["nccl", "compressed", "mpi"])
    parser.add_argument("--steps", type=positive_int, default=300)
    parser.add_argument("--print_every", type=positive_int, default=50)
    args = parser.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = GPT(MODEL)
    data = MarkovTokens(samples=8192, seq_len=MODEL.block_size, vocab_size=MODEL.vocab_size,
                        seed=1234)
    config = {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 10 ** 9,
              "optimizer": optimizer_section(args.optimizer, args.steps, args.comm_backend_name)}
    engine, _, loader, _ = deepspeed.initialize(model=model, training_data=data, config=config)
    rank = dist.get_rank()
    sent = []
    dist.add_comm_observer(lambda record: sent.append(record.size_bytes))
    batches = iter(loader)
    for step in range(1, args.steps + 1):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        sent.clear()
        loss = engine(x.to(engine.device), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        if rank == 0 and (step % args.print_every == 0 or step == 1):
            phase = "full precision" if engine.basic_optimizer.enable_backward_allreduce \
                else "1-bit"
            print(f"step {step:4d}: loss {loss.item():.4f}; next step's gradients: {phase}; "
                  f"this step sent {sum(sent):,} bytes via deepspeed.comm", flush=True)
    if rank == 0:
        print(f"1-bit payload handed to the transport ({engine.basic_optimizer.transport.name}): "
              f"{engine.basic_optimizer.transport.bytes_sent:,} bytes in {args.steps} steps")
    if args.optimizer == "ZeroOneAdam":
        return  # 0/1 Adam's replicas agree only at its synchronisation steps
    identical = replicas_identical(engine.module.parameters())
    if rank == 0:
        print(f"replicas identical: {identical}")
    if not identical:
        raise SystemExit("replicas diverged")


if __name__ == "__main__":
    main()
