"""Partial optimizer offload (``offload_optimizer.ratio``, ZeRO-3) on 2 gloo ranks: about that
fraction of the optimizer state (fp32 masters and Adam moments, measured from the tensors the
two optimizers hold) sits on the offload device, the rest where it was, and training equals
full offload exactly."""
import pytest
import torch

from zero_models import ds_config, make_model, param_groups, reference, train

STEPS, GAS = 3, 2


def _state_bytes(optimizer, chunks):
    """Bytes of the masters in ``chunks`` and of their tensors in ``optimizer.state``, and the
    device types they sit on."""
    total, devices = 0, set()
    for chunk in chunks:
        tensors = [chunk.data] + [v for v in optimizer.state.get(chunk, {}).values()
                                  if torch.is_tensor(v) and v.dim() > 0]
        for tensor in tensors:
            total += tensor.numel() * tensor.element_size()
            devices.add(tensor.device.type)
    return total, devices


def _run(ratio, device, nvme_path=None):
    import deepspeed

    offload = {"device": device, "ratio": ratio}
    if nvme_path is not None:
        offload["nvme_path"] = nvme_path
    model = make_model()
    engine, zero, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model),
        config=ds_config(3, GAS, offload_optimizer=offload, sub_group_size=16,
                         stage3_param_persistence_threshold=0))
    params = train(engine, STEPS, GAS)
    offloaded, off_devices = _state_bytes(zero.optimizer, zero.offloaded_chunks)
    resident, res_devices = (0, set()) if zero.device_optimizer is None else \
        _state_bytes(zero.device_optimizer, zero.resident_chunks)
    swapped = zero.swapper.swapped_bytes() if zero.swapper is not None else None
    engine.destroy()
    return {"params": params, "offloaded": offloaded, "resident": resident,
            "off_devices": off_devices, "res_devices": res_devices, "engine": engine.device.type,
            "swapped": swapped}


def test_half_the_optimizer_state_is_offloaded_and_training_equals_full_offload(dist_pool):
    full = dist_pool.run(_run, world_size=2, args=(1.0, "cpu"))
    half = dist_pool.run(_run, world_size=2, args=(0.5, "cpu"))
    expected = reference(STEPS, GAS, 2)
    for whole, part in zip(full, half):
        assert whole["resident"] == 0 and whole["offloaded"] > 0
        share = part["offloaded"] / (part["offloaded"] + part["resident"])
        assert abs(share - 0.5) < 0.02, share  # measured: half the bytes on the offload device
        assert part["offloaded"] + part["resident"] == whole["offloaded"]
        assert part["off_devices"] == {"cpu"} and part["res_devices"] == {part["engine"]}
        for name, value in whole["params"].items():
            assert torch.equal(part["params"][name], value), name  # same optimizer, same math
            torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6)


def test_partial_nvme_offload_swaps_only_its_share(dist_pool, tmp_path):
    paths = [str(tmp_path / "full"), str(tmp_path / "part")]
    for path in paths:
        (tmp_path / path).mkdir()
    full = dist_pool.run(_run, world_size=2, args=(1.0, "nvme", paths[0]))
    part = dist_pool.run(_run, world_size=2, args=(0.25, "nvme", paths[1]))
    for whole, quarter in zip(full, part):
        # between steps the offloaded share is on disk only, the rest in memory
        assert whole["offloaded"] == quarter["offloaded"] == 0 and whole["resident"] == 0
        assert quarter["swapped"] + quarter["resident"] == whole["swapped"]
        share = quarter["swapped"] / whole["swapped"]
        assert abs(share - 0.25) < 0.02, share
        for name, value in whole["params"].items():
            assert torch.equal(quarter["params"][name], value), name


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_the_cut_keeps_everything_in_one_place_at_the_ends(ratio):
    from deepspeed.zero.offload.partial import split_partition

    pieces = split_partition(torch.arange(10.0), ratio, sub_group_size=4)
    assert [p.numel() for p, _ in pieces] == [4, 4, 2]
    assert {offloaded for _, offloaded in pieces} == {bool(ratio)}
