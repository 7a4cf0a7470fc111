"""ZeRO-3 `from_pretrained`: with a stage-3 DeepSpeed config alive (TrainingArguments(deepspeed=...)
or HfDeepSpeedConfig), transformers builds the model under `deepspeed.zero.Init` and loads the
saved weights straight into the partitions; a few Trainer steps then run on that model.

    deepspeed --num_gpus 2 hf_init_zero3.py <pretrained_dir> <output_dir> <trainingargs|hfconfig>
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

from hf_tiny_data import RandomTokens  # noqa: E402 (next to this script)
from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

import deepspeed

pretrained, output_dir, mode = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][:3]

DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
             "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


args = TrainingArguments(output_dir=output_dir, max_steps=3, per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, logging_steps=1, save_strategy="no",
                         learning_rate=1e-3,
                         deepspeed=DS_CONFIG if mode == "trainingargs" else None)
if mode == "hfconfig":
    # must stay referenced: transformers keeps only a weak reference to it
    hf_ds_config = HfDeepSpeedConfig(DS_CONFIG)
assert is_deepspeed_zero3_enabled()

model = GPT2LMHeadModel.from_pretrained(pretrained)
saved = load_file(f"{pretrained}/model.safetensors")
report = {"partitioned": [], "not_partitioned": [], "mismatch": [], "missing": []}
named = dict(model.named_parameters())
for name, param in named.items():
    ok = hasattr(param, "ds_id") and hasattr(param, "ds_tensor") and param.data.numel() == 0
    report["partitioned" if ok else "not_partitioned"].append(name)
with deepspeed.zero.GatheredParameters(list(named.values())):
    for name, param in named.items():
        key = name if name in saved else name.removeprefix("transformer.")
        if key not in saved:
            report["missing"].append(name)
        elif not torch.equal(param.data, saved[key]):
            report["mismatch"].append(name)
report["shard_sizes"] = {name: named[name].ds_tensor.numel() for name in report["partitioned"][:3]}

if mode == "trainingargs":
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
    trainer.train()
    report["losses"] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    report["zero_stage"] = trainer.model_wrapped.zero_optimization_stage()
if int(torch.distributed.get_rank()) == 0:
    print("RESULT " + json.dumps(report))
