"""tools/import_profile.py: samples of a py-spy raw profile per kind of process, and the share
spent importing, by the package imported."""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[3] / "tools" / "import_profile.py"

POOL = 'process 1:"python -m pytest";process 2:"python -c from multiprocessing.forkserver import main"'
WARM = 'process 1:"python -m pytest";process 3:"python /x/core/testing/warm_python.py /tmp/s.sock torch"'
RAW = "\n".join([
    # a rank importing transformers' llama model through transformers' lazy module
    f"{POOL};_run_task (core/testing/_worker.py:153);_LazyModule._get_module (transformers/utils/import_utils.py:2933);"
    "<module> (transformers/models/llama/modeling_llama.py:24);<module> (transformers/activations.py:3) 30",
    # the same rank computing
    f"{POOL};_run_task (core/testing/_worker.py:153);Linear.forward (torch/nn/modules/linear.py:134) 50",
    # a warm program whose optimizer imports torch._dynamo
    f"{WARM};<module> (train.py:9);SGD.__init__ (torch/optim/sgd.py:65);_find_and_load (<frozen importlib._bootstrap>:1176);"
    "<module> (torch/_dynamo/__init__.py:13) 20",
    "",
]) + "\n"


def test_the_shares_per_process_kind_and_imported_package(tmp_path):
    raw = tmp_path / "spy.txt"
    raw.write_text(RAW)
    out = subprocess.run([sys.executable, str(TOOL), str(raw)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    pool = next(line.split() for line in lines if line.startswith("pool "))
    assert pool[1:] == ["80", "80.0%", "37.5%"]  # 30 of its 80 samples import
    warm = next(line.split() for line in lines if line.startswith("warm ") and "%" in line)
    assert warm[1:] == ["20", "20.0%", "100.0%"]
    assert "all importing: 50.0% of 100 samples" in out
    assert any(line.split()[:4] == ["pool", "transformers/models", "30", "30.0%"] for line in lines)
    assert any(line.split()[:4] == ["warm", "torch/_dynamo", "20", "20.0%"] for line in lines)
