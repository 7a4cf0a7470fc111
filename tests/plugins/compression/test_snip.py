"""snip_momentum: structured masks from momentum SNIP scores, reaching dense_ratio gradually
between schedule_offset and schedule_offset_end."""
import torch
from cp_helpers import section

from deepspeed.compression.compress import init_compression
from deepspeed.compression.scheduler import compression_scheduler


def _train(pattern, steps=12, dense_ratio=0.25, offset=2, end=10, stride=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    init_compression(model, section(sparse_pruning=(
        {"method": "snip_momentum", "block_pattern": pattern, "dense_ratio": dense_ratio,
         "schedule_offset": offset, "schedule_offset_end": end,
         "schedule_offset_stride": stride}, {})))  # no groups: every Linear
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = compression_scheduler(model)
    densities = []
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step(step)
        densities.append((model[0].weight != 0).float().mean().item())
    return model, densities


def test_block_pattern_prunes_whole_blocks_down_to_the_ratio():
    model, densities = _train("4x1")
    for layer in (model[0], model[2]):
        zero = (layer.weight == 0).reshape(layer.weight.shape[0] // 4, 4, -1)
        assert (zero.all(dim=1) == zero.any(dim=1)).all()  # a 4x1 block is all or nothing
        assert (layer.weight != 0).float().mean().item() == 0.25
    # dense until the first pruning step after the offset, then falling at each stride
    assert densities[:3] == [1.0, 1.0, 1.0]
    assert densities[3] == 1 - 0.75 * 2 / 8 and densities[5] == 1 - 0.75 * 4 / 8
    assert densities[9:] == [0.25] * 3
    assert all(a >= b for a, b in zip(densities, densities[1:]))


def test_n_of_m_pattern_keeps_n_per_group():
    model, _ = _train("2:4")
    groups = (model[0].weight != 0).reshape(32, 4, 4).sum(dim=2)
    assert (groups == 2).all()
