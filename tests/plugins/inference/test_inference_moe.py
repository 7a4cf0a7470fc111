"""MoE inference on 2 gloo ranks.

- Hugging Face Mixtral (stacked expert weights): AutoTP slices every expert in half and the
  logits / greedy tokens equal the single-process model.
- one ``deepspeed.moe.layer.MoE`` expert on 2 ranks (``tp_size=2``): the expert is sliced,
  the output unchanged;
- ``deepspeed.moe.layer.MoE`` layers with ``ep_size=2``: ``init_inference(moe={"ep_size": 2,
  "moe_experts": [4]}, checkpoint=...)`` loads each rank's two experts out of a full
  (``ep_size=1``) state dict, and every rank's output (its own input) equals the ``ep_size=1``
  model's; mismatched settings and a missing ``moe`` plugin are clear errors.
"""
import pytest
import torch

from inference_models import build, input_ids, split_matches


def _mixtral_tp2():
    model, _ = build("mixtral")
    experts = model.model.layers[0].mlp.experts
    full = (tuple(experts.gate_up_proj.shape), tuple(experts.down_proj.shape))
    engine, diff, same = split_matches(model, input_ids())
    return (diff, same, full, (tuple(experts.gate_up_proj.shape), tuple(experts.down_proj.shape)),
            len(engine.experts_split))


def test_mixtral_experts_sliced_over_tp2(dist_pool):
    for diff, same, full, split, count in dist_pool.run(_mixtral_tp2, world_size=2):
        assert diff <= 1e-5 and same
        assert full == ((4, 96, 32), (4, 32, 48)) and split == ((4, 48, 32), (4, 32, 24))
        assert count == 2


class MoENet(torch.nn.Module):
    """embedding -> MoE(4 experts, top-1) -> head, the tutorial's shape in miniature."""

    def __init__(self, ep_size, num_experts=4):
        super().__init__()
        from deepspeed.moe.layer import MoE

        self.embed = torch.nn.Embedding(32, 16)
        expert = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(),
                                     torch.nn.Linear(24, 16))
        self.moe = MoE(16, expert, num_experts=num_experts, ep_size=ep_size, k=1,
                       eval_capacity_factor=8.0)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids):
        x = self.embed(ids)
        return self.head(x + self.moe(x)[0])


def _moe_expert_parallel(path):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.inference.checkpoint import empty_init

    torch.manual_seed(0)
    full = MoENet(ep_size=1).eval()
    if dist.get_rank() == 0:
        torch.save(full.state_dict(), path)
    dist.barrier()
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(dist.get_rank()))
    with torch.no_grad():
        reference = full(ids)
    with empty_init():
        model = MoENet(ep_size=2)
    engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=path,
                                      moe={"ep_size": 2, "moe_experts": [4]})
    with torch.no_grad():
        out = engine(ids)
    local = len(model.moe.deepspeed_moe.experts.deepspeed_experts)
    return (out - reference).abs().max().item(), engine.moe_layers, local


def test_deepspeed_moe_expert_parallel_from_full_checkpoint(dist_pool, tmp_path):
    results = dist_pool.run(_moe_expert_parallel, world_size=2, args=(str(tmp_path / "moe.pt"),))
    for diff, layers, local in results:
        assert diff <= 1e-5 and layers == ["moe"] and local == 2


def _expert_slicing():
    import deepspeed

    torch.manual_seed(0)
    model = MoENet(ep_size=1, num_experts=1).eval()
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = model(ids)
    engine = deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2})
    expert = model.moe.deepspeed_moe.experts.deepspeed_experts[0]
    with torch.no_grad():
        diff = (engine(ids) - reference).abs().max().item()
    return (diff, engine.experts_split, tuple(expert[0].weight.shape),
            tuple(expert[2].weight.shape), tuple(model.moe.deepspeed_moe.gate.wg.weight.shape))


def test_one_expert_on_two_ranks_is_sliced(dist_pool):
    for diff, split, first, last, gate in dist_pool.run(_expert_slicing, world_size=2):
        assert diff <= 1e-5
        assert split == ["moe.deepspeed_moe.experts.deepspeed_experts.0"]
        assert first == (12, 16) and last == (16, 12)  # 24 hidden units: 12 per rank
        assert gate == (1, 16)  # the gate stays whole


def _moe_errors(case):
    import deepspeed

    try:
        if case == "ep_mismatch":
            deepspeed.init_inference(MoENet(ep_size=1), dtype=torch.float, moe={"ep_size": 2})
        elif case == "experts_mismatch":
            deepspeed.init_inference(MoENet(ep_size=2), dtype=torch.float,
                                     moe={"ep_size": 2, "moe_experts": [8]})
        elif case == "no_moe_layer":
            deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float, ep_size=2)
        elif case == "type_mismatch":
            deepspeed.init_inference(MoENet(ep_size=1), dtype=torch.float,
                                     moe={"type": "residual"})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("case, words", [
    ("ep_mismatch", ["moe.ep_size=2", "built with ep_size=1"]),
    ("experts_mismatch", ["moe_experts[0]=8", "4 experts"]),
    ("no_moe_layer", ["moe.ep_size=2", "no deepspeed.moe.layer.MoE"]),
    ("type_mismatch", ["moe.type=residual", "use_residual"]),
])
def test_moe_settings_errors(dist_pool, case, words):
    for message in dist_pool.run(_moe_errors, world_size=2, args=(case,)):
        assert message is not None and all(w in message for w in words), message


def test_without_the_moe_plugin_ep_size_is_a_clear_error(monkeypatch):
    import deepspeed
    from deepspeed.inference import moe_inference

    monkeypatch.setattr(moe_inference, "_moe_layer_class", lambda: None)
    with pytest.raises(RuntimeError, match="needs the 'moe' plugin"):
        deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float,
                                 moe={"ep_size": 2})
