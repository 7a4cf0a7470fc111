"""``InferenceEngine``: the module ``deepspeed.init_inference`` returns.

It converts the model to the configured dtype, splits it over the tensor-parallel group
(AutoTP, or the user's ``injection_policy``), and then runs it: ``engine(...)`` is
``engine.module(...)``, ``engine.generate(...)`` is the module's ``generate``.

Policies of this build:

- dtype: the documented default is fp16. On the CPU accelerator (or one without fp16 support)
  the *default* fp16 keeps the model's own dtype and logs one line saying so, so that
  ``init_inference(model)`` followed by ``engine(fp32 inputs)`` works as on upstream's GPUs; an
  fp16 the caller asked for explicitly is honoured (torch runs fp16 on CPU, slowly).
  ``torch.int8`` is int8 quantization (``deepspeed.inference.quantize``): the model computes in
  its own float dtype, its Linear weights are stored as int8 with per-group scales and (the
  documented default of ``quant.activation``) their inputs are quantized on the fly.
- ``replace_with_kernel_inject=True``: SDPA attention and, on GPU, fused bias-GeLU
  (``deepspeed.inference.kernel_inject``); on CPU AutoTP + SDPA with one log line.
- distributed: a process group is started (``deepspeed.comm.init_distributed``) only when
  ``tp_size > 1`` needs one; a single-process engine never starts one.
- ``enable_cuda_graph=True`` (GPU only, refused on CPU): ``engine(...)`` and greedy
  ``engine.generate(...)`` replay captured CUDA graphs (``deepspeed.inference.cuda_graph``).
- ``zero={"stage": 3, ...}`` (ZeRO-Inference): the parameters are partitioned over the ranks
  and gathered module by module as the model runs (a ZeRO-3 engine without an optimizer).
- ``set_empty_params=True``: every parameter is emptied before ``checkpoint`` fills it.
- a tensor-parallel ``checkpoint`` (``"type": "Megatron"``, ``training_mp_size``, or what
  ``save_mp_checkpoint_path`` wrote) is merged into whole tensors as it is read, each cut again
  for this engine's ``tp_size`` (``deepspeed.inference.merge``); ``save_mp_checkpoint_path``
  writes the split model, one file per tensor-parallel rank and a descriptor, after loading.
- ``min_out_tokens``: ``generate`` refuses an input that leaves fewer new tokens than that
  within ``max_out_tokens``.
"""
import torch
from torch import nn

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelDim
from deepspeed.inference.checkpoint import (checkpoint_shapes, checkpoint_source,
                                            empty_parameters, load_into)
from deepspeed.inference.config import DtypeEnum
from deepspeed.inference.cuda_graph import CudaGraphs, refuse_without_cuda
from deepspeed.inference.kernel_inject import inject
from deepspeed.inference.merge import mark_fused_qkv, fused_qkv_plan
from deepspeed.inference.moe_inference import (prepare_moe, shard_stacked_experts,
                                               slice_experts)
from deepspeed.inference.policies import as_linear_names
from deepspeed.inference.quantize import quantize_model
from deepspeed.inference.vocab_parallel import shard_vocab
from deepspeed.tensor_parallel import (AutoTP, TensorParallelError, policy_from_injection,
                                       shard_model)
from deepspeed.utils import logging as ds_logging

logger = ds_logging.logger


class InferenceEngine(nn.Module):
    """Wraps ``model`` for inference as ``config`` (a ``DeepSpeedInferenceConfig``) says;
    ``explicit`` is the set of keys the caller gave (for the default-dtype policy)."""

    def __init__(self, model, config, explicit=()):
        super().__init__()
        self._config = config
        self.module = model
        self.mp_group = None
        self.mp_world_size = 1
        self._check_unsupported(config)
        files, split, shapes, fused = None, 1, None, {}  # files checked before any change
        checkpoint, base_dir = _checkpoint_source(config)
        if checkpoint is not None:
            files, split, descriptor, where = checkpoint_source(checkpoint, base_dir,
                                                                config.training_mp_size)
            if split > 1:  # the pieces are joined into the unsplit model's shapes
                shapes = checkpoint_shapes(model)
            # Megatron's fused query_key_value: reordered to [q; k; v], split as fused
            fused = fused_qkv_plan(descriptor, model, where)
            mark_fused_qkv(model, fused)
        elif config.set_empty_params:
            raise ValueError("set_empty_params=True builds the model's parameters empty, to be "
                             "filled from checkpoint=...; give a checkpoint, or leave it False")
        self._convert_dtype(config, explicit)
        tp = config.tensor_parallel
        if tp.enabled and tp.tp_size > 1:
            self._split(model, config)
        self.moe_layers = prepare_moe(model, config.moe) if config.moe else []
        self.checkpoint_stats = None
        if files is not None:  # after the split: each rank reads only its shards
            if config.set_empty_params:  # nothing of the model's own values is kept
                empty_parameters(self.module)
            self.checkpoint_stats = load_into(self.module, files, split, shapes, fused)
        self.saved_checkpoint = self._save_split(config)
        self.injected = None
        if config.replace_with_kernel_inject:  # on CPU: one log line, AutoTP + SDPA
            from deepspeed.accelerator import get_accelerator

            on_gpu = get_accelerator().device_name() == "cuda" and torch.cuda.is_available()
            self.injected = inject(self.module, on_gpu, use_triton=config.use_triton)
        self.quantized = {}
        if config.dtype is DtypeEnum.int8:
            self.quantized = quantize_model(self.module, config.quant)
        self.module.eval()
        self.zero_engine = self._zero_inference(config) if config.zero else None
        self.cuda_graphs = CudaGraphs(self.module) if config.enable_cuda_graph else None

    @property
    def config(self):
        return self._config

    # ------------------------------------------------------------------ set-up
    def _save_split(self, config):
        """``save_mp_checkpoint_path``: the split model, one file per tensor-parallel rank
        and the descriptor that loads it (its path; None without the key)."""
        path = config.save_mp_checkpoint_path or config.checkpoint_config.save_mp_checkpoint_path
        if path is None:
            return None
        from deepspeed.inference.merge import save_split_checkpoint

        rank = dist.get_rank(group=self.mp_group) if self.mp_world_size > 1 else 0
        dtype = next((p.dtype for p in self.module.parameters()), torch.float32)
        return save_split_checkpoint(self.module, path, self.mp_world_size, rank, dtype,
                                     tp_group=self.mp_group)

    def _check_unsupported(self, config):
        if config.training_mp_size > 1 and _checkpoint_source(config)[0] is None:
            raise ValueError(
                f"training_mp_size={config.training_mp_size} says how many tensor-parallel "
                f"files a checkpoint holds, but no checkpoint= is given; pass the checkpoint "
                f"(one file per training rank) or leave training_mp_size at 1")
        if config.enable_cuda_graph and config.tensor_parallel.tp_size > 1:
            raise AssertionError("CUDA graphs are not supported with tensor parallelism "
                                 "(enable_cuda_graph=True and tensor_parallel.tp_size > 1)")
        if config.enable_cuda_graph:
            refuse_without_cuda()
        if config.use_triton:
            from deepspeed.accelerator import get_accelerator

            if not config.replace_with_kernel_inject:
                raise ValueError("use_triton=True runs the injected ops as Triton kernels: set "
                                 "replace_with_kernel_inject=True as well")
            if get_accelerator().device_name() != "cuda" or not torch.cuda.is_available():
                raise ValueError("use_triton=True needs a CUDA device (the Triton kernels of "
                                 "this build are GPU kernels); on CPU leave it False, kernel "
                                 "injection then falls back to AutoTP + SDPA")
        if config.min_out_tokens > config.max_out_tokens:
            raise ValueError(f"min_out_tokens={config.min_out_tokens} is more than "
                             f"max_out_tokens={config.max_out_tokens}: the engine could never "
                             f"generate that many; raise max_out_tokens")
        if config.zero:
            stage = int(config.zero.get("stage", 0))
            if stage != 3:
                raise ValueError(f"zero={config.zero!r}: ZeRO-Inference partitions the "
                                 f"parameters, which is ZeRO stage 3 (got stage {stage}); "
                                 f"give {{\"stage\": 3, ...}}")
            if config.tensor_parallel.tp_size > 1 or config.enable_cuda_graph:
                raise ValueError("zero= (ZeRO-Inference) does not combine with tensor_parallel "
                                 "or enable_cuda_graph: use one of them")

    def _convert_dtype(self, config, explicit):
        from deepspeed.accelerator import get_accelerator

        dtype = config.dtype
        if dtype is DtypeEnum.int8:  # weight-only: computes in the model's float dtype
            return
        accel = get_accelerator()
        if dtype is DtypeEnum.fp16 and "dtype" not in explicit \
                and (accel.device_name() == "cpu" or not accel.is_fp16_supported()):
            current = next((p.dtype for p in self.module.parameters()), torch.float32)
            logger.info(f"init_inference: the default dtype torch.float16 is not used on the "
                        f"{accel.device_name()} accelerator; keeping the model's {current} "
                        f"(pass dtype=torch.half, torch.bfloat16 or torch.float to choose)")
            return
        self.module.to(dtype.torch_dtype)

    def _split(self, model, config):
        tp = config.tensor_parallel
        if not dist.is_initialized():
            dist.init_distributed(verbose=False)
        world = dist.get_world_size()
        if tp.tp_group is not None:
            group = tp.tp_group
            size = dist.get_world_size(group=group)
            if size != tp.tp_size:
                raise TensorParallelError(f"tensor_parallel.tp_group has {size} ranks but "
                                          f"tp_size is {tp.tp_size}")
            rank = dist.get_rank(group=group)
        elif tp.mpu is not None:
            group = tp.mpu.get_model_parallel_group()
            rank = tp.mpu.get_model_parallel_rank()
        else:
            if world % tp.tp_size:
                raise TensorParallelError(f"tensor_parallel.tp_size={tp.tp_size} does not divide "
                                          f"the world size {world}")
            group = self._new_tp_group(world, tp.tp_size)
            rank = dist.get_rank() % tp.tp_size
        if config.injection_policy:
            policy = policy_from_injection(as_linear_names(config.injection_policy))
        else:
            policy = AutoTP.tp_parser(model)
        shard_model(model, policy, tp.tp_size, rank, group)
        self.vocab_split = shard_vocab(model, tp.tp_size, rank, group)
        self.experts_split = (shard_stacked_experts(model, tp.tp_size, rank, group)
                              + slice_experts(model, tp.tp_size, rank, group))
        self.mp_group = group
        self.mp_world_size = tp.tp_size
        self.policy = policy

    @staticmethod
    def _new_tp_group(world, tp_size):
        """This rank's group of ``tp_size`` consecutive ranks, as the topology dimension
        ``"inference.tensor"`` (None: the world group)."""
        if tp_size == world:
            return None  # the world group
        dim, = topology.current().add(ParallelDim(
            "inference.tensor",
            [range(start, start + tp_size) for start in range(0, world, tp_size)]))
        return dim.group

    def _zero_inference(self, config):
        """``zero={"stage": 3, ...}``: the model's parameters are partitioned over the ranks
        and gathered module by module as it runs (ZeRO-3 without an optimizer: every
        ``zero_optimization`` key applies, ``offload_param`` included)."""
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=self.module, config={"train_micro_batch_size_per_gpu": 1,
                                       "zero_optimization": dict(config.zero)})
        return engine

    # ------------------------------------------------------------------ running
    def forward(self, *inputs, **kwargs):
        if self.cuda_graphs is not None:
            return self.cuda_graphs.forward(inputs, kwargs)
        if self.zero_engine is not None:
            return self.zero_engine(*inputs, **kwargs)
        return self.module(*inputs, **kwargs)

    def generate(self, *inputs, **kwargs):
        """The wrapped model's ``generate``; an input longer than ``max_out_tokens`` is a
        ``RuntimeError``."""
        generate = getattr(self.module, "generate", None)
        if generate is None:
            raise AttributeError(f"{type(self.module).__name__} has no generate method")
        ids = inputs[0] if inputs else kwargs.get("input_ids")
        if torch.is_tensor(ids) and ids.dim() >= 1 and ids.shape[-1] > self._config.max_out_tokens:
            raise RuntimeError(f"input of {ids.shape[-1]} tokens is longer than max_out_tokens="
                               f"{self._config.max_out_tokens}")
        if torch.is_tensor(ids) and ids.dim() >= 1 \
                and ids.shape[-1] + self._config.min_out_tokens > self._config.max_out_tokens:
            raise RuntimeError(
                f"an input of {ids.shape[-1]} tokens leaves room for "
                f"{self._config.max_out_tokens - ids.shape[-1]} new tokens within max_out_tokens="
                f"{self._config.max_out_tokens}, fewer than min_out_tokens="
                f"{self._config.min_out_tokens}; shorten the input or raise max_out_tokens")
        if self.cuda_graphs is not None:
            return self.cuda_graphs.generate(inputs, kwargs)
        return generate(*inputs, **kwargs)


def _checkpoint_source(config):
    """``(checkpoint, base_dir)``: the top-level keys, else ``checkpoint_config``'s
    ``checkpoint_dir`` / ``base_dir`` (the documented sub-section naming the same things)."""
    sub = config.checkpoint_config
    checkpoint = config.checkpoint if config.checkpoint is not None else sub.checkpoint_dir
    return checkpoint, config.base_dir or sub.base_dir or ""
