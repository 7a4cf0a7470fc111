"""The full long-context stack on a tiny HF Llama, as the tests run it on each rank: Ulysses
(sp=2) with FPDT chunked attention (offloaded chunks), TiledMLP, the tiled logits loss, and
activation checkpointing with cpu_checkpointing + hidden-state offload, under a ZeRO-3 engine."""
import torch

from sp_helpers import SP, tiny_llama, weighted_sp_loss


def shifted(ids):
    return torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)


def engine_config(lr):
    return {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": SP,
            "zero_optimization": {"stage": 3},
            "activation_checkpointing": {"cpu_checkpointing": True},
            "optimizer": {"type": "Adam", "params": {"lr": lr}}}


def plain_peak(overrides, ids, budget):
    """Tracked device bytes of one plain (no sp, no tiling, no offload) forward+backward, stopped
    once it passes ``budget``: ``(exceeded, peak bytes)``."""
    from deepspeed.sequence.memory import measure
    model = tiny_llama(**overrides)
    _, tracker = measure(lambda: model(input_ids=ids, labels=ids, use_cache=False).loss.backward(),
                         budget)
    return tracker.exceeded, tracker.peak_device


def train_long_context(overrides, data, chunk, loss_shards, lr):
    """Train on ``data`` ``[steps, 1, seq]`` (one sample per step, shared by the sp group);
    returns per-step ``(loss, peak device bytes, peak host bytes)``, the full parameters and the
    bytes the hidden-state offload moved."""
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.sequence.alst import register_fpdt_attention, tile_mlps, tiled_causal_lm_loss
    from deepspeed.sequence.memory import measure
    from deepspeed.sequence.offload import get_checkpoint_hidden_states_offloading_ctx_manager
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from deepspeed.zero import GatheredParameters

    model = tiny_llama(**overrides)
    name = register_fpdt_attention(chunk, offload=True)
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model, core_attn_implementation=name, sequence_parallel_size=SP, micro_batch_size=1)
    try:
        tile_mlps(model)
        model._set_gradient_checkpointing(
            True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=engine_config(lr), mpu=mpu)
        engine.train()
        group, rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
        seq = data.shape[-1]
        part = slice(rank * seq // SP, (rank + 1) * seq // SP)
        positions = torch.arange(seq)[None]
        results, offloaded = [], []

        def step(ids):
            labels = shifted(ids)[:, part]
            with get_checkpoint_hidden_states_offloading_ctx_manager(model=model) as offload:
                hidden = engine.module.model(input_ids=ids[:, part], position_ids=positions[:, part],
                                             use_cache=False).last_hidden_state
                loss, _ = tiled_causal_lm_loss(engine.module.lm_head, hidden, labels, loss_shards)
                loss = weighted_sp_loss(loss, labels, group)
            offloaded.append(offload.offloaded_bytes)
            engine.backward(loss)
            engine.step()
            return loss.item()

        for ids in data:  # no budget here: a rank stopping inside a collective would hang the other
            loss, tracker = measure(lambda: step(ids))
            results.append((loss, tracker.peak_device, tracker.peak_host))
        with GatheredParameters(list(engine.module.parameters())):
            params = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        engine.destroy()
        return results, params, offloaded
    finally:
        parallel_state.destroy_sequence_parallel()
        dist.barrier()
