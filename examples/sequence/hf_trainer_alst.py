"""ALST through the Hugging Face Trainer: Ulysses sequence parallelism (sp=2) x ZeRO-3 x
activation checkpointing with cpu_checkpointing, on a tiny Llama built from its config, driven by
Accelerate's ``ParallelismConfig(sp_backend="deepspeed", sp_size=2)``. Nothing here calls
DeepSpeed's sequence API: Accelerate registers the Ulysses attention, passes the ``mpu`` to
``deepspeed.initialize`` and wraps the data loader; the Trainer computes the sp-weighted loss.

    deepspeed --num_gpus 2 examples/sequence/hf_trainer_alst.py <output_dir>

Every sample is the same sequence, so the run can be checked against plain single-process
training on that one sequence, whatever order the ranks draw samples in: rank 0 does that with
torch's AdamW after training and writes both loss lists to <output_dir>/alst_losses.json.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import require  # noqa: E402

require("transformers", "accelerate")
from accelerate.parallelism_config import ParallelismConfig  # noqa: E402
from accelerate.utils import DeepSpeedSequenceParallelConfig  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

output_dir = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][0]
SEQ, STEPS, LR = 32, 4, 1e-2
# 4 query heads and 1 kv head: the kv head is replicated for the two sequence-parallel ranks
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=SEQ)
SAMPLE = torch.randint(0, 64, (SEQ,), generator=torch.Generator().manual_seed(0))


class SameSequence(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"input_ids": SAMPLE, "labels": SAMPLE}


def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="sdpa"))


ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
             "zero_optimization": {"stage": 3},
             "activation_checkpointing": {"cpu_checkpointing": True},
             "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto",
                                                        "betas": "auto", "eps": "auto"}}}
args = TrainingArguments(
    output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=1, learning_rate=LR,
    lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, use_cpu=True,
    report_to=[], save_strategy="no", logging_steps=1, deepspeed=ds_config,
    gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True},
    parallelism_config=ParallelismConfig(
        sp_backend="deepspeed", sp_size=2,
        sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True,
                                                   sp_attn_implementation="sdpa")))
trainer = Trainer(model=model(), args=args, train_dataset=SameSequence())
step_losses, plain_step = [], trainer.training_step
# each call is one optimizer step (no accumulation); keep its exact, unrounded loss
trainer.training_step = lambda *a, **k: step_losses.append(plain_step(*a, **k)) or step_losses[-1]
trainer.train()
engine = trainer.model_wrapped

if int(os.environ.get("RANK", "0")) == 0:
    reference, want = model(), []
    opt = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = reference(input_ids=SAMPLE[None], labels=SAMPLE[None]).loss
        loss.backward()
        opt.step()
        want.append(loss.item())
    with open(os.path.join(output_dir, "alst_losses.json"), "w") as f:
        json.dump({"alst": [loss.item() for loss in step_losses], "single_process": want,
                   "sp_world_size": engine.mpu.get_sequence_parallel_world_size()
                   if getattr(engine, "mpu", None) else None,
                   "zero_stage": engine.zero_optimization_stage()}, f)
