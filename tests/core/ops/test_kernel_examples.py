"""The tutorials' examples run: the transformer-kernel BERT trains through the ``deepspeed``
launcher on 2 CPU ranks with every memory flag on, and the Evoformer row-wise call (bf16) matches
the fp32 naive form (each script exits non-zero otherwise)."""
import os
import subprocess
import sys
from pathlib import Path

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_transformer_kernel_example_trains_on_two_ranks():
    launcher = Path(sys.executable).parent / "deepspeed"
    proc = subprocess.run([str(launcher), "--num_gpus", "2", "--master_port", str(find_free_port()),
                           str(ROOT / "examples" / "transformer_kernel" / "train.py"),
                           "--deepspeed_transformer_kernel", "--pre_layer_norm", "--normalize_invertible",
                           "--gelu_checkpoint", "--attention_dropout_checkpoint"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "DeepSpeedTransformerLayer: loss" in out


def test_evoformer_example_matches_the_naive_form():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "deepspeed4science" / "evoformer_attention.py"),
                           "--n-seq", "4", "--n-res", "64"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "max error vs fp32 naive" in proc.stdout
