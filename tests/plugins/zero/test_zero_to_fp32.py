"""``deepspeed.zero.zero_to_fp32`` (upstream path ``deepspeed.utils.zero_to_fp32``): fp32
weights out of real multi-rank ZeRO checkpoints, in process and through the offline script that
every ZeRO save puts into the checkpoint folder, equal to the engine's own fp32 masters."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

GAS = 1
STEPS = 2


class TiedNet(torch.nn.Module):
    """Odd sizes (padding under 2 and 3 ranks), a frozen layer used in forward, an output head
    tied to the embedding, a LayerNorm and a buffer: every kind of entry a state dict holds."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 7)
        self.frozen = torch.nn.Linear(7, 7)
        self.hidden = torch.nn.Linear(7, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.proj = torch.nn.Linear(13, 7)
        self.head = torch.nn.Linear(7, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 7))
        self.frozen.requires_grad_(False)

    def forward(self, tokens):
        h = self.frozen(self.embed(tokens)) * self.scale
        return self.head(self.proj(torch.tanh(self.norm(self.hidden(h)))))


def _config(stage, zero):
    zero = dict({"stage": stage}, **zero)
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": zero}


def _save_and_gather(stage, save_dir, zero):
    """Train, save, and return (on every rank) the engine's gathered fp32 masters."""
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.utils import safe_get_full_fp32_param

    torch.manual_seed(0)
    model = TiedNet()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=_config(stage, zero))
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(STEPS * GAS):
        tokens = torch.randint(0, 11, (2, 5), generator=g)
        logits = engine(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1))
        engine.backward(loss)
        engine.step()
    masters = {name: safe_get_full_fp32_param(p).clone()
               for name, p in engine.module.named_parameters()}
    engine.save_checkpoint(save_dir)
    return masters


# ------------------------------------------------------------------------- fixtures
_CASES = {}
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FROZEN = ("frozen.weight", "frozen.bias")


def _persistent_frozen(stage):
    """Stage 3 with the frozen layer (49 elements) kept whole on every rank; the trained
    matrices (77, 91) are still sharded."""
    return {"stage3_param_persistence_threshold": 50} if stage == 3 else {}


@pytest.fixture
def saved(dist_pool, tmp_path_factory):
    """(save_dir, the engine's fp32 masters) for a (world, stage), built once per session."""

    def get(world, stage, zero=None):
        key = (world, stage, tuple(sorted((zero or {}).items())))
        if key not in _CASES:
            save_dir = str(tmp_path_factory.mktemp(f"zero{stage}_w{world}"))
            masters = dist_pool.run(_save_and_gather, world_size=world,
                                    args=(stage, save_dir, zero or _persistent_frozen(stage)))
            _CASES[key] = save_dir, masters[0]
        return _CASES[key]

    return get


def _expected(masters):
    """What the converted dict must be: the model's keys in order, trained and frozen parameters
    from the engine's masters, the buffer as built."""
    reference = TiedNet().state_dict()
    out = {}
    for key, value in reference.items():
        out[key] = masters["embed.weight" if key == "head.weight" else key] \
            if key != "scale" else value
    return list(reference), out


def _assert_equal_dicts(got, want):
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == torch.float32, key
        assert torch.equal(got[key], value), key


def _script_env():
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run_script(script, *args, cwd=None):
    done = subprocess.run([sys.executable, script, *args], cwd=cwd, env=_script_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# Runs argv[1] as __main__ with `deepspeed` made unimportable (a None entry in sys.modules is
# what an uninstalled package looks like to `import` and `importlib.util.find_spec`).
_WITHOUT_DEEPSPEED = """
import runpy, sys
sys.modules["deepspeed"] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _script_source():
    import deepspeed.zero.zero_to_fp32 as z2f

    return z2f.__file__


# ------------------------------------------------------------------------- in process
@pytest.mark.parametrize("world,stage", [(2, 1), (3, 1), (2, 2), (3, 2), (2, 3), (3, 3)])
def test_state_dict_is_the_engines_fp32_masters(saved, world, stage):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    save_dir, masters = saved(world, stage)
    keys, want = _expected(masters)
    got = get_fp32_state_dict_from_zero_checkpoint(save_dir)
    _assert_equal_dicts(got, want)
    assert list(got) == keys
    assert got["head.weight"] is got["embed.weight"]  # tied weights stay one tensor
    assert not torch.equal(got["proj.weight"], TiedNet().proj.weight)  # training happened


def test_load_into_model_and_lazy_mode(saved):
    from deepspeed.utils.zero_to_fp32 import (LazyTensor,
                                              get_fp32_state_dict_from_zero_checkpoint,
                                              load_state_dict_from_zero_checkpoint)

    save_dir, masters = saved(2, 3)
    _, want = _expected(masters)
    model = TiedNet()
    assert load_state_dict_from_zero_checkpoint(model, save_dir, tag="global_step2") is model
    _assert_equal_dicts(model.state_dict(), want)
    assert model.head.weight is model.embed.weight

    lazy = get_fp32_state_dict_from_zero_checkpoint(save_dir, lazy_mode=True)
    assert list(lazy) == list(want)
    assert all(isinstance(v, LazyTensor) for v in lazy.values())
    assert lazy["proj.weight"].shape == (7, 13)
    _assert_equal_dicts({k: v.contiguous() for k, v in lazy.items()}, want)


def test_exclude_frozen_parameters_drops_them(saved):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    save_dir, masters = saved(2, 2)
    _, want = _expected(masters)
    got = get_fp32_state_dict_from_zero_checkpoint(save_dir, exclude_frozen_parameters=True)
    _assert_equal_dicts(got, {k: v for k, v in want.items() if k not in FROZEN})


def test_zero3_frozen_shards_are_reassembled(saved):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    save_dir, masters = saved(3, 3, {"stage3_param_persistence_threshold": 0})
    _, want = _expected(masters)
    _assert_equal_dicts(get_fp32_state_dict_from_zero_checkpoint(save_dir), want)


# ------------------------------------------------------------------------- the script
def test_save_puts_the_script_into_the_folder_and_it_runs_without_deepspeed(saved, tmp_path):
    save_dir, masters = saved(2, 2)
    _, want = _expected(masters)
    script = os.path.join(save_dir, "zero_to_fp32.py")
    assert os.access(script, os.X_OK)
    with open(script, "rb") as copied, open(_script_source(), "rb") as source:
        assert copied.read() == source.read()
    # the folder moved elsewhere, converted where DeepSpeed cannot be imported (old form)
    moved = tmp_path / "moved"
    shutil.copytree(save_dir, moved)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_DEEPSPEED, "zero_to_fp32.py", ".",
                           "pytorch_model.bin"], cwd=moved, env=_script_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    got = torch.load(moved / "pytorch_model.bin", weights_only=True)
    _assert_equal_dicts(got, want)
    assert got["head.weight"].data_ptr() == got["embed.weight"].data_ptr()


def test_upstream_paths_are_the_plugin_module():
    """``deepspeed.utils.zero_to_fp32`` re-exports the plugin's module; the layout arithmetic
    of the plugin and of the script is one function."""
    import deepspeed.utils.zero_to_fp32 as upstream
    import deepspeed.zero.zero_to_fp32 as z2f
    from deepspeed.zero import checkpoint_layout

    for name in upstream.__all__:
        assert getattr(upstream, name) is getattr(z2f, name), name
    assert checkpoint_layout.partition_ranges is z2f.partition_ranges
    done = subprocess.run([sys.executable, "-m", "deepspeed.utils.zero_to_fp32", "--help"],
                          env=_script_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "zero_to_fp32.py" in done.stdout, done.stderr


def test_script_new_form_sharded_safetensors(saved, tmp_path):
    import json

    from safetensors.torch import load_file

    save_dir, masters = saved(3, 3)
    _, want = _expected(masters)
    out = tmp_path / "hf"
    # run from the installed package folder: its modules must not shadow top-level ones
    _run_script(_script_source(), save_dir, str(out), "--safe_serialization", "-t",
                "global_step2", "--max_shard_size", "1KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(os.listdir(out)) == sorted(files + ["model.safetensors.index.json"])
    got = {}
    for name in files:
        got.update(load_file(str(out / name)))
    assert set(index["weight_map"]) == set(want)
    _assert_equal_dicts({k: got[k] for k in want}, want)

    # the unsharded form through the same command line, in this process: the run above has
    # shown the script works as a program (a second interpreter costs ~3 CPU s)
    from deepspeed.zero.zero_to_fp32 import main

    assert main([save_dir, str(tmp_path / "one"), "--safe_serialization"]) == 0
    assert os.listdir(tmp_path / "one") == ["model.safetensors"]
    whole = load_file(str(tmp_path / "one" / "model.safetensors"))
    _assert_equal_dicts({k: whole[k] for k in want}, want)


def test_convert_to_bin_shards_and_single_files(saved, tmp_path):
    import json

    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    save_dir, masters = saved(2, 1)
    _, want = _expected(masters)
    written = convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path / "bins",
                                                         max_shard_size=400)
    index = json.loads((tmp_path / "bins" / "pytorch_model.bin.index.json").read_text())
    assert written[-1].endswith("pytorch_model.bin.index.json") and len(written) > 2
    got = {}
    for name in sorted(set(index["weight_map"].values())):
        got.update(torch.load(tmp_path / "bins" / name, weights_only=True))
    _assert_equal_dicts({k: got[k] for k in want}, want)

    convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path / "a.safetensors",
                                               exclude_frozen_parameters=True)
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "a.safetensors"))) == set(want) - set(FROZEN)
    with pytest.raises(ValueError, match="not a .safetensors file"):
        convert_zero_checkpoint_to_fp32_state_dict(save_dir, tmp_path / "a.bin",
                                                   safe_serialization=True)


def test_progress_bars_on_a_terminal_only(saved, tmp_path, monkeypatch):
    """The rank files read and the shards written, as bars on a terminal; silent elsewhere."""
    import io

    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    save_dir, _ = saved(2, 1)
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        written = convert_zero_checkpoint_to_fp32_state_dict(
            save_dir, tmp_path / f"bins_{drawn}", max_shard_size=400)
        text = stream.getvalue()
        shards = len(written) - 1  # and the index
        assert ("reading ZeRO partitions" in text
                and "writing shards: 100%" in text and f"{shards}/{shards}" in text) == drawn
        assert drawn or text == ""


# ------------------------------------------------------------------------- errors
def test_errors_name_what_is_wrong(saved, tmp_path):
    from deepspeed.utils.zero_to_fp32 import (get_fp32_state_dict_from_zero_checkpoint,
                                              parse_size)

    save_dir, _ = saved(2, 1)
    with pytest.raises(ValueError, match=f"Unable to find 'latest' file at {tmp_path}"):
        get_fp32_state_dict_from_zero_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="global_step99"):
        get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="global_step99")

    broken = tmp_path / "broken"
    shutil.copytree(save_dir, broken)
    os.remove(broken / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError, match="1 ZeRO optimizer files.*partition_count=2"):
        get_fp32_state_dict_from_zero_checkpoint(broken)

    assert parse_size("5GB") == 5 * 10**9 and parse_size("1KiB") == 1024
    with pytest.raises(ValueError, match="'lots'"):
        parse_size("lots")
