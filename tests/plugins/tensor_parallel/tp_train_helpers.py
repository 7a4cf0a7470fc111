"""A tiny Llama built from a config (no downloads), its batches, and the single-process
reference the tensor-parallel runs are compared with."""
import copy
from contextlib import contextmanager

import torch

VOCAB, SEQ, MICRO = 64, 8, 2


def tiny_llama(heads=4, kv_heads=2, hidden=32, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=32,
                         attention_bias=False, mlp_bias=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def global_batches(steps, dp):
    """``steps`` global batches of ``dp * MICRO`` sequences (the same on every rank)."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, VOCAB, (dp * MICRO, SEQ), generator=gen) for _ in range(steps)]


def train_reference(model, batches, lr, clip, weight_decay=0.01):
    """AdamW on the global batches, one process: (losses, grad norms, final state dict)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses, norms = [], []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def ds_config(tp, zero_stage=0, lr=1e-2, clip=0.05, **extra):
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
              "gradient_clipping": clip, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
              "tensor_parallel": {"autotp_size": tp}}
    if zero_stage:
        config["zero_optimization"] = {"stage": zero_stage}
    config.update(extra)
    return config


@contextmanager
def registered_groups_restored():
    """``deepspeed.utils.groups``' registered unit as it was before (pool ranks are reused by
    other tests)."""
    from deepspeed.utils import groups

    previous = groups.mpu
    try:
        yield
    finally:
        groups.set_mpu(previous)


def dp_mean(value, group):
    import deepspeed.comm as dist

    tensor = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(tensor, group=group)
    return float(tensor) / dist.get_world_size(group=group)
