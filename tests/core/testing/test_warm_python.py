"""The warm Python server: a program started under it behaves, seen from outside and from inside,
as it would in a fresh interpreter (arguments, environment, descriptors, exit status, signals),
only without importing torch; whatever it cannot reproduce starts normally."""
import getpass
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from deepspeed.testing import warm_python

PROGRAM = textwrap.dedent("""
    import json, os, sys
    warm = "torch" in sys.modules          # before this program imported anything
    record = {"warm": warm, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
              "name": __name__, "file": __file__, "marker": os.environ.get("WARM_TEST_MARKER"),
              "stdin": sys.stdin.readline().strip(), "pid": os.getpid(),
              "affinity": sorted(os.sched_getaffinity(0)), "umask": os.umask(0o22)}
    if len(sys.argv) > 2 and sys.argv[1] == "--fd":
        os.write(int(sys.argv[2]), b"through an inherited descriptor")
    print(json.dumps(record))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("WARM_TEST_EXIT", "0")))
""")


@pytest.fixture(scope="module")
def server_env():
    """An environment pointing at a server of its own (not the session's, if any)."""
    env = {k: v for k, v in os.environ.items() if k != warm_python.ENV}
    env["PYTHONPATH"] = warm_python.pythonpath_without_site(env.get("PYTHONPATH", ""))
    # as a fresh shell has it: an import in this process (torch._inductor's) may have set it, and
    # then the server's preloads would not read the user name they derive it from
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    stop = warm_python.start_server(env=env)
    assert warm_python.wait_until_ready(env, timeout=120)
    yield dict(env)
    stop()
    assert warm_python.ENV not in env and warm_python.SITE_DIR not in env.get("PYTHONPATH", "")


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return path


def _run(env, *args, **kwargs):
    return subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=60, **kwargs)


def test_a_script_runs_warm_with_its_arguments_environment_and_streams(server_env, program,
                                                                         tmp_path):
    env = dict(server_env, WARM_TEST_MARKER="m1", WARM_TEST_EXIT="3")
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, 0o755)
    result = _run(env, "-u", program, "a", "b c", input="line one\n", cwd=work)
    assert result.returncode == 3, result.stderr
    record = json.loads(result.stdout)
    assert record["warm"] is True
    assert record["argv"] == [str(program), "a", "b c"]
    assert record["cwd"] == str(work)
    assert record["path0"] == str(program.parent)
    assert record["name"] == "__main__" and record["file"] == str(program)
    assert record["marker"] == "m1" and record["stdin"] == "line one"
    assert record["affinity"] == sorted(os.sched_getaffinity(0))
    assert result.stderr == "to stderr\n"
    mask = os.umask(0)
    os.umask(mask)
    assert record["umask"] == mask


def test_the_same_script_with_c_or_changed_import_time_variables_starts_fresh(server_env, program):
    fresh = _run(dict(server_env, PYTHONHASHSEED="123"), program, input="\n")
    assert json.loads(fresh.stdout)["warm"] is False
    code = "import sys; print('torch' in sys.modules)"
    assert _run(server_env, "-c", code).stdout.strip() == "False"


def test_a_module_runs_as_main_with_the_working_directory_first_on_the_path(server_env, tmp_path):
    (tmp_path / "warm_probe_mod.py").write_text(
        "import json, sys\nprint(json.dumps([__name__, sys.argv, sys.path[0]]))\n")
    result = _run(server_env, "-m", "warm_probe_mod", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    name, argv, path0 = json.loads(result.stdout)
    assert name == "__main__"
    assert argv == [str(tmp_path / "warm_probe_mod.py"), "x"]
    assert path0 == str(tmp_path)


def test_descriptors_the_parent_passes_reach_the_program(server_env, program):
    read, write = os.pipe()
    try:
        result = _run(server_env, program, "--fd", write, pass_fds=(write,), input="\n")
        os.close(write)
        write = None
        assert result.returncode == 0, result.stderr
        assert os.read(read, 100) == b"through an inherited descriptor"
    finally:
        os.close(read)
        if write is not None:
            os.close(write)


def test_an_uncaught_exception_exits_1_with_its_traceback(server_env, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom here')\nf()\n")
    result = _run(server_env, script)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ValueError: boom here" in result.stderr
    assert "warm_python" not in result.stderr  # the program's own frames only, as when fresh


def _sleeper(tmp_path, env):
    script = tmp_path / "sleeper.py"
    pid_file = tmp_path / "pid"
    script.write_text("import os, sys, time\n"
                      f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
                      f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
                      "time.sleep(120)\n")
    client = subprocess.Popen([sys.executable, str(script)], env=env)
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert time.monotonic() < deadline and client.poll() is None, "the program never started"
        time.sleep(0.05)
    return client, int(pid_file.read_text())


def _gone(pid, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_a_signal_to_the_client_reaches_the_program_and_both_end_by_it(server_env, tmp_path):
    client, pid = _sleeper(tmp_path, server_env)
    assert pid != client.pid  # the program is the server's fork, the client only relays
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM
    assert _gone(pid)


def test_a_killed_client_takes_its_program_along(server_env, tmp_path):
    client, pid = _sleeper(tmp_path, server_env)
    client.kill()
    client.wait(timeout=30)
    assert _gone(pid)


def _inductor_cache_dir():
    """The value torch sets TORCHINDUCTOR_CACHE_DIR to when transformers' Trainer is imported
    without it."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()


HF_PROGRAM = textwrap.dedent("""
    import json, sys
    record = {"torch": "torch" in sys.modules, "trainer": "transformers.trainer" in sys.modules}
    import transformers  # noqa: this import line is what sends the script to the hf server
    print(json.dumps(record))
""")


def test_a_script_importing_transformers_finds_it_imported_unless_an_import_time_variable_differs(
        server_env, program, tmp_path):
    pytest.importorskip("transformers")
    script = tmp_path / "hf_prog.py"
    script.write_text(HF_PROGRAM)
    assert warm_python.wait_until_ready(server_env, timeout=120, flavour="hf")
    assert json.loads(_run(server_env, script).stdout) == {"torch": True, "trainer": True}
    # as a program started by one that imported transformers sees it: the cache folder torch
    # set while importing is its own value, no difference
    inherited = dict(server_env, TORCHINDUCTOR_CACHE_DIR=_inductor_cache_dir())
    assert json.loads(_run(inherited, script).stdout) == {"torch": True, "trainer": True}
    # the terminal's size, read while importing only to size output, does not matter
    sized = dict(server_env, COLUMNS="7", LINES="3")
    assert json.loads(_run(sized, script).stdout) == {"torch": True, "trainer": True}
    # huggingface_hub reads HF_HUB_OFFLINE while importing: the plain server runs it instead
    offline = _run(dict(server_env, HF_HUB_OFFLINE="1"), script)
    assert json.loads(offline.stdout) == {"torch": True, "trainer": False}, offline.stderr
    # a script that does not import them never sees them
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\nprint(sorted(m for m in sys.modules if 'transformers' in m))\n")
    assert _run(server_env, plain).stdout.strip() == "[]"


WATCHED_PROGRAM = textwrap.dedent("""
    import json, sys
    print(json.dumps({name: name in sys.modules for name in ("torch._dynamo", "pydantic")}))
""")


def test_a_plain_script_finds_the_watched_preloads_imported_unless_a_variable_they_read_differs(
        server_env, tmp_path):
    script = tmp_path / "plain_watched.py"
    script.write_text(WATCHED_PROGRAM)
    assert json.loads(_run(server_env, script).stdout) == {"torch._dynamo": True, "pydantic": True}
    # torch._dynamo reads TORCH_COMPILE_DISABLE while importing: a fresh interpreter runs it
    fresh = {"torch._dynamo": False, "pydantic": False}
    changed = "0" if server_env.get("TORCH_COMPILE_DISABLE") == "1" else "1"
    assert json.loads(_run(dict(server_env, TORCH_COMPILE_DISABLE=changed), script).stdout) == fresh
    # the user name counts by what getpass.getuser() makes of it: an ssh login sets USER and
    # LOGNAME for the same user, which the server's environment may lack
    me = getpass.getuser()
    login = dict(server_env, USER=me, LOGNAME=me)
    assert json.loads(_run(login, script).stdout) == {"torch._dynamo": True, "pydantic": True}
    assert json.loads(_run(dict(server_env, LOGNAME=f"not-{me}"), script).stdout) == fresh
    # triton (which torch._dynamo imports) decides then whether its kernels are interpreted
    interpret = "0" if server_env.get("TRITON_INTERPRET") == "1" else "1"
    assert json.loads(_run(dict(server_env, TRITON_INTERPRET=interpret), script).stdout) == fresh
