"""A plain Hugging Face Trainer script with a DeepSpeed config dict full of "auto" values, as the
HF docs show it; nothing in it knows which DeepSpeed implementation is installed.

    deepspeed --num_gpus 2 hf_trainer_tiny.py <output_dir> <zero stage>
"""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

# the deepspeed launcher adds --local_rank=N, as it does for every script
output_dir, stage = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][:2]
stage = int(stage)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n=32, seq=16):
        self.x = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
args = TrainingArguments(
    output_dir=output_dir, max_steps=4, per_device_train_batch_size=2, report_to=[],
    use_cpu=True, logging_steps=1, save_strategy="steps", save_steps=4,
    deepspeed={"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
               "gradient_clipping": "auto", "zero_optimization": {"stage": stage},
               "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}})
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
result = trainer.train()
trainer.save_model(f"{output_dir}/final")
if trainer.is_world_process_zero():
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print("RESULT " + json.dumps({"training_loss": result.training_loss, "losses": losses}))
