"""ALST: Ulysses sequence parallelism for Hugging Face Transformers models.

The model code stays untouched: each rank runs the whole model on its slice of the sequence
(the data-loader adapter hands out the slices and matching ``position_ids``), and only the core
attention call, which transformers dispatches by name through ``AttentionInterface``, is swapped
for one that all-to-alls to "whole sequence x heads/sp", runs the original kernel causally over
the whole sequence, and all-to-alls back.
"""
import torch

from deepspeed.sequence import parallel_state
from deepspeed.sequence.all_to_all import seq_all_to_all

ULYSSES_ATTENTION = "ulysses"


def _load_config(model_name_or_path):
    """The model's config: a model object's own, or read from a LOCAL directory / cached name."""
    if hasattr(model_name_or_path, "config"):
        return model_name_or_path.config
    if isinstance(model_name_or_path, str):
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(model_name_or_path)
    raise TypeError("model_name_or_path must be a transformers model (with a .config) or a model "
                    f"name/path string, got {type(model_name_or_path).__name__}")


def kv_replication(num_heads, num_kv_heads, sp_size):
    """How many copies of each kv head the all-to-all needs (1: none).

    The rules: query heads must divide by ``sp_size``; kv heads either divide by it too (each
    rank gets ``kv/sp`` of them), or, when there are fewer kv heads than ranks, ``sp_size`` must
    divide by them and each kv head is replicated ``sp/kv`` times, so rank ``r`` gets kv head
    ``r // (sp/kv)``, the one its query heads ``r*q/sp ...`` are grouped with. Anything else has
    no layout that keeps every query head with its kv head.
    """
    if num_heads % sp_size != 0:
        raise ValueError(f"the model's num_attention_heads ({num_heads}) is not divisible by "
                         f"sequence_parallel_size {sp_size}: Ulysses gives each rank "
                         f"num_attention_heads/sequence_parallel_size heads")
    if num_kv_heads % sp_size == 0:
        return 1
    if num_kv_heads < sp_size and sp_size % num_kv_heads == 0:
        return sp_size // num_kv_heads
    raise ValueError(f"the model's num_key_value_heads ({num_kv_heads}) is not divisible by "
                     f"sequence_parallel_size {sp_size}, and cannot be replicated to it either "
                     f"(that needs fewer kv heads than sequence_parallel_size, dividing it)")


class _LocalHeads:
    """The attention module as the core kernel sees it after replicated kv heads were
    all-to-all'ed: every attribute is the module's, except ``num_key_value_groups``, which is the
    local query/kv head ratio (``heads/sp`` query heads share the one local kv head)."""

    def __init__(self, module, groups):
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name):
        return getattr(self._module, name)


class UlyssesSPAttentionHF:
    """The attention function registered with transformers; one instance per registration."""

    def __init__(self, attn, sequence_parallel_size, num_heads, num_kv_heads, seq_length=None,
                 seq_length_is_variable=True, micro_batch_size=1, disable_in_eval=False):
        self.attn = attn
        self.sp_size = sequence_parallel_size
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.seq_length = seq_length
        self.seq_length_is_variable = seq_length_is_variable
        self.micro_batch_size = micro_batch_size
        self.disable_in_eval = disable_in_eval
        self.kv_repeat = kv_replication(num_heads, num_kv_heads, sequence_parallel_size)
        self.attn_takes_mask = getattr(attn, "__name__", "") == "eager_attention_forward"

    def _check_shapes(self, query):
        local = query.shape[2]
        if not self.seq_length_is_variable and local * self.sp_size != self.seq_length:
            raise ValueError(f"seq_length_is_variable=False with seq_length={self.seq_length}, but a "
                             f"batch has {local * self.sp_size} tokens ({local} per rank x "
                             f"{self.sp_size}); pass seq_length_is_variable=True for varying lengths")

    def __call__(self, module, query, key, value, attention_mask, *args, **kwargs):
        if self.disable_in_eval and not module.training:
            # evaluation runs on whole sequences: nothing to re-shard
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        if attention_mask is not None:
            raise NotImplementedError(
                "Ulysses sequence parallelism supports causal attention without an attention mask "
                "(no padding masks, no packed-sequence masks): each rank only sees its slice, so a "
                "mask built for it is wrong for the whole sequence. Drop attention_mask from the "
                "batch (use position_ids) or pad to full length with labels -100")
        self._check_shapes(query)
        group = parallel_state.get_sequence_parallel_group()
        # transformers' layout: q/k/v [batch, heads, seq/sp, dim] -> [batch, heads/sp, seq, dim]
        if self.kv_repeat > 1:  # fewer kv heads than ranks: each rank gets a copy of its kv head
            key, value = (t.repeat_interleave(self.kv_repeat, dim=1) for t in (key, value))
        q, k, v = (seq_all_to_all(t, group, 1, 2) for t in (query, key, value))
        kwargs["is_causal"] = getattr(module, "is_causal", True)
        if self.kv_repeat > 1:
            module = _LocalHeads(module, q.shape[1] // k.shape[1])
        mask = None
        if self.attn_takes_mask:  # eager kernels apply no causality of their own
            seq = q.shape[2]
            mask = torch.full((seq, seq), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
            mask = mask[None, None]
        out, weights = self.attn(module, q, k, v, mask, *args, **kwargs)
        # the kernel returns [batch, seq, heads/sp, dim] -> [batch, seq/sp, heads, dim]
        return seq_all_to_all(out, group, 1, 2), weights

    @classmethod
    def register_with_transformers(cls, model_name_or_path, core_attn_implementation="sdpa",
                                   sequence_parallel_size=1, micro_batch_size=1, seq_length=None,
                                   seq_length_is_variable=True, disable_in_eval=False):
        """Build the sequence-parallel groups, register the Ulysses attention and point the
        model's config at it. Returns the ``mpu`` for ``deepspeed.initialize`` (None when
        ``sequence_parallel_size`` is 1: nothing is changed then).

        Given a model object, its config switches to the ``"ulysses"`` implementation. Given a
        name/path (call it before ``from_pretrained``), ``core_attn_implementation`` itself is
        replaced in transformers' global registry, so the model loaded with it is wrapped.
        """
        parallel_state.check_size("sequence_parallel_size", sequence_parallel_size)
        parallel_state.check_size("micro_batch_size", micro_batch_size)
        if seq_length is not None:
            parallel_state.check_size("seq_length", seq_length)
            if seq_length % sequence_parallel_size != 0:
                raise ValueError(f"seq_length {seq_length} is not divisible by "
                                 f"sequence_parallel_size {sequence_parallel_size}")
        if not seq_length_is_variable and seq_length is None:
            raise ValueError("seq_length_is_variable=False needs seq_length")
        if sequence_parallel_size == 1:
            return None

        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        config = _load_config(model_name_or_path)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_heads = text_config.num_attention_heads
        num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
        kv_replication(num_heads, num_kv_heads, sequence_parallel_size)  # raises when no rule fits
        core = ALL_ATTENTION_FUNCTIONS[core_attn_implementation] \
            if core_attn_implementation in ALL_ATTENTION_FUNCTIONS else None
        if core is None and core_attn_implementation == "eager":
            core = _model_eager_attention(model_name_or_path)
        if core is None:
            raise ValueError(f"core_attn_implementation {core_attn_implementation!r} is not a "
                             f"registered attention; choose one of "
                             f"{sorted(ALL_ATTENTION_FUNCTIONS.valid_keys())}")
        if isinstance(core, UlyssesSPAttentionHF):
            core = core.attn  # registering twice must not wrap the wrapper

        parallel_state.initialize_sequence_parallel(sequence_parallel_size)
        wrapper = cls(core, sequence_parallel_size, num_heads, num_kv_heads, seq_length=seq_length,
                      seq_length_is_variable=seq_length_is_variable,
                      micro_batch_size=micro_batch_size, disable_in_eval=disable_in_eval)
        if hasattr(model_name_or_path, "config"):
            ALL_ATTENTION_FUNCTIONS.register(ULYSSES_ATTENTION, wrapper)
            # the whole-sequence causal mask is applied inside the wrapper (is_causal)
            ALL_MASK_ATTENTION_FUNCTIONS.register(ULYSSES_ATTENTION, _no_mask)
            config._attn_implementation = ULYSSES_ATTENTION
        else:
            ALL_ATTENTION_FUNCTIONS.register(core_attn_implementation, wrapper)
        return parallel_state


def _model_eager_attention(model):
    """"eager" is not in transformers' registry: each modeling file has its own
    ``eager_attention_forward``; take the given model's."""
    import sys
    module = sys.modules.get(type(model).__module__) if hasattr(model, "config") else None
    return getattr(module, "eager_attention_forward", None)


def _no_mask(*args, attention_mask=None, **kwargs):
    """Mask builder for the ``ulysses`` implementation: causality is applied over the whole
    sequence after the all-to-all, so only a padding mask would need passing on; refuse one."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise NotImplementedError("Ulysses sequence parallelism does not support padding masks: "
                                  "drop attention_mask from the batch and mark padding with "
                                  "labels -100 instead")
    return None
