"""The inference tutorial as a runnable example: a tiny T5 (or Llama) built from a config,
saved as a checkpoint, then served with ``deepspeed.init_inference`` split over every process
(AutoTP), its weights loaded with ``checkpoint=`` (the tutorial's ``ds_model`` JSON) into a model
whose parameters were never materialised whole, and greedy generation compared with the
single-process model.

    deepspeed --num_gpus 2 examples/inference/generate.py [--model t5|llama] [--int8]

(On this CPU machine ``--num_gpus 2`` starts 2 gloo processes.) The script exits non-zero unless
every rank generates the single-process model's tokens (``--int8``: the documented logits bound).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import require  # noqa: E402

require("transformers")
import transformers as tf  # noqa: E402

import deepspeed  # noqa: E402
from deepspeed.inference.checkpoint import empty_init  # noqa: E402


def build(name):
    torch.manual_seed(0)
    if name == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            decoder_start_token_id=0)).eval()
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)).eval()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["t5", "llama"], default="t5")
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    deepspeed.init_distributed(verbose=False)
    rank = deepspeed.comm.get_rank()

    reference = build(args.model)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        want_logits = reference(ids, decoder_input_ids=want[:, :4]).logits \
            if args.model == "t5" else reference(ids).logits

    # one folder per job, the same on every rank: the launcher's rendezvous port names the job
    job = os.environ.get("MASTER_PORT") or str(os.getppid())
    directory = os.path.join(tempfile.gettempdir(), f"ds_inference_example_{job}")
    if rank == 0:  # the training side: a checkpoint and the tutorial's JSON describing it
        os.makedirs(directory, exist_ok=True)
        torch.save(reference.state_dict(), os.path.join(directory, "model.pt"))
        with open(os.path.join(directory, "checkpoint.json"), "w") as handle:
            json.dump({"type": "ds_model", "version": 0.0, "checkpoints": ["model.pt"]}, handle)
    deepspeed.comm.barrier()

    with empty_init():  # parameters on the meta device: nothing materialised yet
        model = build(args.model)
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": world_size},
                                      dtype=torch.int8 if args.int8 else torch.float,
                                      checkpoint=os.path.join(directory, "checkpoint.json"))
    with torch.no_grad():
        tokens = engine.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        logits = engine(ids, decoder_input_ids=want[:, :4]).logits \
            if args.model == "t5" else engine(ids).logits
    diff = (logits - want_logits).abs().max().item() / want_logits.abs().max().item()
    same = torch.equal(tokens, want)
    weights = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    print(f"rank {rank}/{world_size}: {args.model} tp_size={world_size} "
          f"{'int8' if args.int8 else 'fp32'}, weights on this rank {weights / 1024:.0f} KiB "
          f"(peak while loading {engine.checkpoint_stats['peak_param_bytes'] / 1024:.0f} KiB), "
          f"relative logits difference {diff:.2e}, tokens equal single-process: {same}")
    deepspeed.comm.barrier()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    ok = diff <= 0.02 if args.int8 else (same and diff <= 1e-5)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
