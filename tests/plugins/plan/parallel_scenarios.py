"""Model-parallel scenarios for the planner's check against real runs: a two-stage pipeline,
a tiny Llama over two tensor-parallel and over two Ulysses sequence-parallel ranks, and an MoE
layer's experts over two expert-parallel ranks. Each measurement returns the last step's
collectives and the run's peak of tracked tensor memory; each ``*_plan`` the planner's
prediction of both. They drive the pipeline engine's
``train_batch`` and ``tp_model_init`` as a user script does, which is why they live with the
tests rather than in ``deepspeed.plan`` (a plugin package uses only the engine members
``deepspeed.hooks.Engine`` declares). ``tools/bench/plan_vs_measured.py`` imports them too."""
import torch

from deepspeed.plan.measure import calls_between, logged_calls, with_peak

PIPELINE_MICRO, PIPELINE_ACCUM, PIPELINE_HIDDEN = 2, 3, 32


def pipeline_layers():
    from deepspeed.pipe import LayerSpec

    # four equal linear layers: the parameter-balanced partition gives each stage two, the
    # even split the planner assumes (its memory is per rank, not per stage)
    width = PIPELINE_HIDDEN
    layers = [LayerSpec(torch.nn.Linear, width, width)]
    for _ in range(3):
        layers += [LayerSpec(torch.nn.Tanh), LayerSpec(torch.nn.Linear, width, width)]
    return layers


def measure_pipeline(steps=2):
    """``({collective: {size: calls}} of the last ``train_batch``, peak tracked bytes)`` of a
    two-stage pipeline (``PIPELINE_ACCUM`` micro-batches of ``PIPELINE_MICRO`` samples, fp32)."""
    return with_peak(lambda: _run_pipeline(steps))


def _run_pipeline(steps):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    model = PipelineModule(pipeline_layers(), num_stages=2, loss_fn=torch.nn.MSELoss())
    config = {"train_micro_batch_size_per_gpu": PIPELINE_MICRO,
              "gradient_accumulation_steps": PIPELINE_ACCUM,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "comms_logger": {"enabled": True, "prof_all": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=config)

    def batches():
        while True:
            yield (torch.randn(PIPELINE_MICRO, PIPELINE_HIDDEN),
                   torch.randn(PIPELINE_MICRO, PIPELINE_HIDDEN))

    data = batches()
    try:
        for _ in range(steps - 1):
            engine.train_batch(data)  # the first step also sends the activations' shapes
        before = logged_calls()
        engine.train_batch(data)
        return calls_between(logged_calls(), before)
    finally:
        engine.destroy()


def _planned(spec, layout):
    """``({collective: {size: calls}} per step, MemoryPlan)`` on this machine's cluster."""
    from deepspeed.plan.cluster import cluster
    from deepspeed.plan.comms import by_name_and_size, per_step
    from deepspeed.plan.memory import memory_per_rank

    return by_name_and_size(per_step(spec, layout)), memory_per_rank(spec, layout,
                                                                     cluster("cpu-local"))


def pipeline_plan():
    """The planner's ``({collective: {size: calls}}, MemoryPlan)`` for ``measure_pipeline``:
    the hidden width crossing the stage boundary is the model's, one token per sample."""
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_module

    with torch.device("meta"):
        module = torch.nn.Sequential(*(spec.build() for spec in pipeline_layers()))
        spec = from_module(module, (torch.randn(1, PIPELINE_HIDDEN),), name="pipe-mlp",
                           num_layers=2, hidden_size=PIPELINE_HIDDEN, seq_len=1)
    layout = Layout(dp=1, pp=2, micro_batch=PIPELINE_MICRO, grad_accum=PIPELINE_ACCUM,
                    precision="fp32")
    return _planned(spec, layout)


TP_LLAMA = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=32, attention_bias=False, mlp_bias=False)
TP_MICRO, TP_SEQ = 2, 8


def measure_tensor_parallel(steps=2):
    """``({collective: {size: calls}} of the last step, peak tracked bytes)`` of a tiny Llama
    split over two tensor-parallel ranks by ``deepspeed.tp_model_init`` (fp32)."""
    return with_peak(lambda: _run_tensor_parallel(steps))


def _run_tensor_parallel(steps):
    import deepspeed
    from deepspeed.utils import groups
    from transformers import AutoModelForCausalLM

    from deepspeed.plan.model_spec import hf_config

    previous = groups.mpu  # tp_model_init registers its unit process-wide: put it back
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(hf_config(TP_LLAMA)).float()
        model = deepspeed.tp_model_init(model, tp_size=2, dtype=torch.float32)
        config = {"train_micro_batch_size_per_gpu": TP_MICRO,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                  "tensor_parallel": {"autotp_size": 2},
                  "comms_logger": {"enabled": True, "prof_all": True}}
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          model_parameters=model.parameters())
        try:
            for step in range(steps):
                ids = torch.randint(0, TP_LLAMA["vocab_size"], (TP_MICRO, TP_SEQ))
                before = logged_calls()
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
            return calls_between(logged_calls(), before)
        finally:
            engine.destroy()
    finally:
        groups.set_mpu(previous)


def tensor_parallel_plan():
    """The planner's ``({collective: {size: calls}}, MemoryPlan)`` for
    ``measure_tensor_parallel``."""
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_transformers

    spec = from_transformers(TP_LLAMA, seq_len=TP_SEQ)
    layout = Layout(dp=1, tp=2, micro_batch=TP_MICRO, precision="fp32")
    return _planned(spec, layout)


# Ulysses: every head has its own key and value (no grouped-query attention), so the query,
# key, value and output all-to-alls of a layer move the same bytes
SP_LLAMA = dict(TP_LLAMA, num_key_value_heads=TP_LLAMA["num_attention_heads"])
SP_MICRO, SP_SEQ = 1, 16


def measure_sequence_parallel(steps=2):
    """``({collective: {size: calls}} of the last step, peak tracked bytes)`` of a tiny Llama
    whose sequences are split over two ranks by Ulysses (``UlyssesSPAttentionHF``), ZeRO
    stage 0, fp32. Each rank trains on its own half of the same sequences with its own
    shard's loss: the script itself runs no collective, so everything logged is the engine's
    and the attention's."""
    return with_peak(lambda: _run_sequence_parallel(steps))


def _run_sequence_parallel(steps):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from deepspeed.sequence import parallel_state
    from transformers import AutoModelForCausalLM

    from deepspeed.plan.model_spec import hf_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(SP_LLAMA), attn_implementation="sdpa").float()
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model, core_attn_implementation="sdpa", sequence_parallel_size=2, micro_batch_size=SP_MICRO)
    try:
        config = {"train_micro_batch_size_per_gpu": SP_MICRO, "sequence_parallel_size": 2,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                  "comms_logger": {"enabled": True, "prof_all": True}}
        engine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu,
                                          model_parameters=model.parameters())
        half = SP_SEQ // 2
        part = slice(dist.get_rank() * half, (dist.get_rank() + 1) * half)
        positions = torch.arange(SP_SEQ)[None]
        try:
            for step in range(steps):
                ids = torch.randint(0, SP_LLAMA["vocab_size"], (SP_MICRO, SP_SEQ),
                                    generator=torch.Generator().manual_seed(step))
                before = logged_calls()
                out = engine(input_ids=ids[:, part], position_ids=positions[:, part],
                             labels=ids[:, part])
                engine.backward(out.loss)
                engine.step()
            return calls_between(logged_calls(), before)
        finally:
            engine.destroy()
    finally:
        parallel_state.destroy_sequence_parallel()


def sequence_parallel_plan():
    """The planner's ``({collective: {size: calls}}, MemoryPlan)`` for
    ``measure_sequence_parallel``."""
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_transformers

    spec = from_transformers(SP_LLAMA, seq_len=SP_SEQ)
    layout = Layout(dp=1, sp=2, micro_batch=SP_MICRO, precision="fp32")
    return _planned(spec, layout)


# Expert parallelism: one MoE layer of 4 experts between two dense layers, the experts split
# over two ranks (ep 2) that are also the two data-parallel ranks. 32 tokens per micro-batch
# over 4 experts at capacity factor 1: 8 slots per expert, so the exchanges carry exactly the
# tokens (the plan computes the slots the gate's way in any case).
EP_HIDDEN, EP_EXPERTS, EP_MICRO, EP_SEQ = 32, 4, 4, 8


class ExpertParallelModel(torch.nn.Module):
    """Dense, MoE, dense; the forward returns the output alone (the load-balancing loss is
    left out of the training loss: the gate still learns through the combine weights)."""

    def __init__(self, ep_size):
        from deepspeed.moe.layer import MoE

        super().__init__()
        width = EP_HIDDEN
        self.inp = torch.nn.Linear(width, width)
        expert = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                     torch.nn.Linear(2 * width, width))
        self.moe = MoE(width, expert, num_experts=EP_EXPERTS, ep_size=ep_size, k=1)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        hidden, _, _ = self.moe(self.inp(x))
        return self.out(hidden)


def expert_parallel_model():
    torch.manual_seed(0)
    return ExpertParallelModel(ep_size=2)


def expert_parallel_case(zero_stage=0):
    """``(build, config, batch function)`` of the EP 2 run for ``measure_run``."""
    from deepspeed.plan.measure import random_batch

    config = {"train_micro_batch_size_per_gpu": EP_MICRO,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": zero_stage}}
    return expert_parallel_model, config, random_batch((EP_MICRO, EP_SEQ, EP_HIDDEN))


def measure_expert_parallel(zero_stage=0):
    """``({collective: {size: calls}} of the last step, peak tracked bytes)`` of the EP 2 run."""
    from deepspeed.plan.measure import measure_run

    return measure_run(*expert_parallel_case(zero_stage))


def expert_parallel_plan(zero_stage=0):
    """The planner's ``({collective: {size: calls}}, MemoryPlan)`` for the EP 2 run. The spec
    is traced from the same model with every expert local (``ep_size=1``: no collective, and
    the same slots per rank through the experts), on the CPU: the gate counts its tokens on
    the host, which a meta tensor cannot do."""
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_module

    torch.manual_seed(0)
    spec = from_module(ExpertParallelModel(ep_size=1), (torch.randn(1, EP_SEQ, EP_HIDDEN),),
                       name="ep-mlp")
    layout = Layout(dp=2, ep=2, micro_batch=EP_MICRO, precision="fp32", zero_stage=zero_stage)
    return _planned(spec, layout)
