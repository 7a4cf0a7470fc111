"""Saving and inference of an HF model under ZeRO-3 through the Trainer, on 2 ranks:

    deepspeed --num_gpus 2 hf_zero3_save_and_inference.py <output_dir>

In one process per rank, three Trainers run one after another on the same tiny GPT2 recipe:

- gather/: ZeRO-3 with stage3_gather_16bit_weights_on_model_save true, fp32. Trains 3 steps,
  then `save_model(gather/saved)`, `evaluate()` on an eval set the ranks split between them,
  `generate(synced_gpus=True)` with a different prompt and length per rank, and the wrapped
  model's logits on a fixed batch (rank 0 writes logits.pt).
- nogather/: the same with the flag false, then `save_model(nogather/saved)`.
- bf16/: ZeRO-3 with bf16=True and "bf16": {"enabled": "auto"}; its step-2 checkpoint is what the
  test inspects.

Each rank writes result_rank<r>.json (eval metrics, prompt, generated ids). The weights are
compared by the test process, which has no DeepSpeed world.
"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from hf_tiny_data import RandomTokens  # noqa: E402 (next to this script)

output_dir = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][0]

config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    bos_token_id=0, eos_token_id=63, pad_token_id=0)


def ds_config(gather, bf16=False):
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto",
           "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": gather},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto",
                                                     "betas": "auto", "eps": "auto"}}}
    if bf16:
        cfg["bf16"] = {"enabled": "auto"}
    return cfg


def trainer_for(folder, ds, steps, bf16=False, eval_dataset=None):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=folder, max_steps=steps, per_device_train_batch_size=2,
        per_device_eval_batch_size=2, report_to=[], use_cpu=True, logging_steps=1,
        save_strategy="steps", save_steps=2, optim="adamw_torch", learning_rate=1e-2,
        bf16=bf16, deepspeed=ds)
    return Trainer(model=model, args=args, train_dataset=RandomTokens(n=64),
                   eval_dataset=eval_dataset)


def dump(folder, rank, record):
    with open(os.path.join(folder, f"result_rank{rank}.json"), "w") as f:
        json.dump(record, f)


# --- gather: save_model with full weights, evaluate, generate --------------------------------
folder = os.path.join(output_dir, "gather")
eval_set = RandomTokens(n=8, seq=16)
eval_set.x = RandomTokens(n=64).x[-8:] ^ 5  # samples the model did not train on
trainer = trainer_for(folder, ds_config(True), steps=3, eval_dataset=eval_set)
trainer.train()
trainer.save_model(os.path.join(folder, "saved"))
seen = []  # the eval samples this rank's forwards got: the ranks must split the eval set
hook = trainer.model.register_forward_pre_hook(
    lambda module, args, kwargs: seen.extend(kwargs["input_ids"].tolist()), with_kwargs=True)
metrics = trainer.evaluate()
hook.remove()
rank = trainer.args.process_index
wrapped = trainer.model_wrapped
wrapped.eval()
# different prompt lengths and budgets per rank: rank 0 stops generating steps first and must
# keep joining the gathers of rank 1's forwards (synced_gpus) or the job hangs
prompt = RandomTokens(n=64).x[10 + rank, :3 + 2 * rank].unsqueeze(0)
max_new = 3 if rank == 0 else 7
with torch.no_grad():
    generated = trainer.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=max_new, do_sample=False,
                                       synced_gpus=True)
    logits = wrapped(input_ids=RandomTokens(n=64).x[:4]).logits
if trainer.is_world_process_zero():
    torch.save(logits, os.path.join(folder, "logits.pt"))
    config.to_json_file(os.path.join(output_dir, "model_config.json"))
dump(folder, rank, {"metrics": metrics, "eval_inputs": seen, "prompt": prompt[0].tolist(),
                    "max_new_tokens": max_new, "generated": generated[0].tolist()})
torch.distributed.barrier()

# --- nogather: the flag off -------------------------------------------------------------------
folder = os.path.join(output_dir, "nogather")
trainer = trainer_for(folder, ds_config(False), steps=1)
trainer.train()
trainer.save_model(os.path.join(folder, "saved"))
torch.distributed.barrier()

# --- bf16 --------------------------------------------------------------------------------------
folder = os.path.join(output_dir, "bf16")
trainer = trainer_for(folder, ds_config(True, bf16=True), steps=2, bf16=True)
trainer.train()
torch.distributed.barrier()
if trainer.is_world_process_zero():
    print("RESULT done")
