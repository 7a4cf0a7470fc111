"""One way to lay a training job over a cluster: the parallel degrees, the ZeRO stage and its
offloads, the batch split and the precision. It turns into the DeepSpeed config that runs it.

The degrees multiply to the world size: ``dp * tp * pp * sp`` ranks. Gradients are averaged
and ZeRO partitions over ``dp * sp`` of them (``zero_ranks``). Expert parallelism
(``ep``) splits the data-parallel ranks further for expert weights only (each expert group
holds ``num_experts / ep`` experts), so it must divide ``dp``.
"""
from dataclasses import asdict, dataclass

PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOADS = ("none", "cpu", "nvme")
# what the engine's ZeRO uses when a config does not set them (elements)
DEFAULT_REDUCE_BUCKET = 500_000_000
DEFAULT_ALLGATHER_BUCKET = 500_000_000
DEFAULT_PREFETCH_BUCKET = 50_000_000
DEFAULT_PERSISTENCE_THRESHOLD = 100_000


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    ep: int = 1
    zero_stage: int = 0
    offload_optimizer: str = "none"
    offload_param: str = "none"
    micro_batch: int = 1
    grad_accum: int = 1
    activation_checkpointing: bool = False
    precision: str = "bf16"
    reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET
    allgather_bucket_size: int = DEFAULT_ALLGATHER_BUCKET
    prefetch_bucket_size: int = DEFAULT_PREFETCH_BUCKET
    param_persistence_threshold: int = DEFAULT_PERSISTENCE_THRESHOLD

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "sp", "ep", "micro_batch", "grad_accum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"layout: {name} must be a positive integer, got {value!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"layout: zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"layout: precision {self.precision!r}: expected one of {PRECISIONS}")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOADS:
                raise ValueError(f"layout: {name} {getattr(self, name)!r}: expected one of {OFFLOADS}")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError("layout: offload_optimizer needs ZeRO stage 1, 2 or 3")
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError("layout: offload_param needs ZeRO stage 3")
        if self.dp % self.ep:
            raise ValueError(f"layout: ep={self.ep} must divide dp={self.dp}")
        if self.pp > 1 and self.zero_stage > 1:
            raise ValueError("layout: pipeline parallelism runs with ZeRO stage 0 or 1 only")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.sp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def zero_ranks(self) -> int:
        """Ranks holding the same weights, which gradients are averaged over and ZeRO
        partitions over: the data-parallel ranks times the sequence-parallel ones (a
        sequence-parallel rank holds the whole model and sees part of every sample; the
        engine's ``sequence_data`` group)."""
        return self.dp * self.sp

    @property
    def model_parallel(self) -> int:
        """Ranks one copy of the weights is split over (ZeRO partitions within dp only)."""
        return self.tp * self.pp

    def label(self) -> str:
        parts = [f"dp{self.dp}"] + [f"{k}{v}" for k, v in
                                    (("tp", self.tp), ("pp", self.pp), ("sp", self.sp), ("ep", self.ep)) if v > 1]
        parts.append(f"z{self.zero_stage}")
        if self.offload_optimizer != "none":
            parts.append(f"oo-{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"op-{self.offload_param}")
        if self.activation_checkpointing:
            parts.append("ac")
        return " ".join(parts)

    def as_dict(self):
        return asdict(self)


def deepspeed_config(layout: Layout, lr: float = 1e-4) -> dict:
    """The DeepSpeed config that runs ``layout`` (batch keys, precision, ZeRO and its offloads,
    tensor/sequence parallel sizes, activation checkpointing). A pipeline's stage count is the
    ``PipelineModule``'s ``num_stages`` argument, not a config key (``pipeline.stages`` is
    documented as taking no effect), so ``ds_plan`` prints it instead of writing it."""
    config = {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": lr}},
        "zero_optimization": {"stage": layout.zero_stage,
                              "reduce_bucket_size": layout.reduce_bucket_size,
                              "allgather_bucket_size": layout.allgather_bucket_size},
    }
    zero = config["zero_optimization"]
    if layout.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = layout.prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = layout.param_persistence_threshold
    if layout.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": layout.offload_optimizer}
    if layout.offload_param != "none":
        zero["offload_param"] = {"device": layout.offload_param}
    if layout.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif layout.precision == "fp16":
        config["fp16"] = {"enabled": True}
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.sp > 1:
        config["sequence_parallel_size"] = layout.sp
    if layout.activation_checkpointing:
        config["activation_checkpointing"] = {"partition_activations": False}
    return config


def layout_from_config(config: dict, world_size: int, tp: int = 1, pp: int = 1, sp: int = 1,
                       ep: int = 1) -> Layout:
    """The layout a DeepSpeed config runs at ``world_size`` ranks (the degrees a config does
    not hold, such as the pipeline's stage count, are arguments)."""
    zero = config.get("zero_optimization", {}) or {}
    tp = int((config.get("tensor_parallel") or {}).get("autotp_size", tp) or 1)
    sp = int(config.get("sequence_parallel_size", sp) or 1)
    if world_size % (tp * pp * sp):
        raise ValueError(f"world size {world_size} is not divisible by tp*pp*sp = {tp * pp * sp}")
    dp = world_size // (tp * pp * sp)
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    batch = config.get("train_batch_size")
    if micro is None and batch is not None:
        micro = batch // (dp * (accum or 1))
    micro = int(micro or 1)
    if accum is None:
        accum = batch // (dp * micro) if batch else 1
    bf16 = config.get("bf16") or config.get("bfloat16") or {}  # the deprecated spelling too
    precision = "bf16" if bf16.get("enabled") else \
        "fp16" if (config.get("fp16") or {}).get("enabled") else "fp32"

    def device(key):
        return ((zero.get(key) or {}).get("device") or "none")

    return Layout(dp=dp, tp=tp, pp=pp, sp=sp, ep=ep, zero_stage=int(zero.get("stage", 0)),
                  offload_optimizer=device("offload_optimizer"), offload_param=device("offload_param"),
                  micro_batch=micro, grad_accum=int(accum),
                  activation_checkpointing="activation_checkpointing" in config,
                  precision=precision,
                  reduce_bucket_size=int(zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET)),
                  allgather_bucket_size=int(zero.get("allgather_bucket_size", DEFAULT_ALLGATHER_BUCKET)),
                  prefetch_bucket_size=int(zero.get("stage3_prefetch_bucket_size", DEFAULT_PREFETCH_BUCKET)),
                  param_persistence_threshold=int(zero.get("stage3_param_persistence_threshold",
                                                           DEFAULT_PERSISTENCE_THRESHOLD)))
