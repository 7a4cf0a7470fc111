"""Builder entries of ops written in Triton (transformer kernel and its stochastic mode,
Evoformer attention, sparse attention, kernel injection's bias-GeLU, ZeRO++'s quantizer).

Triton compiles its kernels itself at first launch: there is no C++ to build ahead of time
(``PREBUILDABLE = False``: ``DS_BUILD_<OP>`` skips it with that reason) and nothing to JIT through
ninja. The entries exist so that ``ds_report`` says whether the Triton kernels can run here and
why not; the op's torch path runs everywhere else, on CPU always.
"""
import importlib
import importlib.util
import os

from .builder import OpBuilder, OpBuildError


class TritonOpBuilder(OpBuilder):
    """Subclasses set NAME, KERNELS (the kernels' module) and TORCH_PATH (what runs instead)."""

    PREBUILDABLE = False
    KERNELS = ""
    TORCH_PATH = "the torch path"
    INSTALL_HINT = "pip install triton"

    def missing(self):
        """Reasons beyond triton/CUDA why the kernels cannot run (a subclass's own needs)."""
        return []

    def absolute_name(self):
        return self.KERNELS

    def sources(self):
        return []

    def is_installed(self):
        """triton and the kernels' module are both importable (nothing else is installed)."""
        return (importlib.util.find_spec("triton") is not None
                and importlib.util.find_spec(self.KERNELS.rpartition(".")[0]) is not None)

    def is_compatible(self, verbose=False):
        reasons = self.missing()
        if importlib.util.find_spec("triton") is None:
            reasons.append(f"triton is not installed ({self.INSTALL_HINT}); {self.TORCH_PATH} is "
                           f"used instead")
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
            reasons.append("torch is not installed")
        if not has_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            reasons.append(f"no CUDA device: the Triton kernels need a GPU (or TRITON_INTERPRET=1 for "
                           f"the slow interpreter); {self.TORCH_PATH} runs on CPU")
        self.incompatible_reason = "; ".join(reasons)
        if reasons and verbose:
            from deepspeed.utils.logging import logger

            logger.warning("%s is not compatible: %s", self.NAME, self.incompatible_reason)
        return not reasons

    def load(self, verbose=True):
        """The Triton kernels' module."""
        if not self.is_compatible(verbose=verbose):
            raise OpBuildError(f"op '{self.NAME}' cannot run here: {self.incompatible_reason}")
        return importlib.import_module(self.absolute_name())

    def jit_load(self, verbose=True):
        return self.load(verbose=verbose)

    def builder(self):
        raise OpBuildError(f"op '{self.NAME}' is Triton code compiled at first launch; there is "
                           f"nothing to pre-build")


class TransformerBuilder(TritonOpBuilder):
    NAME = "transformer"
    KERNELS = "deepspeed.ops.transformer.triton_ops"
    TORCH_PATH = "the torch path (SDPA, fused LayerNorm)"


class EvoformerAttnBuilder(TritonOpBuilder):
    NAME = "evoformer_attn"
    KERNELS = "deepspeed.ops.deepspeed4science.triton_kernels"
    TORCH_PATH = "the chunked torch path"


class StochasticTransformerBuilder(TransformerBuilder):
    """The transformer kernel in stochastic mode (``DeepSpeedTransformerConfig(stochastic_mode=
    True)``): the same Triton kernels; stochastic mode lets attention dropout draw its own masks
    instead of replaying recorded ones, which the layer decides, not the build."""

    NAME = "stochastic_transformer"


class TransformerInferenceBuilder(TritonOpBuilder):
    """Kernel injection's fused bias + GeLU (``init_inference(replace_with_kernel_inject=True)``)."""

    NAME = "transformer_inference"
    KERNELS = "deepspeed.inference.triton_bias_gelu"
    TORCH_PATH = "torch's gelu(x @ W + b)"

    def missing(self):
        if importlib.util.find_spec("deepspeed.inference") is None:
            return ["the inference plugin is not installed"]
        return []


class QuantizerBuilder(TritonOpBuilder):
    """The int8 block quantize / dequantize kernels of ZeRO++'s quantized weights (qwZ) and
    frozen weights (MixZ++)."""

    NAME = "quantizer"
    KERNELS = "deepspeed.zero.zeropp.triton_quant"
    TORCH_PATH = "the torch block quantizer (same integers)"

    def missing(self):
        if importlib.util.find_spec("deepspeed.zero") is None:
            return ["the zero plugin is not installed"]
        return []
