"""Ulysses with the engine: ZeRO-3 over the sequence x data parallel ranks, the plugin's checks,
and the clear errors of the group and registration helpers."""
import pytest
import torch

from sp_helpers import SP, tiny_llama, weighted_sp_loss

SEQ, STEPS, LR = 16, 2, 1e-2


def _samples():
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, 64, (STEPS, SP, 1, SEQ), generator=g)


def _config(sp=SP):
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "sequence_parallel_size": sp, "zero_optimization": {"stage": 3},
            "optimizer": {"type": "Adam", "params": {"lr": LR}}}


def _full_params(module):
    """Every parameter whole (ZeRO-3 shards gathered through the public API)."""
    from deepspeed.zero import GatheredParameters

    with GatheredParameters(list(module.parameters())):
        return {name: p.detach().float().clone() for name, p in module.named_parameters()}


def _train_zero3(overrides):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (UlyssesSPAttentionHF,
                                                                UlyssesSPDataLoaderAdapter)
    model = tiny_llama(**overrides)
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model, core_attn_implementation=model.config._attn_implementation,
        sequence_parallel_size=SP, micro_batch_size=1)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=_config(), mpu=mpu)
        rank, data = dist.get_rank(), _samples()
        dl = [{"input_ids": data[s, rank], "labels": data[s, rank]} for s in range(STEPS)]
        group = mpu.get_sequence_parallel_group()
        adapter = UlyssesSPDataLoaderAdapter(dl, sp_rank=mpu.get_sequence_parallel_rank(),
                                             sp_group=group, sp_world_size=SP, device="cpu")
        losses = []
        for batch in adapter:
            logits = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = model.loss_function(logits=logits, labels=None, shift_labels=batch["shift_labels"],
                                       vocab_size=model.config.vocab_size)
            loss = weighted_sp_loss(loss, batch["shift_labels"], group)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        params = _full_params(engine.module)
        engine.destroy()
        return losses, params
    finally:
        parallel_state.destroy_sequence_parallel()


# 1 kv head for 2 ranks: the kv head is replicated (sdpa runs it as GQA, eager through the
# local head ratio the wrapper hands it)
@pytest.mark.parametrize("overrides", [{}, {"num_key_value_heads": 1},
                                       {"num_key_value_heads": 1, "attn_implementation": "eager"}])
def test_zero3_with_ulysses_matches_single_process_training(dist_pool, overrides):
    model = tiny_llama(**overrides)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    want_losses = []
    data = _samples()
    for step in range(STEPS):
        for rank in range(SP):  # the adapter's order: every rank's sample of a step, rank order
            opt.zero_grad()
            loss = model(input_ids=data[step, rank], labels=data[step, rank]).loss
            loss.backward()
            opt.step()
            want_losses.append(loss.item())
    want = {n: p.detach() for n, p in model.named_parameters()}
    for losses, params in dist_pool.run(_train_zero3, world_size=SP, timeout=120,
                                        args=(overrides,)):
        assert losses == pytest.approx(want_losses, rel=1e-4)
        for name, value in want.items():
            torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5, msg=name)


def _engine_without_groups():
    import deepspeed
    model = torch.nn.Linear(4, 4)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_config())
    except ValueError as exc:
        return str(exc)
    return None


def test_config_without_sequence_groups_is_a_clear_error(dist_pool):
    for message in dist_pool.run(_engine_without_groups, world_size=SP):
        assert message is not None and "sequence_parallel_size" in message
        assert "register_with_transformers" in message and "mpu=" in message


def test_sequence_parallel_size_must_be_positive():
    from deepspeed.config import DeepSpeedConfig
    with pytest.raises(Exception, match="sequence_parallel_size"):
        DeepSpeedConfig({"train_batch_size": 1, "sequence_parallel_size": 0}, world_size=1)


def _bad_group_sizes():
    from deepspeed.sequence import parallel_state
    errors = []
    for size in (3, 0, 1.5):
        try:
            parallel_state.initialize_sequence_parallel(size)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_group_sizes_are_checked(dist_pool):
    for errors in dist_pool.run(_bad_group_sizes, world_size=SP):
        assert errors[0] == "world size 2 is not divisible by sequence_parallel_size 3"
        assert "sequence_parallel_size must be an integer >= 1, got 0" in errors[1]
        assert "got 1.5" in errors[2]


def test_heads_must_divide_by_sp():
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) is not divisible by "
                                         r"sequence_parallel_size 3"):
        UlyssesSPAttentionHF.register_with_transformers(tiny_llama(), sequence_parallel_size=3,
                                                        micro_batch_size=1)
    # 3 kv heads on 2 ranks: neither divisible nor replicable
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\) is not divisible by "
                                         r"sequence_parallel_size 2, and cannot be replicated"):
        UlyssesSPAttentionHF.register_with_transformers(
            tiny_llama(hidden_size=48, num_attention_heads=6, num_key_value_heads=3),
            sequence_parallel_size=2, micro_batch_size=1)


def test_kv_replication_rules():
    from deepspeed.sequence.ulysses_hf import kv_replication
    assert kv_replication(8, 4, 2) == 1  # kv heads divide: no copies
    assert kv_replication(4, 1, 2) == 2 and kv_replication(8, 2, 8) == 4  # fewer: replicate
    with pytest.raises(ValueError, match=r"num_key_value_heads \(2\) is not divisible by "
                                         r"sequence_parallel_size 3"):
        kv_replication(6, 2, 3)


def test_sp_of_one_changes_nothing():
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    model = tiny_llama()
    assert UlyssesSPAttentionHF.register_with_transformers(
        model, sequence_parallel_size=1, micro_batch_size=1) is None
    assert model.config._attn_implementation == "sdpa"


def _register_by_path(path):
    from transformers import LlamaForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    try:
        mpu = UlyssesSPAttentionHF.register_with_transformers(path, sequence_parallel_size=SP,
                                                              micro_batch_size=1)
        wrapper = ALL_ATTENTION_FUNCTIONS["sdpa"]
        model = LlamaForCausalLM.from_pretrained(path)
        model.train()
        with pytest.raises(NotImplementedError, match="attention mask"):
            model(input_ids=torch.ones(1, 8, dtype=torch.long),
                  attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]]))
        return (mpu is parallel_state, isinstance(wrapper, UlyssesSPAttentionHF),
                wrapper.attn is original)
    finally:
        ALL_ATTENTION_FUNCTIONS.register("sdpa", original)
        parallel_state.destroy_sequence_parallel()


def test_register_by_local_path_wraps_the_core_attention(dist_pool, tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    for result in dist_pool.run(_register_by_path, world_size=SP, args=(str(tmp_path),)):
        assert result == (True, True, True)


def test_batch_counts_sequence_parallel_groups_once():
    """A sequence-parallel group shares one sample: the batch triangle uses world / sp (the
    value Accelerate computes train_batch_size from), gradients still average over all ranks."""
    from types import SimpleNamespace
    from deepspeed.config import DeepSpeedConfig
    mpu = SimpleNamespace(get_sequence_parallel_world_size=lambda: 2,
                          get_sequence_data_parallel_world_size=lambda: 8,
                          get_data_parallel_world_size=lambda: 8)
    config = DeepSpeedConfig({"train_micro_batch_size_per_gpu": 3}, mpu)
    assert config.train_batch_size == 3 * 4
