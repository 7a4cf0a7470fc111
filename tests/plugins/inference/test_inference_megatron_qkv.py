"""Merging a Megatron tensor-parallel checkpoint's fused ``query_key_value`` (issue 36): each
rank stores its heads' rows in the layout of the checkpoint version (0: q, k, v blocks; 1: q, k,
v interleaved row by row; 2: per head), and a model computing ``q, k, v = qkv(x).chunk(3)``
over all heads must get them reordered, at ``tp_size`` 1 and, split as fused, at 2."""
import json
import os

import pytest
import torch
from torch import nn

HIDDEN, HEADS, SEQ = 16, 4, 5
LAYOUTS = {0: "bhd", 1: "hdb", 2: "hbd"}  # per-rank row axes: block, head, row within head


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_heads = HEADS  # AutoTP divides it by tp_size
        self.query_key_value = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.dense = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, self.num_heads, -1).transpose(1, 2)
                   for t in self.query_key_value(x).chunk(3, dim=-1))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(out.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(HIDDEN)
        self.self_attention = Attention()
        self.mlp = nn.ModuleDict({"dense_h_to_4h": nn.Linear(HIDDEN, 4 * HIDDEN),
                                  "dense_4h_to_h": nn.Linear(4 * HIDDEN, HIDDEN)})

    def forward(self, x):
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp["dense_4h_to_h"](nn.functional.gelu(self.mlp["dense_h_to_4h"](x)))


class Tiny(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _megatron_rank(state, version, tp, rank):
    """Rank ``rank`` of ``tp`` as Megatron saves it at checkpoint ``version``: its heads' fused
    q/k/v rows in the version's layout, column-parallel weights split along 0, row-parallel
    ones along 1, the rest replicated; nested by key path under ``model``."""
    heads = HEADS // tp
    out = {}
    for key, value in state.items():
        if "query_key_value" in key:
            rest = list(value.shape[1:])
            mine = value.reshape([3, HEADS, -1] + rest)[:, rank * heads:(rank + 1) * heads]
            order = ["bhd".index(a) for a in LAYOUTS[version]] + \
                list(range(3, 3 + len(rest)))
            value = mine.permute(order).reshape([-1] + rest)
        elif "dense_h_to_4h" in key:
            value = value.chunk(tp, 0)[rank]
        elif key.endswith("dense.weight") or key.endswith("dense_4h_to_h.weight"):
            value = value.chunk(tp, 1)[rank]
        node = out
        *path, leaf = key.split(".")
        for name in path:
            node = node.setdefault(name, {})
        node[leaf] = value.clone()
    return {"model": out, "checkpoint_version": float(version)}


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    """Per version: the descriptor of a TP2 Megatron checkpoint of ``Tiny(0)``; and the inputs
    with the unsplit model's outputs."""
    root = tmp_path_factory.mktemp("megatron")
    reference = Tiny(0)
    descriptors = {}
    for version in LAYOUTS:
        names = []
        for rank in range(2):
            name = f"v{version}/mp_rank_{rank:02d}/model_optim_rng.pt"
            os.makedirs(root / os.path.dirname(name))
            torch.save(_megatron_rank(reference.state_dict(), version, 2, rank), root / name)
            names.append(name)
        descriptor = root / f"v{version}.json"
        descriptor.write_text(json.dumps({"type": "Megatron", "version": float(version),
                                          "checkpoints": names}))
        descriptors[version] = str(descriptor)
    x = torch.randn(2, SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return descriptors, x, reference(x)


def _outputs(descriptor, x, tp, **kwargs):
    import deepspeed

    if tp > 1:
        kwargs["tensor_parallel"] = {"tp_size": tp}
    engine = deepspeed.init_inference(Tiny(seed=9), dtype=torch.float, checkpoint=descriptor,
                                      **kwargs)
    with torch.no_grad():
        return engine(x)


@pytest.mark.parametrize("version", sorted(LAYOUTS))
def test_fused_qkv_is_reordered_at_tp1(megatron, version):
    descriptors, x, want = megatron
    torch.testing.assert_close(_outputs(descriptors[version], x, 1), want, rtol=0, atol=1e-6)


def _tp2(descriptors, x, split_dir):
    return [_outputs(descriptors[v], x, 2, **({"save_mp_checkpoint_path": split_dir} if v == 2
                                              else {}))
            for v in sorted(descriptors)]


def test_fused_qkv_is_split_as_fused_at_tp2(dist_pool, megatron, tmp_path):
    """Each rank holds its heads' q, k and v rows; the split it saves
    (``save_mp_checkpoint_path``) lists the fused tensors and merges back at tp 1."""
    descriptors, x, want = megatron
    for outputs in dist_pool.run(_tp2, world_size=2, args=(descriptors, x, str(tmp_path))):
        for out in outputs:
            torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    saved = json.loads((tmp_path / "ds_inference_config.json").read_text())
    assert saved["fused_qkv"] == [f"layers.{i}.self_attention.query_key_value.{p}"
                                  for i in range(2) for p in ("weight", "bias")]
    torch.testing.assert_close(_outputs(str(tmp_path / "ds_inference_config.json"), x, 1), want,
                               rtol=0, atol=1e-5)


def test_unknown_megatron_version_is_refused(megatron, tmp_path):
    import deepspeed

    descriptors, _, _ = megatron
    descriptor = json.loads(open(descriptors[0]).read())
    descriptor.update(version=4.0, base_dir=os.path.dirname(descriptors[0]))
    with pytest.raises(ValueError, match="\"version\": 4.0 .* known: \\[0, 1, 2, 3\\]"):
        deepspeed.init_inference(Tiny(seed=9), dtype=torch.float, checkpoint=descriptor)


class PerHeadAttention(Attention):
    """BLOOM / GPT-NeoX style: the fused output viewed as (..., heads, 3, head_dim)."""

    def forward(self, x):
        batch, seq, _ = x.shape
        fused = self.query_key_value(x).view(batch, seq, self.num_heads, 3, -1)
        q, k, v = (fused[..., i, :].transpose(1, 2) for i in range(3))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(out.transpose(1, 2).reshape(batch, seq, -1))


class PerHeadTiny(Tiny):
    def __init__(self, seed):
        super().__init__(seed)
        self.config = type("Config", (), {"model_type": "bloom"})()
        for layer in self.layers:
            attention = PerHeadAttention()
            attention.load_state_dict(layer.self_attention.state_dict())
            layer.self_attention = attention


@pytest.mark.parametrize("version", [0, 2])
def test_a_per_head_model_gets_its_own_layout(version, tmp_path):
    """A model laid out per head (``model_type`` bloom) gets ``[heads, 3, head_dim]`` back,
    whatever layout the Megatron version stored; joined as ``[q; k; v]`` it would be wrong."""
    import deepspeed

    reference = PerHeadTiny(0)
    as_blocks = {k: (v.reshape([HEADS, 3, -1] + list(v.shape[1:])).transpose(0, 1)
                     .reshape(v.shape) if "query_key_value" in k else v)
                 for k, v in reference.state_dict().items()}
    names = []
    for rank in range(2):
        name = f"mp_rank_{rank:02d}/model_optim_rng.pt"
        (tmp_path / name).parent.mkdir()
        torch.save(_megatron_rank(as_blocks, version, 2, rank), tmp_path / name)
        names.append(name)
    descriptor = {"type": "Megatron", "version": float(version), "checkpoints": names,
                  "base_dir": str(tmp_path)}
    x = torch.randn(2, SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    engine = deepspeed.init_inference(PerHeadTiny(seed=9), dtype=torch.float,
                                      checkpoint=descriptor)
    with torch.no_grad():
        torch.testing.assert_close(engine(x), reference(x), rtol=0, atol=1e-6)
