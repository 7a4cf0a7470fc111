"""ZeRO stage 3 on 2 and 3 gloo ranks: awkward models, memory, communication, saving, inference."""
import pytest
import torch
import torch.nn.functional as F

from tiny_models import mlp
from zero_models import MICRO, assert_offloaded, assert_on_engine_device, full_params, placement

LR = 1e-2
STEPS = 3


class TiedNet(torch.nn.Module):
    """A tied LM head read as another module's attribute, and a block called twice."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.block = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, idx):
        h = self.embed(idx)
        h = torch.tanh(self.block(h))
        h = torch.tanh(self.block(h))
        return F.linear(self.norm(h), self.embed.weight)


def _tied_model():
    torch.manual_seed(0)
    return TiedNet()


def _tokens(steps, world):
    g = torch.Generator().manual_seed(3)
    n = steps * MICRO * world
    return torch.randint(0, 11, (n, 5), generator=g), torch.randint(0, 11, (n, 5), generator=g)


def _tied_loss(model, idx, target):
    return F.cross_entropy(model(idx).reshape(-1, 11), target.reshape(-1))


def _tied_reference(world):
    model = _tied_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    idx, target = _tokens(STEPS, world)
    size = MICRO * world
    for s in range(STEPS):
        _tied_loss(model, idx[s * size:(s + 1) * size], target[s * size:(s + 1) * size]).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_tied(zero):
    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 0},
                                        **zero)}
    engine, *_ = deepspeed.initialize(model=_tied_model(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    idx, target = _tokens(STEPS, world)
    for s in range(STEPS):
        start = s * MICRO * world + rank * MICRO
        engine.backward(_tied_loss(engine, idx[start:start + MICRO], target[start:start + MICRO]))
        engine.step()
    placeholders = all(p.numel() == 0 for p in engine.module.parameters())
    return full_params(engine.module), placeholders, engine


def _train_tied_and_place(zero):
    """``_train_tied``, reporting where the masters and the parameter shards live."""
    params, placeholders, engine = _train_tied(zero)
    shards = {p.ds_tensor.device.type for p in engine.module.parameters()}
    return params, placeholders, placement(engine), shards


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("zero", [{}, {"offload_param": {"device": "cpu"},
                                       "offload_optimizer": {"device": "cpu"}}],
                         ids=["plain", "cpu-offload"])
def test_tied_weight_and_module_called_twice(dist_pool, world, zero):
    expected = _tied_reference(world)
    for params, placeholders, where, shards in dist_pool.run(_train_tied_and_place,
                                                             world_size=world, args=(zero,)):
        assert placeholders  # between steps every parameter is only a shard
        if zero:  # offload_param too: the parameter shards wait on the host
            assert_offloaded(where, pinned=False, params_offloaded=True)
            assert shards == {"cpu"}
        else:
            assert_on_engine_device(where)
            assert shards == {where["engine"]}
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


def _mlp():
    return mlp(9, 14, 3)


def _comm_per_step():
    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=_mlp(), config=config)
    x = torch.randn(MICRO, 9)
    engine.backward(engine(x).pow(2).mean())
    engine.step()  # the first step records the module trace
    records = []
    dist.add_comm_observer(records.append)
    try:
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    finally:
        dist.remove_comm_observer(records.append)
    by_op = {}
    for record in records:
        by_op[record.op] = by_op.get(record.op, 0) + record.size_bytes
    return sum(p.ds_numel for p in engine.module.parameters()), dist.get_world_size(), by_op


def test_a_step_moves_two_all_gathers_and_one_reduce_scatter(dist_pool):
    total, world, by_op = dist_pool.run(_comm_per_step, world_size=2)[0]
    gathered = by_op.pop("all_gather_into_tensor") / 4 * (world - 1)  # fp32 elements moved
    reduced = by_op.pop("reduce_scatter_tensor") / 4 * (world - 1)
    per_param_padding = 4 * world  # 4 parameters, each padded to a multiple of N
    assert abs(gathered - 2 * total * (world - 1) / world) <= per_param_padding
    assert abs(reduced - total * (world - 1) / world) <= per_param_padding
    assert set(by_op) <= {"all_reduce"} and by_op.get("all_reduce", 0) <= 16


def _persistence():
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100}}
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(16, 16), config=config)
    weight, bias = engine.module.weight, engine.module.bias
    before = (weight.numel(), bias.numel())
    x = torch.randn(MICRO, 16)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    return (weight.ds_persist, weight.numel(), weight.ds_tensor.numel(), tuple(weight.ds_shape),
            bias.ds_persist, bias.numel(), before)


def test_small_parameters_persist(dist_pool):
    # persistence is applied when the engine first gathers: until then nothing is whole
    for result in dist_pool.run(_persistence):
        assert result == (False, 0, 128, (16, 16), True, 16, (0, 0))


def _return_freed_memory_to_the_os():
    """glibc keeps freed heap memory and raises its mmap threshold after large frees, so RSS
    would count tensors long gone; a fixed threshold makes every large tensor its own mapping,
    returned on free, and RSS then measures what is alive."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_mmap_threshold = -3
    libc.mallopt(m_mmap_threshold, 128 * 1024)
    libc.malloc_trim(0)


def _build_under_init(layers, width):
    import os
    import threading
    import time

    import psutil

    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    torch.manual_seed(100 + dist.get_rank())  # rank 0's initial values must win
    _return_freed_memory_to_the_os()
    with deepspeed.zero.Init(config_dict_or_path=config):  # one-time costs (gloo buffers) first
        torch.nn.Linear(width, width, bias=False)
    process = psutil.Process(os.getpid())
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                      for _ in range(layers)])
    done.set()
    sampler.join()
    grown = max(peak[0], process.memory_info().rss) - before
    resident = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in model.parameters())
    full_bytes = sum(p.ds_numel * 4 for p in model.parameters())
    shapes_ok = all(p.numel() == 0 and p.ds_tensor.numel() == -(-p.ds_numel // 2)
                    for p in model.parameters())
    first = full_params(model)["0.weight"]
    engine, *_ = deepspeed.initialize(model=model, config=config)
    x = torch.randn(MICRO, width)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    return grown, resident, full_bytes, shapes_ok, first


def test_zero_init_builds_a_model_no_rank_could_hold_whole(dist_pool):
    results = dist_pool.run(_build_under_init, args=(16, 1024), timeout=120)
    for grown, resident, full_bytes, shapes_ok, first in results:
        assert shapes_ok
        assert resident == full_bytes // 2
        # the whole model (67 MB) never existed in one process: peak RSS growth while building
        # is the half this rank keeps plus about one layer in flight
        assert grown < 0.75 * full_bytes, (grown, full_bytes)
    torch.testing.assert_close(results[0][4], results[1][4], rtol=0, atol=0)


def _save_and_reload(tmp, gather_flag):
    import os

    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_gather_16bit_weights_on_model_save": gather_flag}}
    engine, *_ = deepspeed.initialize(model=_tied_model(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    idx, target = _tokens(4, world)

    def step(s, eng):
        start = s * MICRO * world + rank * MICRO
        eng.backward(_tied_loss(eng, idx[start:start + MICRO], target[start:start + MICRO]))
        eng.step()

    for s in range(2):
        step(s, engine)
    engine.save_checkpoint(tmp)
    saved16 = engine.save_16bit_model(tmp, "model16.bin")
    trained = full_params(engine.module)
    torch.manual_seed(7)
    fresh, *_ = deepspeed.initialize(model=TiedNet(), config=config)
    fresh.load_checkpoint(tmp)
    for s in range(2, 4):
        step(s, fresh)
    exists = os.path.exists(os.path.join(tmp, "model16.bin"))
    return saved16, exists, trained, full_params(fresh.module)


@pytest.mark.parametrize("gather_flag", [True, False])
def test_checkpoint_resume_and_16bit_save(dist_pool, tmp_path, gather_flag):
    results = dist_pool.run(_save_and_reload, args=(str(tmp_path), gather_flag))
    model = _tied_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    idx, target = _tokens(4, 2)
    for s in range(4):
        sl = slice(s * MICRO * 2, (s + 1) * MICRO * 2)
        _tied_loss(model, idx[sl], target[sl]).backward()
        opt.step()
        opt.zero_grad()
    for saved16, exists, trained, resumed in results:
        assert saved16 is gather_flag and exists is gather_flag
        for name, param in model.named_parameters():
            torch.testing.assert_close(resumed[name], param.detach(), rtol=0, atol=1e-6)
    if gather_flag:
        plain = TiedNet()
        plain.load_state_dict(torch.load(tmp_path / "model16.bin", weights_only=True),
                              strict=True)
        for name, param in plain.named_parameters():
            torch.testing.assert_close(param.detach(), results[0][2][name], rtol=0, atol=0)


def _inference(offload, path):
    import deepspeed

    torch.manual_seed(0)
    model = _mlp()
    plain = _mlp()
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_param": {"device": offload, "nvme_path": path,
                                                      "max_in_cpu": 0}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config)
    x = torch.randn(4, 9)
    with torch.no_grad():
        out = engine(x)
    return (optimizer is None, torch.equal(out, plain(x).detach()),
            all(p.numel() == 0 and p.ds_tensor.device.type == "cpu"
                and (offload != "nvme" or p.ds_tensor.numel() == 0)  # on disk
                for p in engine.module.parameters()))


@pytest.mark.parametrize("offload", ["none", "cpu", "nvme"])
def test_zero_inference_without_an_optimizer(dist_pool, tmp_path, offload):
    for no_optimizer, same, partitioned in dist_pool.run(_inference,
                                                         args=(offload, str(tmp_path))):
        assert no_optimizer and same and partitioned


def _nvme_both(path, max_in_cpu):
    import os

    config_zero = {"offload_param": {"device": "nvme", "nvme_path": path,
                                     "max_in_cpu": max_in_cpu},
                   "offload_optimizer": {"device": "nvme", "nvme_path": path}}
    params, placeholders, _ = _train_tied(config_zero)
    files = [f for _, _, names in os.walk(os.path.join(path, "zero_stage_3_params"))
             for f in names]
    return params, placeholders, len(files)


@pytest.mark.parametrize("max_in_cpu", [0, 40])
def test_nvme_param_and_optimizer_offload(dist_pool, tmp_path, max_in_cpu):
    expected = _tied_reference(2)
    for params, placeholders, files in dist_pool.run(_nvme_both, args=(str(tmp_path), max_in_cpu)):
        assert placeholders and files > 0  # shards beyond max_in_cpu live in swap files
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


def _live_parameters(limit):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(10, 10) for _ in range(6)])
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": 10_000,
                                    "stage3_max_live_parameters": limit}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    x = torch.randn(MICRO, 10)
    for _ in range(3):
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    return engine.plugins.get_plugin("zero").coordinator.gathered_peak


def test_max_live_parameters_bounds_prefetching(dist_pool):
    layer = 110
    bounded = dist_pool.run(_live_parameters, args=(layer,))[0]
    unbounded = dist_pool.run(_live_parameters, args=(10**9,))[0]
    assert bounded <= 2 * layer  # the limit plus the layer being run
    assert unbounded > bounded  # without the limit prefetching gathers further ahead


class _ReturnsBias(torch.nn.Module):
    """The docs' CustomLinear: returns its bias for the caller to add."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 6) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(4) * 0.3)

    def forward(self, x):
        return F.linear(x, self.weight), self.bias


class _UsesReturnedBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ReturnsBias()

    def forward(self, x):
        out, bias = self.inner(x)
        return torch.tanh(out + bias)


def _returned_param_model():
    torch.manual_seed(0)
    return _UsesReturnedBias()


def _train_returned(steps):
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=_returned_param_model(), config=config)
    from deepspeed import comm as dist

    x = torch.randn(steps * MICRO * 2, 6, generator=torch.Generator().manual_seed(5))
    for s in range(steps):
        start = s * MICRO * 2 + dist.get_rank() * MICRO
        engine.backward(engine(x[start:start + MICRO]).pow(2).mean())
        engine.step()
    return full_params(engine.module)


def test_a_module_returning_its_own_parameter(dist_pool):
    model = _returned_param_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    x = torch.randn(3 * MICRO * 2, 6, generator=torch.Generator().manual_seed(5))
    for s in range(3):
        model(x[s * MICRO * 2:(s + 1) * MICRO * 2]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    for params in dist_pool.run(_train_returned, args=(3,)):
        for name, param in model.named_parameters():
            torch.testing.assert_close(params[name], param.detach(), rtol=0, atol=1e-6)


def _register_errors():
    from deepspeed.zero import register_external_parameter, unregister_external_parameter

    module = torch.nn.Linear(2, 2)
    errors = []
    for call in (lambda: register_external_parameter(module, torch.zeros(2)),
                 lambda: unregister_external_parameter(module, module.weight)):
        try:
            call()
        except RuntimeError as err:
            errors.append(str(err))
    register_external_parameter(module, module.weight)
    return errors, [name for name, _ in module.ds_external_parameters()]


def test_external_parameter_registration_errors():
    errors, listed = _register_errors()
    assert len(errors) == 2 and "nn.Parameter" in errors[0] and "not registered" in errors[1]
    assert len(listed) == 1


def _init_on_nvme(path):
    import os

    import deepspeed

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_param": {"device": "nvme", "nvme_path": path,
                                                      "max_in_cpu": 0}}}
    with deepspeed.zero.Init(remote_device="nvme", config_dict_or_path=config):
        model = _mlp()
    on_disk = all(p.ds_tensor.numel() == 0 for p in model.parameters())
    files = sum(len(names) for _, _, names in os.walk(path))
    engine, *_ = deepspeed.initialize(model=model, config=config)
    x = torch.randn(MICRO, 9, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        out = engine(x)
    return on_disk, files, out


def test_zero_init_straight_to_nvme(dist_pool, tmp_path):
    expected = _mlp()(torch.randn(MICRO, 9, generator=torch.Generator().manual_seed(9)))
    for on_disk, files, out in dist_pool.run(_init_on_nvme, args=(str(tmp_path),)):
        assert on_disk and files >= 4
        torch.testing.assert_close(out, expected.detach(), rtol=0, atol=0)


def _hf_save_face():
    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_gather_16bit_weights_on_model_save": True}}
    engine, *_ = deepspeed.initialize(model=_mlp(), config=config)
    state = engine._zero3_consolidated_16bit_state_dict()
    return (dist.get_rank(), engine.zero_gather_16bit_weights_on_model_save(),
            engine.config.get("zero_optimization")["stage"], state)


def test_the_16bit_save_face_hf_trainer_calls(dist_pool):
    expected = _mlp().state_dict()
    for rank, flag, stage, state in dist_pool.run(_hf_save_face):
        assert flag is True and stage == 3
        if rank == 0:
            assert state.keys() == expected.keys()
            for name, value in expected.items():
                torch.testing.assert_close(state[name], value, rtol=0, atol=0)
        else:
            assert state is None


def _destroy_restores_torch():
    import gc

    import deepspeed
    from deepspeed.utils import patching
    from deepspeed.zero.torch_patches import ATTRIBUTE_WATCH

    # engines of earlier tests in this worker may still hold the watch: count from here, after
    # collecting any an earlier test dropped (a collection between the two counts released one
    # and made this count 1 instead of 2)
    gc.collect()
    users = ATTRIBUTE_WATCH.users
    torch_own = patching.original(torch.nn.Module, "__getattr__")
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    first, *_ = deepspeed.initialize(model=_mlp(), config=config)
    second, *_ = deepspeed.initialize(model=_mlp(), config=config)
    counted = ATTRIBUTE_WATCH.users - users
    patched = torch.nn.Module.__getattr__ is not torch_own
    x = torch.randn(MICRO, 9)
    first.backward(first(x).pow(2).mean())
    first.step()
    first.destroy()
    still_patched = torch.nn.Module.__getattr__ is not torch_own  # the second engine needs it
    second.backward(second(x).pow(2).mean())  # and still trains
    second.step()
    second.destroy()
    released = ATTRIBUTE_WATCH.users == users
    restored = users > 0 or torch.nn.Module.__getattr__ is torch_own
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                for engine in (first, second) for m in engine.module.modules())
    grad_hooks = sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                     for engine in (first, second) for p in engine.module.parameters())
    return counted, patched, still_patched, released, restored, hooks, grad_hooks


def test_destroy_detaches_zero3_from_torch(dist_pool):
    for counted, patched, still_patched, released, restored, hooks, grad_hooks in \
            dist_pool.run(_destroy_restores_torch):
        assert counted == 2 and patched and still_patched
        assert released and restored  # torch's own __getattr__ back once no engine needs it
        assert hooks == 0 and grad_hooks == 0


def _dropped_engine_releases_the_watch():
    import gc

    import deepspeed
    from deepspeed.zero.torch_patches import ATTRIBUTE_WATCH

    gc.collect()  # an engine an earlier test on this warm rank dropped is released before counting
    users = ATTRIBUTE_WATCH.users
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3}}
    engine, *_ = deepspeed.initialize(model=_mlp(), config=config)
    engine.backward(engine(torch.randn(MICRO, 9)).pow(2).mean())
    engine.step()
    held = ATTRIBUTE_WATCH.users - users
    del engine
    gc.collect()
    return held, ATTRIBUTE_WATCH.users - users


def test_an_engine_dropped_without_destroy_releases_the_attribute_watch(dist_pool):
    for held, after in dist_pool.run(_dropped_engine_releases_the_watch):
        assert (held, after) == (1, 0)
