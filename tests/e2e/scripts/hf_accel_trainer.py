"""A plain HF Trainer script with no DeepSpeed argument: `accelerate launch` with an Accelerate
DeepSpeed config file is what turns DeepSpeed on (through ACCELERATE_USE_DEEPSPEED and friends).

    accelerate launch --config_file <accelerate.yaml> hf_accel_trainer.py <output_dir>
"""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from hf_tiny_data import RandomTokens  # noqa: E402 (next to this script)

output_dir = sys.argv[1]


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
args = TrainingArguments(
    output_dir=output_dir, max_steps=8, per_device_train_batch_size=2, report_to=[],
    use_cpu=True, logging_steps=1, save_strategy="steps", save_steps=8, learning_rate=1e-3)
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
result = trainer.train()
engine = trainer.model_wrapped
if trainer.is_world_process_zero():
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print("RESULT " + json.dumps({
        "training_loss": result.training_loss, "losses": losses,
        "engine": type(engine).__module__ + "." + type(engine).__name__,
        "zero_stage": engine.zero_optimization_stage(), "world": trainer.args.world_size}))
