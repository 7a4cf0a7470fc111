"""The whole long-context stack (Ulysses sp=2 x FPDT chunked attention with offload x TiledMLP x
tiled loss x activation checkpointing with cpu_checkpointing and hidden-state offload x ZeRO-3)
trains a tiny HF Llama like one process, and at 32K tokens fits a memory budget the plain model
exceeds (measured: tracked tensor bytes, not estimated)."""
import pytest
import torch

from long_context_helpers import plain_peak, shifted, train_long_context
from sp_helpers import SP, tiny_llama

LR = 1e-2
# 4 query heads, 1 kv head: the kv head is replicated for the two ranks
SMALL = {"num_key_value_heads": 1}


def test_long_context_stack_trains_like_one_process(dist_pool):
    seq, steps = 32, 2
    data = torch.randint(0, 64, (steps, 1, seq), generator=torch.Generator().manual_seed(11))
    model = tiny_llama(**SMALL)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    want = []
    for ids in data:
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        want.append(loss.item())
    for results, params, offloaded in dist_pool.run(train_long_context, world_size=SP,
                                                    timeout=180, args=(SMALL, data, 8, 3, LR)):
        assert [r[0] for r in results] == pytest.approx(want, rel=1e-4)
        # atol 1e-4: Adam's first steps move a weight by ~lr whatever its gradient's size, so a
        # near-zero gradient turns the chunked/tiled summation order's fp32 rounding into ~1e-5
        for name, value in model.named_parameters():
            torch.testing.assert_close(params[name], value.detach(), rtol=1e-4, atol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
        assert all(b > 0 for b in offloaded)  # the checkpointed hidden states went to the host
        assert all(r[2] > 0 for r in results)  # and so did the FPDT chunks


# The 32K acceptance model: MHA (kv heads = heads, so the plain model's sdpa takes torch's
# memory-efficient CPU flash path and the plain run is stopped by the budget, not by an S x S
# allocation), a vocabulary large against the hidden size as in real LLMs.
LONG = dict(vocab_size=2048, hidden_size=32, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32768)
LONG_SEQ, LONG_CHUNK, LOSS_SHARDS = 32768, 4096, 64
BUDGET = 64 * 2**20  # tracked device tensor bytes per rank


def _long_context_at_32k():
    data = torch.randint(0, 2048, (1, 1, LONG_SEQ), generator=torch.Generator().manual_seed(0))
    plain = plain_peak(LONG, data[0], BUDGET)
    results, _, offloaded = train_long_context(LONG, data, LONG_CHUNK, LOSS_SHARDS, 1e-3)
    return plain, results[0], offloaded[0]


def test_32k_tokens_fit_a_budget_the_plain_model_exceeds(dist_pool):
    for (exceeded, plain), (loss, device, host), offloaded in dist_pool.run(
            _long_context_at_32k, world_size=SP, timeout=300):
        assert exceeded and plain > BUDGET  # the plain model was stopped past the budget
        assert device <= BUDGET, f"{device / 2**20:.1f} MiB"
        assert host > 0 and offloaded > 0  # FPDT chunks and hidden states in the host pool
        assert 6.5 < loss < 8.5  # about ln(2048) for a random model: it really ran
