"""What the planner needs to know about a model, read without materialising a single weight.

A plan is arithmetic over a handful of numbers: how many parameters there are (tied ones once),
how they are ordered and sized (the ZeRO buckets are cut from that order), how many repeated
layers a pipeline can split, what one sample's forward keeps alive for backward, and how many
FLOPs it costs. All of them are read from the model built on the ``meta`` device, where tensors
have shapes but no storage, so a 70B model is described in seconds on a laptop.

Activations and FLOPs are *traced*, not guessed from a formula: one forward runs under
``torch.autograd.graph.saved_tensors_hooks`` (every tensor autograd keeps for backward) and
the flops profiler (``deepspeed.profiling.flops_profiler.FlopsProfiler``, which counts on meta
tensors as well). That covers any architecture the module implements, with whatever
attention or MLP it has. Large Hugging Face models are traced at one and two layers and
extrapolated linearly in the layer count (every decoder layer is the same), which keeps
``ds_plan`` on a 70B config fast.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence, Tuple

from deepspeed.utils.lazy_module import lazy_module
from deepspeed.zero import model_param_counts

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)

# Preset model shapes (plain config dicts: no hub download). Values are the public
# architecture hyper-parameters of each model family.
PRESETS = {
    "llama-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     vocab_size=32000, max_position_embeddings=4096),
    "llama-13b": dict(model_type="llama", hidden_size=5120, intermediate_size=13824,
                      num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                      vocab_size=32000, max_position_embeddings=4096),
    "llama-70b": dict(model_type="llama", hidden_size=8192, intermediate_size=28672,
                      num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                      vocab_size=32000, max_position_embeddings=4096),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192),
    "mixtral-8x7b": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
                         max_position_embeddings=4096),
    "tiny-llama": dict(model_type="llama", hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                       vocab_size=256, max_position_embeddings=128),
}

LAYER_NAME = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")


@dataclass(frozen=True)
class ModelSpec:
    """Per-sample, whole-model facts; the layout divides them (see ``memory`` and ``comms``).

    ``param_numels`` lists trainable parameters in registration order (tied ones once): the
    order ZeRO fills its buckets in. ``activation_bytes`` is what one sample's forward keeps
    for backward at ``seq_len`` in ``act_dtype`` (parameters excluded: they are model states).
    ``layer_input_bytes`` is one layer's input per sample: all that activation checkpointing
    keeps of a layer between forward and backward.
    """
    name: str
    total_params: int
    largest_layer_params: int
    num_layers: int
    hidden_size: int
    seq_len: int
    activation_bytes: int
    layer_input_bytes: int
    flops_per_sample: int  # forward only; training is about 3x (backward is two matmuls)
    param_numels: Tuple[int, ...] = field(repr=False, default=())
    vocab_size: int = 0
    num_heads: int = 0
    num_experts: int = 1
    experts_per_token: int = 1
    expert_params: int = 0  # parameters inside experts, all experts of all layers
    act_dtype_bytes: int = 4
    # which of ``param_numels`` are expert weights (split over expert-parallel ranks); empty:
    # unknown (only the ``expert_params`` total is)
    expert_mask: Tuple[bool, ...] = field(repr=False, default=())
    moe_layers: int = 0  # layers with experts; 0 with ``num_experts > 1``: every layer
    # the gate's slots per expert: max(ceil(tokens * k / experts * factor), min_capacity)
    capacity_factor: float = 1.0
    min_capacity: int = 4

    @property
    def expert_layers(self) -> int:
        if self.num_experts <= 1:
            return 0
        return self.moe_layers or self.num_layers

    @property
    def layer_activation_bytes(self) -> int:
        """Saved bytes of one layer for one sample (the whole model's over its layers: the
        embedding and head are a small remainder)."""
        return self.activation_bytes // max(self.num_layers, 1)

    def with_seq_len(self, seq_len: int) -> "ModelSpec":
        """Rescale the sequence-linear figures (attention's s^2 part is small at planning
        lengths for flash/SDPA kernels, which keep no score matrix)."""
        ratio = seq_len / self.seq_len
        return replace(self, seq_len=seq_len, activation_bytes=int(self.activation_bytes * ratio),
                       layer_input_bytes=int(self.layer_input_bytes * ratio),
                       flops_per_sample=int(self.flops_per_sample * ratio))


# ---------------------------------------------------------------------------- tracing
def trace_forward(module: torch.nn.Module, inputs: Sequence[torch.Tensor],
                  loss_fn: Optional[Callable] = None, flash_seq_len: int = 0) -> Tuple[int, int]:
    """(bytes autograd saves for backward, forward FLOPs) of ``module(*inputs)``.

    Parameters (and views of them) that autograd saves are not activations and are skipped;
    a tensor saved twice (or two views of one) counts once. With ``flash_seq_len`` a saved
    ``[batch, heads, s, s]`` attention matrix counts as what a fused (flash) attention kernel keeps
    instead: one fp32 statistic per row. On the meta device attention runs its unfused
    reference path, which would otherwise claim the quadratic matrix every real training run
    avoids.
    """
    from deepspeed.profiling import FlopsProfiler

    params = {p.untyped_storage()._cdata for p in module.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()  # views of one tensor share it: counted once
        key = storage._cdata
        if key not in params:
            nbytes = storage.nbytes()
            if flash_seq_len and tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2] == flash_seq_len:
                nbytes = nbytes // flash_seq_len // tensor.element_size() * 4
            if key in saved:  # saved again through another view: the attention reading wins
                nbytes = min(nbytes, saved[key][1])
            saved[key] = (storage, nbytes)  # kept alive: its identity is not reused meanwhile
        return tensor

    profiler = FlopsProfiler(module)  # our flops profiler: it counts on meta tensors too
    profiler.start_profile()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = module(*inputs)
            if loss_fn is not None:
                loss_fn(out)
        profiler.stop_profile()
        flops = profiler.get_total_flops()
    finally:
        profiler.end_profile()
    return sum(nbytes for _, nbytes in saved.values()), flops


def _layer_input_bytes(hidden_size, seq_len, dtype_bytes):
    return hidden_size * seq_len * dtype_bytes


def from_module(module: torch.nn.Module, inputs: Sequence[torch.Tensor], name: str = "module",
                num_layers: Optional[int] = None, hidden_size: Optional[int] = None,
                seq_len: Optional[int] = None, loss_fn: Optional[Callable] = None) -> ModelSpec:
    """Describe ``module`` from one forward of ``inputs`` (a micro-batch of one sample).

    ``num_layers`` defaults to the count of numbered blocks (``...layers.N.``); ``hidden_size``
    and ``seq_len`` (for the activation-checkpointing figure) default to the last dimension and
    the second dimension of the first input when it has them.
    """
    total, largest = model_param_counts(module)
    numels = tuple(p.numel() for p in module.parameters() if p.requires_grad)
    moe = moe_facts(module)
    act, flops = trace_forward(module, inputs, loss_fn)
    names = [n for n, _ in module.named_parameters()]
    layers = num_layers or len({m.group(1) for n in names for m in [LAYER_NAME.search("." + n)] if m}) or 1
    first = inputs[0]
    dtype_bytes = next((p.element_size() for p in module.parameters()), 4)
    seq = seq_len or (first.shape[1] if first.dim() >= 2 else 1)
    hidden = hidden_size or (first.shape[-1] if first.is_floating_point() else 0)
    return ModelSpec(name=name, total_params=total, largest_layer_params=largest, num_layers=layers,
                     hidden_size=hidden, seq_len=seq, activation_bytes=act,
                     layer_input_bytes=_layer_input_bytes(hidden, seq, dtype_bytes),
                     flops_per_sample=flops, param_numels=numels, act_dtype_bytes=dtype_bytes,
                     **moe)


def moe_facts(module: torch.nn.Module) -> dict:
    """The ``ModelSpec`` fields of the ``deepspeed.moe.layer.MoE`` layers in ``module`` (none
    when it has none): experts per layer, top-k, the gate's capacity, which parameters are
    experts. Build the module with ``ep_size=1`` for planning: every expert is then present,
    the layer runs no collective, and the planner divides the experts by the layout's ``ep``."""
    from deepspeed.moe import MoE

    layers = [m for m in module.modules() if isinstance(m, MoE)]
    if not layers:
        return {}
    first = layers[0]
    gate = first.deepspeed_moe.gate
    experts = {id(p) for layer in layers for p in layer.deepspeed_moe.experts.parameters()}
    mask = tuple(id(p) in experts for p in module.parameters() if p.requires_grad)
    return dict(num_experts=first.num_experts, experts_per_token=first.k, moe_layers=len(layers),
                capacity_factor=gate.capacity_factor, min_capacity=gate.min_capacity,
                expert_mask=mask,
                expert_params=sum(p.numel() for p in module.parameters()
                                  if id(p) in experts and p.requires_grad))


def from_function(target: str, **kwargs) -> ModelSpec:
    """``module:function`` returning ``(nn.Module, inputs)`` for a micro-batch of one (or just
    the module, when ``inputs`` are given). The function is called under the meta device."""
    mod_name, _, fn_name = target.partition(":")
    if not fn_name:
        raise ValueError(f"model {target!r}: expected 'module:function'")
    fn = getattr(importlib.import_module(mod_name), fn_name, None)
    if fn is None:
        raise ValueError(f"model {target!r}: module {mod_name!r} has no {fn_name!r}")
    with torch.device("meta"):
        built = fn()
    module, inputs = built if isinstance(built, tuple) else (built, kwargs.pop("inputs", None))
    if inputs is None:
        raise ValueError(f"model {target!r}: the function must return (module, inputs) where "
                         f"inputs is a tuple of tensors for one sample")
    return from_module(module, tuple(inputs), name=target, **kwargs)


# ---------------------------------------------------------------------------- transformers
def hf_config(name_or_dict):
    """A transformers ``PretrainedConfig`` from a preset name, a dict, or a local path / name
    (``AutoConfig.from_pretrained`` with ``local_files_only``: the planner never downloads)."""
    from transformers import AutoConfig, CONFIG_MAPPING

    if isinstance(name_or_dict, str) and name_or_dict in PRESETS:
        name_or_dict = PRESETS[name_or_dict]
    if isinstance(name_or_dict, dict):
        values = dict(name_or_dict)
        return CONFIG_MAPPING[values.pop("model_type")](**values)
    try:
        return AutoConfig.from_pretrained(name_or_dict, local_files_only=True)
    except OSError as error:
        raise ValueError(f"model {name_or_dict!r}: not a preset ({', '.join(sorted(PRESETS))}), "
                         f"a local config path or a cached Hugging Face config ({error})") from None


def _build_hf(config, layers):
    from transformers import AutoModelForCausalLM

    config = config.__class__.from_dict({**config.to_dict(), "num_hidden_layers": layers})
    config._attn_implementation = "sdpa"
    import transformers
    from packaging.version import Version

    # transformers 4.56 renamed ``torch_dtype`` to ``dtype`` and warns on the old name
    new_name = Version(transformers.__version__) >= Version("4.56")
    dtype = {"dtype" if new_name else "torch_dtype": torch.bfloat16}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, **dtype)


def from_transformers(name_or_dict, seq_len: int = 2048) -> ModelSpec:
    """Describe a causal LM from its config: trace 1 and 2 layers on meta, extrapolate.

    Every figure is ``a + b * layers``; the one- and two-layer models give ``a`` and ``b``.
    Parameter order is the first layer's repeated, between what precedes and follows it.
    A preset or config dict is described once per machine (``spec_cache``): later plans of it
    need neither ``transformers`` nor a trace.
    """
    values = PRESETS.get(name_or_dict) if isinstance(name_or_dict, str) else name_or_dict
    if isinstance(values, dict):
        from deepspeed.plan.spec_cache import cached_spec

        name = name_or_dict if isinstance(name_or_dict, str) else values.get("model_type")
        return cached_spec({"name": name, **values}, seq_len,
                           lambda: _trace_transformers(name_or_dict, seq_len), ModelSpec,
                           _tracing_sources())
    return _trace_transformers(name_or_dict, seq_len)


def _tracing_sources():
    """The files whose code decides a traced description: this module and the flops profiler."""
    import inspect
    from pathlib import Path

    from deepspeed.profiling import FlopsProfiler

    return (Path(__file__), *sorted(Path(inspect.getfile(FlopsProfiler)).parent.glob("*.py")))


def _trace_transformers(name_or_dict, seq_len):
    config = hf_config(name_or_dict)
    layers = config.num_hidden_layers
    figures = []
    for n in (1, 2):
        model = _build_hf(config, n)
        ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        total, largest = model_param_counts(model)
        act, flops = trace_forward(model, (ids,), lambda out: out.logits.float().sum(),
                                   flash_seq_len=seq_len)
        figures.append((model, total, largest, act, flops))
    (m1, t1, l1, a1, f1), (_, t2, l2, a2, f2) = figures

    def extrapolate(one, two):
        return one + (two - one) * (layers - 1)

    before, layer, after = [], [], []
    for pname, param in m1.named_parameters():
        match = LAYER_NAME.search("." + pname)
        (layer if match else (after if layer else before)).append(param.numel())
    numels = tuple(before + layer * layers + after)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 1
    expert_params, mask = 0, ()
    if experts > 1:
        expert_params = sum(p.numel() for n, p in m1.named_parameters() if ".experts." in n) * layers
        in_layer = [".experts." in n for n, _ in m1.named_parameters()
                    if LAYER_NAME.search("." + n)]
        mask = (False,) * len(before) + tuple(in_layer) * layers + (False,) * len(after)
    name = name_or_dict if isinstance(name_or_dict, str) else config.model_type
    return ModelSpec(name=name, total_params=extrapolate(t1, t2), largest_layer_params=max(l1, l2),
                     num_layers=layers, hidden_size=config.hidden_size, seq_len=seq_len,
                     activation_bytes=extrapolate(a1, a2),
                     layer_input_bytes=_layer_input_bytes(config.hidden_size, seq_len, 2),
                     flops_per_sample=extrapolate(f1, f2), param_numels=numels,
                     vocab_size=config.vocab_size, num_heads=config.num_attention_heads,
                     num_experts=experts,
                     experts_per_token=getattr(config, "num_experts_per_tok", 1) or 1,
                     expert_params=expert_params, expert_mask=mask, act_dtype_bytes=2)


def from_measurements(num_params: int, activation_bytes_per_sample: int, flops_per_sample: int,
                      param_numels: Sequence[int] = (), bytes_per_param: int = 4,
                      num_layers: int = 1, hidden_size: int = 0,
                      name: str = "measured model") -> ModelSpec:
    """A spec from figures measured on a real forward (the autotuner's profiling run) rather
    than traced on meta: one rank's parameters, the bytes autograd saved for one sample, the
    forward FLOPs of one sample, the parameter sizes in registration order when known. The
    sequence length is folded into the per-sample figures (``seq_len`` 1); activation
    checkpointing figures are unknown (``layer_input_bytes`` 0)."""
    numels = tuple(int(n) for n in param_numels)
    if numels and sum(numels) != num_params:
        numels = ()  # frozen parameters or a partial list: the order cannot be trusted
    return ModelSpec(name=name, total_params=int(num_params),
                     largest_layer_params=max(numels, default=int(num_params)),
                     num_layers=max(int(num_layers or 1), 1), hidden_size=int(hidden_size or 0),
                     seq_len=1, activation_bytes=int(activation_bytes_per_sample),
                     layer_input_bytes=0, flops_per_sample=int(flops_per_sample),
                     param_numels=numels, act_dtype_bytes=int(bytes_per_param))


def load_model(model: str, seq_len: int = 2048) -> ModelSpec:
    """The CLI's reading of ``--model``: ``module:function`` or a transformers config."""
    if ":" in model and not model.startswith(("/", ".")):
        return from_function(model)
    return from_transformers(model, seq_len=seq_len)
