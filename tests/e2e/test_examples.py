"""Every example listed in ``examples/README.md`` runs, with its smallest settings.

One mechanism for all of them: the README's command gives the script and the number of ranks,
``SMALLEST`` the arguments that make the run short, and the script runs as ``__main__`` on that
many fresh processes of ``deepspeed.testing``'s pool, each with the environment the ``deepspeed``
launcher gives a rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_*``,
``--local_rank=N``) and no process group yet, so the script starts up exactly as under the
launcher, without the launcher's own start-up cost (the launcher itself has its tests in
``tests/core/launcher`` and ``tests/e2e/test_cli.py``).

Examples that another test already runs under the launcher (with assertions on their output)
are not run twice: ``RUN_ELSEWHERE`` names that test, and a check here keeps the list honest.
Examples too heavy to run in full in the suite are also in ``HEAVY`` with the reason (a test
runs them with their smallest settings), and run in full with ``DS_TEST_HEAVY_EXAMPLES=1``.
"""
import os
import re
import shlex
from pathlib import Path

import pytest

from deepspeed.testing import run_distributed

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HELPERS = {"common.py", "gpt.py"}  # modules the scripts import, not examples themselves

# script -> arguments (after the README's own) that keep the run short
SMALLEST = {
    "examples/onebit/train_onebit.py": ["--steps", "30", "--print_every", "10"],
    "examples/sparse_attention/train.py": ["--steps", "3"],
    "examples/sequence/long_context_llama.py": ["--seq", "256", "--chunk", "64", "--steps", "1"],
    # 2 x 40 steps: ZenFlow ends 4% above ZeRO-Offload (the script's check: within 50%)
    "examples/zenflow/train_zenflow.py": ["--steps", "40", "--window", "10", "--print_every",
                                          "20", "--tolerance", "0.5"],
}
# script -> the test that runs it under the launcher already (file::test function)
RUN_ELSEWHERE = {
    "examples/train_demo.py": "tests/e2e/test_cli.py::test_readme_demo_trains_on_two_processes",
    "examples/pipeline/train.py":
        "tests/e2e/test_cli.py::test_pipeline_example_trains_two_stages_on_two_processes",
    "examples/moe/train.py":
        "tests/e2e/test_cli.py::test_moe_example_trains_expert_parallel_on_two_processes",
    "examples/compression/train.py": "tests/plugins/compression/test_compression_example.py::"
                                     "test_example_compresses_cleans_and_reloads",
    "examples/data_efficiency/train.py":
        "tests/plugins/data_efficiency/test_data_efficiency_example.py::"
        "test_example_trains_with_curriculum_and_random_ltd",
    "examples/deepspeed4science/evoformer_attention.py":
        "tests/core/ops/test_kernel_examples.py::test_evoformer_example_matches_the_naive_form",
    "examples/transformer_kernel/train.py":
        "tests/core/ops/test_kernel_examples.py::test_transformer_kernel_example_trains_on_two_ranks",
    "examples/domino/train.py":
        "tests/plugins/domino/test_domino_example.py::test_example_trains_domino_on_two_processes",
    "examples/inference/generate.py": "tests/plugins/inference/test_inference_example.py::"
        "test_example_generates_the_single_process_tokens_on_two_processes",
    "examples/tensor_parallel/train.py":
        "tests/plugins/tensor_parallel/test_tp_hf_trainer.py::test_example_trains_on_two_processes",
    "examples/zeropp/train.py": "tests/plugins/zero/test_zeropp_example.py::test_the_example_trains",
    "examples/sequence/hf_trainer_alst.py": "tests/plugins/sequence/test_sequence_hf_trainer.py::"
                                            "test_trainer_with_accelerate_sp_equals_single_process",
    "examples/elasticity/train.py":
        "tests/plugins/elasticity/test_elastic_launch.py::test_two_one_two_workers",
    # the README's command with the example's config narrowed to 2 experiments (its smallest
    # settings); the whole 12-experiment search is HEAVY below
    "examples/autotuning/ds_config.json":
        "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
}
# script (or command) -> why the suite does not run it in full by default (a test above runs
# it with its smallest settings)
HEAVY = {
    "examples/autotuning/ds_config.json":
        "autotuning starts a 2-rank launcher job per experiment (a profiling run and up to "
        "3 micro-batch sizes x 4 ZeRO stages, 11-12 min here); RUN_ELSEWHERE's test runs the "
        "example's config narrowed to 2 experiments",
}


def listed_commands():
    """``{script: command}`` for every row of examples/README.md's table (the command is the
    one in backquotes in the row's Command column)."""
    commands = {}
    for line in (EXAMPLES / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[2].startswith("`"):
            continue
        command = cells[2].strip("`")
        paths = [t for t in shlex.split(command) if t.startswith("examples/")]
        assert paths, f"no examples/ path in the README command {command!r}"
        key = next((p for p in paths if p.endswith(".json")), paths[-1]) \
            if "--autotuning" in command else paths[0]
        commands[key] = command
    return commands


def _example_files():
    return sorted(str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*.py")
                  if p.name not in HELPERS)


def test_the_readme_lists_every_example_and_each_is_run_somewhere():
    commands = listed_commands()
    missing = sorted(set(_example_files()) - set(commands))
    assert not missing, f"examples/README.md does not list {missing}"
    for script in commands:
        assert (ROOT / script).is_file(), f"examples/README.md lists {script}, which is gone"
    covered = set(SMALLEST) | set(RUN_ELSEWHERE) | set(HEAVY)
    assert set(commands) == covered, (set(commands) ^ covered)
    assert not set(SMALLEST) & set(RUN_ELSEWHERE)
    for script, node in RUN_ELSEWHERE.items():
        path, function = node.split("::")
        text = (ROOT / path).read_text()
        assert re.search(rf"^def {function}\(", text, re.M), f"{node} does not exist"
        parts = script.split("/")[1:]  # named as one path, or as path parts joined in code
        assert "/".join(parts) in text or all(f'"{part}"' in text for part in parts), \
            f"{node} does not run {script}"


@pytest.mark.parametrize("script", ["examples/tensor_parallel/train.py",
                                    "examples/sequence/hf_trainer_alst.py"])
def test_an_example_without_its_extra_says_how_to_install_it(script, monkeypatch):
    """The core install lacks transformers/accelerate: the example stops before anything
    starts, naming what is missing and the command that installs it."""
    import runpy
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    monkeypatch.setattr(sys, "argv", [str(ROOT / script)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        with pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:  # the examples' helper module must not stay importable as "common"
        if str(EXAMPLES) in str(getattr(sys.modules.get("common"), "__file__", "")):
            del sys.modules["common"]
    message = str(stopped.value.code)
    assert f"{Path(script).name} needs transformers, which is not installed" in message
    assert "pip install -c constraints.txt -e '.[examples]'" in message


def _run_example(script, args, workdir):
    """One rank of an example: the launcher's environment is set by the pool; output goes to
    ``rank<N>.log`` in ``workdir`` (returned), whose tail is raised with a failure."""
    import runpy
    import sys

    rank = int(os.environ["RANK"])
    os.chdir(workdir)
    log_path = os.path.join(workdir, f"rank{rank}.log")
    log = open(log_path, "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.argv = [str(ROOT / script), f"--local_rank={os.environ['LOCAL_RANK']}", *args]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script} exited with {exc.code!r}:\n{_tail(log_path)}") from None
    except BaseException as exc:
        raise RuntimeError(f"{script} failed ({exc!r}):\n{_tail(log_path)}") from exc
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return _tail(log_path)


def _tail(path, lines=40):
    with open(path, errors="replace") as handle:
        return "".join(handle.readlines()[-lines:])


def _ranks(command):
    tokens = shlex.split(command)
    if tokens[0] != "deepspeed":
        return 1
    return int(tokens[tokens.index("--num_gpus") + 1]) if "--num_gpus" in tokens else 1


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_example_runs_with_its_smallest_settings(script, tmp_path):
    command = listed_commands()[script]
    tokens = shlex.split(command)
    args = tokens[tokens.index(script) + 1:] + SMALLEST[script]
    outputs = run_distributed(_run_example, world_size=_ranks(command), fresh=True, init=False,
                              args=(script, args, str(tmp_path)), timeout=280)
    assert all(isinstance(out, str) for out in outputs)


@pytest.mark.skipif(not os.environ.get("DS_TEST_HEAVY_EXAMPLES"),
                    reason="heavy examples run with DS_TEST_HEAVY_EXAMPLES=1 (see HEAVY)")
@pytest.mark.parametrize("script", sorted(HEAVY))
def test_heavy_example_runs(script, tmp_path):
    import subprocess
    import sys

    command = listed_commands()[script]
    tokens = shlex.split(command)
    tokens[0] = str(Path(sys.executable).parent / tokens[0])
    proc = subprocess.run(tokens, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
