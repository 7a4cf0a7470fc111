"""``init_inference(checkpoint=...)``: a JSON descriptor listing sharded state-dict files, a
Hugging Face ``save_pretrained`` directory (sharded safetensors with an index) and a DeepSpeed
``{"module": ...}`` file load into a model built with its parameters on the meta device; on 2
ranks each rank materialises only its shards (peak real parameter bytes about half the model)
and the logits equal the single-process model; missing files are named in the error."""
import json
import os

import pytest
import torch

from inference_models import build, input_ids


def _save_sharded(model, directory):
    """The state dict in two files (alternate keys), plus the tutorial's JSON descriptor."""
    state = model.state_dict()
    keys = list(state)
    names = []
    for i, part in enumerate((keys[0::2], keys[1::2])):
        names.append(f"part_{i}.pt")
        torch.save({k: state[k].clone() for k in part}, directory / names[-1])
    descriptor = directory / "checkpoint.json"
    descriptor.write_text(json.dumps({"type": "ds_model", "version": 0.0, "checkpoints": names}))
    return str(descriptor)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("inference_ckpt")
    llama, _ = build("llama", seed=7)
    descriptor = _save_sharded(llama, directory)
    t5, _ = build("t5", seed=7)
    (directory / "t5").mkdir()
    t5.save_pretrained(directory / "t5", max_shard_size="20KB")  # several safetensors + index
    torch.save({"module": llama.state_dict()}, directory / "mp_rank_00_model_states.pt")
    return {"llama": descriptor, "t5": str(directory / "t5"),
            "ds": str(directory / "mp_rank_00_model_states.pt"), "dir": str(directory)}


def _load_split(name, checkpoint, tp_size, descriptor_dict=False):
    import transformers as tf
    import deepspeed
    from deepspeed.inference.checkpoint import empty_init
    from deepspeed.inference.sharding import parameter_bytes

    reference, _ = build(name, seed=7)
    full_bytes = parameter_bytes(reference)
    ids = input_ids()
    kwargs = {"decoder_input_ids": input_ids(length=5, seed=2)} if name == "t5" else {}
    with torch.no_grad():
        want = reference(ids, **kwargs).logits
    with empty_init():
        model, _ = build(name, seed=123)  # other random weights: all must come from the files
    assert parameter_bytes(model) == 0
    if descriptor_dict:
        with open(checkpoint) as handle:
            checkpoint = dict(json.load(handle), base_dir=str(__import__("os").path.dirname(checkpoint)))
    engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=checkpoint,
                                      tensor_parallel={"tp_size": tp_size})
    with torch.no_grad():
        got = engine(ids, **kwargs).logits
    stats = engine.checkpoint_stats
    return ((got - want).abs().max().item(), stats["peak_param_bytes"] / full_bytes,
            parameter_bytes(engine.module) / full_bytes, stats["files"])


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_tp2_loads_only_its_shards(dist_pool, saved, name):
    for diff, peak, final, files in dist_pool.run(_load_split, world_size=2,
                                                  args=(name, saved[name], 2)):
        assert diff <= 1e-5
        assert peak == final and peak <= 0.55, peak  # never more than this rank's shards
        assert files >= 2


def test_descriptor_dict_and_deepspeed_module_file_single_process(saved):
    diff, peak, _, files = _load_split("llama", saved["llama"], 1, descriptor_dict=True)
    assert diff == 0 and peak == 1.0 and files == 2
    diff, _, _, files = _load_split("llama", saved["ds"], 1)
    assert diff == 0 and files == 1


def test_base_dir_resolves_the_descriptors_relative_files(saved):
    # a descriptor dict lists part_0.pt / part_1.pt, relative, and names no base_dir of its
    # own: init_inference(base_dir=...) says where they are
    import deepspeed
    from deepspeed.inference.checkpoint import empty_init

    reference, _ = build("llama", seed=7)
    ids = input_ids()
    with open(saved["llama"]) as handle:
        descriptor = json.load(handle)
    assert "base_dir" not in descriptor and descriptor["checkpoints"] == ["part_0.pt", "part_1.pt"]
    with empty_init():
        model, _ = build("llama", seed=123)
    engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=descriptor,
                                      base_dir=saved["dir"])
    with torch.no_grad():
        assert torch.equal(engine(ids).logits, reference(ids).logits)


def test_missing_files_are_named(saved, tmp_path):
    import deepspeed

    descriptor = tmp_path / "checkpoint.json"
    descriptor.write_text(json.dumps({"type": "ds_model", "version": 0.0, "checkpoints": [
        f"{saved['dir']}/part_0.pt", "gone_1.pt", "gone_2.pt"]}))
    model, _ = build("llama")
    with pytest.raises(FileNotFoundError, match="2 of the 3 .*gone_1.pt.*gone_2.pt"):
        deepspeed.init_inference(model, dtype=torch.float, checkpoint=str(descriptor))
    with pytest.raises(ValueError, match="type 'Megatron-LM' .* not supported"):
        deepspeed.init_inference(model, dtype=torch.float,
                                 checkpoint={"type": "Megatron-LM", "checkpoints": []})


def test_a_checkpoint_lacking_a_parameter_names_it(saved):
    import deepspeed
    from deepspeed.inference.checkpoint import empty_init

    with empty_init():
        model, _ = build("llama")
    part = f"{saved['dir']}/part_0.pt"  # half of the keys only
    with pytest.raises(ValueError, match="in none of the checkpoint files.*model\\."):
        deepspeed.init_inference(model, dtype=torch.float, checkpoint=part)


def _megatron_pieces(state, tp):
    """``state`` as a Megatron-style run of ``tp`` tensor-parallel ranks would hold it: column
    -parallel projections and the vocabulary split along 0, row-parallel ones along 1, norms
    replicated; each rank's dict nested by key path under ``model``."""
    pieces = [{} for _ in range(tp)]
    for key, value in state.items():
        if any(n in key for n in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
                                  "embed_tokens", "lm_head")):
            parts = value.chunk(tp, 0)
        elif "o_proj" in key or "down_proj" in key:
            parts = value.chunk(tp, 1)
        else:
            parts = [value] * tp
        for rank, part in enumerate(parts):
            node = pieces[rank]
            *path, leaf = key.split(".")
            for name in path:
                node = node.setdefault(name, {})
            node[leaf] = part.clone()
    return [{"model": p, "checkpoint_version": 3.0} for p in pieces]


def test_megatron_checkpoint_merges_its_tensor_parallel_ranks(tmp_path):
    import os

    import deepspeed
    from deepspeed.inference.checkpoint import empty_init

    reference, _ = build("llama", seed=7)
    ids = input_ids()
    with torch.no_grad():
        want = reference(ids).logits
    names = []
    for rank, piece in enumerate(_megatron_pieces(reference.state_dict(), 2)):
        os.makedirs(tmp_path / f"mp_rank_{rank:02d}")
        names.append(f"mp_rank_{rank:02d}/model_optim_rng.pt")
        torch.save(piece, tmp_path / names[-1])
    for checkpoint, kwargs in (
            ({"type": "Megatron", "version": 0.0, "checkpoints": names, "mp_size": 2}, {}),
            ({"type": "ds_model", "checkpoints": names}, {"training_mp_size": 2})):
        with empty_init():
            model, _ = build("llama", seed=123)  # all weights must come from the files
        engine = deepspeed.init_inference(model, dtype=torch.float, base_dir=str(tmp_path),
                                          checkpoint=checkpoint, **kwargs)
        with torch.no_grad():
            assert torch.equal(engine(ids).logits, want)
        assert engine.checkpoint_stats["files"] == 2
    model, _ = build("llama")
    with pytest.raises(ValueError, match="2 files for a tensor-parallel size of \\[2, 3\\]"):
        deepspeed.init_inference(model, dtype=torch.float, base_dir=str(tmp_path),
                                 training_mp_size=3, checkpoint={"type": "Megatron",
                                                                 "checkpoints": names})
    with pytest.raises(ValueError, match="training_mp_size=2 .* no checkpoint= is given"):
        deepspeed.init_inference(model, dtype=torch.float, training_mp_size=2)


def _save_split(checkpoint, path):
    import deepspeed

    model, _ = build("llama", seed=123)
    engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=checkpoint,
                                      tensor_parallel={"tp_size": 2},
                                      save_mp_checkpoint_path=path)
    return engine.saved_checkpoint


def test_save_mp_checkpoint_path_writes_the_split_model_which_loads_at_any_tp_size(
        dist_pool, saved, tmp_path):
    import os

    descriptors = dist_pool.run(_save_split, world_size=2, args=(saved["llama"],
                                                                 str(tmp_path / "split")))
    assert descriptors == [str(tmp_path / "split" / "ds_inference_config.json")] * 2
    descriptor = json.loads((tmp_path / "split" / "ds_inference_config.json").read_text())
    assert descriptor["tp_size"] == 2 and descriptor["parallelization"] == "tp"
    assert descriptor["checkpoints"] == {"tp": ["tp_rank_00.pt", "tp_rank_01.pt"]}
    ranks = [torch.load(tmp_path / "split" / f, weights_only=True)
             for f in descriptor["checkpoints"]["tp"]]
    q = "model.layers.0.self_attn.q_proj.weight"
    assert ranks[0][q].shape[0] * 2 == build("llama")[0].state_dict()[q].shape[0]
    assert not torch.equal(ranks[0][q], ranks[1][q])
    assert sorted(os.listdir(tmp_path / "split")) == ["ds_inference_config.json",
                                                      "tp_rank_00.pt", "tp_rank_01.pt"]
    diff, *_ = _load_split("llama", descriptors[0], 1)  # merged again, at tp_size 1
    assert diff == 0


def _save_split_counting_writes(checkpoint, path):
    import deepspeed
    from deepspeed.inference import merge

    writes = []
    original = merge.atomic_torch_save
    merge.atomic_torch_save = lambda obj, file: writes.append(os.path.basename(file)) or \
        original(obj, file)
    try:
        model, _ = build("llama", seed=123)
        engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=checkpoint,
                                          save_mp_checkpoint_path=path)
    finally:
        merge.atomic_torch_save = original
    return writes, engine.saved_checkpoint


def test_save_mp_checkpoint_path_is_written_once_by_data_parallel_replicas(
        dist_pool, saved, tmp_path):
    """Two ranks without tensor parallelism are two replicas of one split (tp_size 1): rank 0
    writes it, the other replica writes nothing, and both get the descriptor."""
    results = dist_pool.run(_save_split_counting_writes, world_size=2,
                            args=(saved["llama"], str(tmp_path / "split")))
    assert [writes for writes, _ in results] == [["tp_rank_00.pt"], []]
    assert {descriptor for _, descriptor in results} == {
        str(tmp_path / "split" / "ds_inference_config.json")}
