"""``zero.Init`` on 2 gloo ranks, against the same model built by plain torch.

A model that initialises itself with ``self.apply(self._init_weights)`` in its constructor
(Hugging Face's ``post_init``) gets that initialisation under ``zero.Init`` too: by default
(``override_module_apply: true``) ``Module.apply`` gathers the partitioned parameters first, so
the built model equals the torch one; with ``false`` the function sees the empty placeholders,
the parameters stay partitioned and keep their construction values. Also upstream's
``Init.get_dp_process_group()`` / ``get_partition_rank()``.
"""
import pytest
import torch
from torch import nn

BIAS, NORM = 0.25, 1.5  # values the custom initialisation writes, unlike torch's defaults


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)


class _Model(nn.Module):
    """Hugging Face's pattern: submodules first (partitioned as each ``__init__`` returns under
    ``zero.Init``), then ``apply`` of the custom initialisation over the whole tree, whose
    function reaches into a child as well (``head.proj``)."""

    def __init__(self, post_init=True, seen=None):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.blocks = nn.ModuleList(_Block() for _ in range(2))
        self.head = nn.Sequential(nn.Linear(6, 5))
        self.head.proj = nn.Linear(5, 3)
        self._seen = seen
        if post_init:
            self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            if self._seen is not None:
                self._seen.append(module.weight.numel())
            module.weight.data.normal_(0.0, 0.02)
            module.bias.data.fill_(BIAS)
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, 0.02)
        elif isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(NORM)
        elif isinstance(module, nn.Sequential):
            module.proj.weight.data.mul_(0.0)  # a child's parameter, reached from its parent


def _torch_model(post_init):
    torch.manual_seed(0)
    return {n: p.detach().clone() for n, p in _Model(post_init).named_parameters()}


def _build_under_init(override):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.utils.patching import live_patches

    config = {"train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 3, "override_module_apply": override}}
    seen = []
    torch.manual_seed(0)
    init = deepspeed.zero.Init(config_dict_or_path=config)
    with init:
        model = _Model(seen=seen)
    partitioned = all(p.numel() == 0 and hasattr(p, "ds_id") for p in model.parameters())
    built = {}
    for name, param in model.named_parameters():
        with deepspeed.zero.GatheredParameters(param):
            built[name] = param.detach().clone()
    group = init.get_dp_process_group()
    weight = model.blocks[0].fc.weight
    piece = weight.ds_tensor.numel()
    with deepspeed.zero.GatheredParameters(weight):
        own_piece = weight.detach().reshape(-1)[init.get_partition_rank() * piece:][:piece]
    return {
        "built": built, "partitioned": partitioned, "seen": seen,
        "apply_restored": "apply" not in " ".join(str(p) for p in live_patches()),
        "dp_ranks": dist.get_all_ranks_from_group(group), "world": dist.get_world_size(),
        "partition_rank": init.get_partition_rank(), "rank": dist.get_rank(),
        "own_piece": torch.equal(own_piece, weight.ds_tensor[:own_piece.numel()]),
    }


@pytest.mark.parametrize("override", [True, False])
def test_module_apply_during_zero_init(dist_pool, override):
    results = dist_pool.run(_build_under_init, args=(override,))
    # with the override the custom initialisation takes effect exactly as in torch; without
    # it the model keeps its construction values (the function edited empty placeholders)
    expected = _torch_model(post_init=override)
    for result in results:
        assert result["partitioned"] and result["apply_restored"]
        assert result["built"].keys() == expected.keys()
        for name, want in expected.items():
            torch.testing.assert_close(result["built"][name], want, rtol=0, atol=0, msg=name)
        linears = 2 + 2  # two blocks' fc, head[0], head.proj
        if override:  # every Linear was whole when the function saw it
            assert sorted(result["seen"]) == sorted([36, 36, 30, 15]), result["seen"]
        else:
            assert result["seen"] == [0] * linears
    assert torch.count_nonzero(results[0]["built"]["head.proj.weight"]) == (0 if override else 15)


def test_init_names_its_data_parallel_group_and_partition_rank(dist_pool):
    for result in dist_pool.run(_build_under_init, args=(True,)):
        assert result["dp_ranks"] == list(range(result["world"]))
        assert result["partition_rank"] == result["rank"]
        assert result["own_piece"]  # the shard a rank keeps is piece get_partition_rank()
