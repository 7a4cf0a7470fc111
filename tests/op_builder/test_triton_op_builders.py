"""ds_report entries of the Triton ops (transformer kernel and its stochastic mode, Evoformer
attention, kernel injection's bias-GeLU, ZeRO++'s quantizer): discoverable by
op and class name, never pre-built, and honest about why the kernels cannot run here."""
import pytest
import torch

from deepspeed.ops.op_builder import OpBuildError, get_op_builder
from deepspeed.ops.triton_support import triton_status


@pytest.mark.parametrize("name,cls,kernels", [
    ("transformer", "TransformerBuilder", "deepspeed.ops.transformer.triton_ops"),
    ("evoformer_attn", "EvoformerAttnBuilder", "deepspeed.ops.deepspeed4science.triton_kernels"),
    ("stochastic_transformer", "StochasticTransformerBuilder", "deepspeed.ops.transformer.triton_ops"),
    ("transformer_inference", "TransformerInferenceBuilder", "deepspeed.inference.triton_bias_gelu"),
    ("quantizer", "QuantizerBuilder", "deepspeed.zero.zeropp.triton_quant"),
])
def test_triton_op_builders(name, cls, kernels, monkeypatch):
    builder_cls = get_op_builder(name)
    assert builder_cls is get_op_builder(cls) and builder_cls.NAME == name
    builder = builder_cls()
    assert builder.PREBUILDABLE is False and builder.absolute_name() == kernels
    with pytest.raises(OpBuildError, match="nothing to pre-build"):
        builder.builder()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not torch.cuda.is_available():
        assert not builder.is_compatible()
        assert builder.TORCH_PATH + " runs on CPU" in builder.incompatible_reason
        with pytest.raises(OpBuildError, match="cannot run here"):
            builder.load(verbose=False)
    if triton_status()[0]:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert builder.is_compatible() and builder.is_installed()
        assert builder.load(verbose=False).__name__ == kernels
