"""A tiny Llama under Ulysses (sp=2) gives the unsharded loss and gradients."""
import pytest
import torch

from sp_helpers import SP, tiny_llama, weighted_sp_loss

SEQ = 16


def _samples():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (SP, 1, SEQ), generator=g)
    labels = ids.clone()
    labels[0, :, :5] = -100  # an SFT prompt: rank 0's shard of sample 0 has fewer good tokens
    return ids, labels


def _sp_loss_and_grads():
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (UlyssesSPAttentionHF,
                                                                UlyssesSPDataLoaderAdapter)
    model = tiny_llama()
    mpu = UlyssesSPAttentionHF.register_with_transformers(model, sequence_parallel_size=SP,
                                                          micro_batch_size=1, seq_length=SEQ)
    try:
        assert model.config._attn_implementation == "ulysses"
        rank = dist.get_rank()
        ids, labels = _samples()
        dl = [{"input_ids": ids[rank], "labels": labels[rank]}]
        adapter = UlyssesSPDataLoaderAdapter(dl, sp_rank=mpu.get_sequence_parallel_rank(),
                                             sp_group=mpu.get_sequence_parallel_group(),
                                             sp_world_size=mpu.get_sequence_parallel_world_size(),
                                             device="cpu")
        results = []
        for batch in adapter:
            model.zero_grad()
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = model.loss_function(logits=logits, labels=None, shift_labels=batch["shift_labels"],
                                       vocab_size=model.config.vocab_size)
            loss = weighted_sp_loss(loss, batch["shift_labels"], mpu.get_sequence_parallel_group())
            loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            for g in grads.values():  # each rank holds the gradient of its own tokens' paths
                dist.all_reduce(g, group=mpu.get_sequence_parallel_group())
                g /= SP  # the differentiable all_gather counts the loss once per rank
            results.append((loss.item(), grads))
        return results
    finally:
        parallel_state.destroy_sequence_parallel()


def test_sp_loss_and_gradients_match_unsharded_model(dist_pool):
    ids, labels = _samples()
    expected = []
    for i in range(SP):
        model = tiny_llama()
        loss = model(input_ids=ids[i], labels=labels[i]).loss
        loss.backward()
        expected.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    for rank_results in dist_pool.run(_sp_loss_and_grads, world_size=SP):
        assert len(rank_results) == SP
        for (loss, grads), (want_loss, want_grads) in zip(rank_results, expected):
            assert loss == pytest.approx(want_loss, rel=1e-5)
            for name, want in want_grads.items():
                torch.testing.assert_close(grads[name], want, rtol=1e-4, atol=1e-5, msg=name)
