"""The Trainer's "auto" bridge, run the notebook way (one process, the distributed environment
set by hand as the HF docs show), checked from the engine our package builds.

    python hf_auto_config.py <output_dir>

Case "auto": every documented "auto" key is filled from TrainingArguments and the model config,
and the engine receives the filled values (prints them as JSON). Case "mismatch": explicit
values that disagree with TrainingArguments raise Transformers' documented ValueError (printed).
"""
import json
import os
import sys

os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=os.environ.get("MASTER_PORT", "9994"),
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")

from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

from hf_tiny_data import RandomTokens  # noqa: E402

output_dir = sys.argv[1]
HIDDEN = 16
AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                 "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"}}
MISMATCH = {"train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 3,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.5}},
            "zero_optimization": {"stage": 2}}


def arguments(ds_config):
    return TrainingArguments(output_dir=output_dir, per_device_train_batch_size=4,
                             gradient_accumulation_steps=3, learning_rate=1e-3, adam_beta1=0.9,
                             adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.01,
                             max_grad_norm=1.0, warmup_steps=0.1, max_steps=95, report_to=[],
                             use_cpu=True, deepspeed=ds_config)


class EngineProbe(TrainerCallback):
    """Reads the engine once the Trainer built it, then stops after one step (the config, not
    the training, is under test here)."""

    def __init__(self):
        self.seen = None

    def on_step_end(self, args, state, control, **kwargs):
        engine = trainer.model_wrapped
        zero = engine.config.section("zero_optimization")
        group = engine.basic_optimizer.param_groups[0]
        sched = engine.lr_scheduler
        self.seen = {
            "engine": type(engine).__module__ + "." + type(engine).__name__,
            "train_batch_size": engine.train_batch_size(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "gradient_clipping": engine.gradient_clipping(),
            "betas": list(group["betas"]), "eps": group["eps"],
            "weight_decay": group["weight_decay"],
            "warmup_min_lr": sched.min_lrs[0], "warmup_max_lr": sched.max_lrs[0],
            "warmup_num_steps": sched.warmup_num_steps, "total_num_steps": sched.total_num_steps,
            "reduce_bucket_size": zero.reduce_bucket_size,
            "stage3_prefetch_bucket_size": zero.prefetch_bucket_size,
            "stage3_param_persistence_threshold": zero.param_persistence_threshold}
        control.should_training_stop = True


model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=HIDDEN, n_head=2, vocab_size=64,
                                   n_positions=32))
probe = EngineProbe()
trainer = Trainer(model=model, args=arguments(AUTO), train_dataset=RandomTokens(n=64),
                  callbacks=[probe])
trainer.train()
print("AUTO", json.dumps(probe.seen))

try:
    Trainer(model=model, args=arguments(MISMATCH), train_dataset=RandomTokens(n=64)).train()
    print("MISMATCH none raised")
except ValueError as exc:
    print("MISMATCH", json.dumps(str(exc)))
