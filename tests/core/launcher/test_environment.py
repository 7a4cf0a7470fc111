"""`.deepspeed_env` files and the variables exported to remote nodes."""
import pytest

from deepspeed.launcher.environment import (exports_for_remote, load_deepspeed_env,
                                            parse_env_file)


def test_parse_env_file():
    lines = ["# comment", "", "NCCL_DEBUG=INFO", "export A_B=x=y", "EMPTY="]
    assert parse_env_file(lines, "f") == {"NCCL_DEBUG": "INFO", "A_B": "x=y", "EMPTY": ""}


@pytest.mark.parametrize("line", ["NOEQUALS", "=value", "1BAD=x", "BAD-NAME=x"])
def test_bad_env_lines_name_file_and_line(line):
    with pytest.raises(ValueError, match="envfile line 2"):
        parse_env_file(["OK=1", line], "envfile")


def test_cwd_file_overrides_home_and_ds_env_file_overrides_both(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (home / ".deepspeed_env").write_text("A=home\nB=home\n")
    (cwd / ".deepspeed_env").write_text("B=cwd\nC=cwd\n")
    assert load_deepspeed_env({}, str(cwd)) == {"A": "home", "B": "cwd", "C": "cwd"}
    explicit = tmp_path / "explicit"
    explicit.write_text("C=explicit\n")
    assert load_deepspeed_env({"DS_ENV_FILE": str(explicit)}, str(cwd))["C"] == "explicit"
    with pytest.raises(ValueError, match="DS_ENV_FILE"):
        load_deepspeed_env({"DS_ENV_FILE": str(tmp_path / "missing")}, str(cwd))


def test_remote_exports():
    environ = {"PYTHONPATH": "/lib", "NCCL_IB_DISABLE": "1", "UCX_TLS": "tcp", "HOME": "/root"}
    exports = exports_for_remote(environ, {"MY_VAR": "1"}, "/work")
    assert exports == {"PYTHONPATH": "/work:/lib", "NCCL_IB_DISABLE": "1", "UCX_TLS": "tcp",
                       "MY_VAR": "1"}
