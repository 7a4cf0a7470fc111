"""A plain Hugging Face Trainer script with a DeepSpeed config dict full of "auto" values, as the
HF docs show it; nothing in it knows which DeepSpeed implementation is installed.

    deepspeed --num_gpus 2 hf_trainer_tiny.py <output_root> z2,z3,z2_offload
    torchrun --nproc_per_node 2 hf_trainer_tiny.py <output_root> ddp

modes: ddp (no DeepSpeed: the reference), or any of z2, z3, z2_offload, trained one after the
other in this one launch (into <output_root>/<mode>: a launch is seconds of process start-up and
imports, the training a fraction of it), as a user's sweep script might. Under DeepSpeed each mode
then trains again in <output_root>/<mode>/resumed, resuming (resume_from_checkpoint=True) from a
copy of the first run's checkpoint-4. Between modes the Hugging Face DeepSpeed config is unset and
Accelerate's state reset, as HF's own DeepSpeed tests do between cases.

Each rank writes <mode dir>/losses_rank<r>.json: its own unrounded loss of every step run by
this process (the Trainer's logged loss is rounded and averaged, too coarse to compare runs).
Rank 0 also writes logits.pt (the trained model's logits on a fixed batch, computed through the
wrapped model so ZeRO-3 gathers its partitions) and model_config.json.
"""
import json
import os
import shutil
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from hf_tiny_data import RandomTokens  # noqa: E402 (next to this script)

# the deepspeed launcher adds --local_rank=N, as it does for every script
output_root, mode_list = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][:2]
ZERO = {"z2": {"stage": 2}, "z3": {"stage": 3},
        "z2_offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
modes = mode_list.split(",")
if modes != ["ddp"] and not all(mode in ZERO for mode in modes):
    sys.exit(f"unknown modes {mode_list!r}; expected ddp alone, or some of {', '.join(ZERO)}")


class RecordingTrainer(Trainer):
    """Keeps each step's exact loss on this rank (gradient accumulation is 1: a call is a step)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_losses = []

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.step_losses.append(loss.item())
        return loss


# no dropout: DDP and DeepSpeed draw random numbers in different places; with dropout the runs
# could only agree statistically
config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def deepspeed_config(mode):
    if mode == "ddp":
        return None
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "zero_optimization": ZERO[mode],
            "optimizer": {"type": "AdamW",
                          "params": {"lr": "auto", "weight_decay": "auto",
                                     "betas": "auto", "eps": "auto"}}}


def train(folder, seed, resume, ds_config):
    """One Trainer run into ``folder``; writes this rank's step losses there."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=folder, max_steps=8, per_device_train_batch_size=2, report_to=[],
        use_cpu=True, logging_steps=1, save_strategy="steps", save_steps=4, optim="adamw_torch",
        learning_rate=1e-3, weight_decay=0.01, deepspeed=ds_config)
    trainer = RecordingTrainer(model=model, args=args, train_dataset=RandomTokens(n=64))
    trainer.train(resume_from_checkpoint=True if resume else None)
    with open(os.path.join(folder, f"losses_rank{trainer.args.process_index}.json"), "w") as f:
        json.dump({"first_step": trainer.state.global_step - len(trainer.step_losses) + 1,
                   "losses": trainer.step_losses}, f)
    return trainer


def run_mode(mode):
    output_dir = os.path.join(output_root, mode)
    ds_config = deepspeed_config(mode)
    trainer = train(output_dir, seed=0, resume=False, ds_config=ds_config)
    wrapped = trainer.model_wrapped
    wrapped.eval()
    probe = RandomTokens(n=64).x[:4]  # the test rebuilds the same batch
    with torch.no_grad():
        logits = wrapped(input_ids=probe).logits
    if trainer.is_world_process_zero():
        torch.save(logits, os.path.join(output_dir, "logits.pt"))
        config.to_json_file(os.path.join(output_dir, "model_config.json"))

    if mode != "ddp":
        # resume in this process (as HF's own DeepSpeed tests do) from a copy of the step-4
        # checkpoint alone, as if the run had died after step 4; a different init seed shows
        # that the weights come from the checkpoint
        resumed = os.path.join(output_dir, "resumed")
        if trainer.is_world_process_zero():
            shutil.copytree(os.path.join(output_dir, "checkpoint-4"),
                            os.path.join(resumed, "checkpoint-4"))
        torch.distributed.barrier()
        train(resumed, seed=1, resume=True, ds_config=ds_config)


def forget_the_previous_mode():
    """What HF's DeepSpeed tests reset between cases: the process-wide DeepSpeed config that
    ``TrainingArguments(deepspeed=...)`` registers, and Accelerate's shared state."""
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    AcceleratorState._reset_state(reset_partial_state=False)


for number, mode in enumerate(modes):
    if number:
        forget_the_previous_mode()
    run_mode(mode)

if modes == ["ddp"] and torch.distributed.is_initialized():
    # plain torch leaves its gloo group to interpreter exit, where gloo's worker threads can
    # abort the process (SIGABRT, seen in a suite run); deepspeed.comm settles its groups at
    # exit itself, a plain-DDP reference has to do it by hand
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
