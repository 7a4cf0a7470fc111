"""A plain Hugging Face Trainer script whose DeepSpeed config asks for AutoTP training
(``"tensor_parallel": {"autotp_size": 2}``, ZeRO-1, "auto" batch values), as the HF docs show it.

    deepspeed --num_gpus 2 hf_trainer_autotp.py <output_dir>
    python hf_trainer_autotp.py <output_dir> reference     (one process, no DeepSpeed)

Trains a tiny Llama (built from a config) for 4 steps, saves it with ``trainer.save_model``
(gathered from the tensor-parallel shards), and then rank 0 reloads the saved folder with
``from_pretrained`` and writes <output_dir>/result.json: the per-rank step losses, the shapes
of the module the engine trains (split) and of the reloaded one, and the largest difference
between the trained model's logits (run through the engine, on every rank) and the reloaded
model's. The reference run writes its losses only: with a tensor-parallel group of 2 and
no data parallelism both ranks see the batches the single process sees.
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

# the random token dataset of the HF end-to-end scripts
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3,
                                "e2e", "scripts"))
from hf_tiny_data import RandomTokens  # noqa: E402

argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
output_dir, reference = argv[0], argv[1:] == ["reference"]


class RecordingTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_losses = []

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.step_losses.append(loss.item())
        return loss


config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
ds_config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
             "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
             "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2},
             "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto",
                                                        "betas": "auto", "eps": "auto"}}}
torch.manual_seed(0)
model = LlamaForCausalLM(config)
args = TrainingArguments(output_dir=output_dir, max_steps=4, per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, logging_steps=1, save_strategy="no",
                         learning_rate=1e-3, deepspeed=None if reference else ds_config)
trainer = RecordingTrainer(model=model, args=args, train_dataset=RandomTokens())
trainer.train()
if reference:
    with open(os.path.join(output_dir, "result.json"), "w") as f:
        json.dump({"losses": [trainer.step_losses]}, f)
    sys.exit(0)
final = os.path.join(output_dir, "final")
trainer.save_model(final)

engine = trainer.model_wrapped
engine.eval()
probe = RandomTokens().x[:4]
with torch.no_grad():
    trained_logits = engine(input_ids=probe).logits
losses = [None] * torch.distributed.get_world_size()
torch.distributed.all_gather_object(losses, trainer.step_losses)
if trainer.is_world_process_zero():
    reloaded = LlamaForCausalLM.from_pretrained(final).float().eval()
    with torch.no_grad():
        reloaded_logits = reloaded(input_ids=probe).logits
    trained_q = engine.module.model.layers[0].self_attn.q_proj.weight.shape
    with open(os.path.join(output_dir, "result.json"), "w") as f:
        json.dump({"losses": losses, "trained_q_proj": list(trained_q),
                   "reloaded_q_proj": list(reloaded.model.layers[0].self_attn.q_proj.weight.shape),
                   "max_logit_diff": float((trained_logits - reloaded_logits).abs().max()),
                   "tp_size": trainer.get_tp_size()}, f)
