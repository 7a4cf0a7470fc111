"""Which environment variables reach the workers.

Locally the workers inherit the runner's environment; remote nodes start from a login shell, so
the variables that matter (PYTHONPATH, NCCL_*, PYTHON*, ...) and the user's `.deepspeed_env`
entries must be exported explicitly by the multi-node command.
"""
import os

from deepspeed.launcher.constants import DEEPSPEED_ENVIRONMENT_NAME, DS_ENV_FILE_VAR, EXPORT_ENVS


def parse_env_file(lines, source):
    """`VAR=VALUE` lines to a dict; `#` comment lines and blank lines are skipped."""
    values = {}
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if line.startswith("export "):
            key = key[len("export "):].strip()
        if not sep or not key or not (key.replace("_", "a").isalnum() and not key[0].isdigit()):
            raise ValueError(f"{source} line {lineno}: {raw.strip()!r} is not a VAR=VALUE line")
        values[key] = value
    return values


def env_file_paths(environ=None, cwd=None):
    """Files read in order, later overriding earlier: ~/.deepspeed_env, ./.deepspeed_env, $DS_ENV_FILE."""
    environ = os.environ if environ is None else environ
    paths = [os.path.join(os.path.expanduser("~"), DEEPSPEED_ENVIRONMENT_NAME),
             os.path.join(cwd or os.getcwd(), DEEPSPEED_ENVIRONMENT_NAME)]
    explicit = environ.get(DS_ENV_FILE_VAR)
    if explicit:
        if not os.path.isfile(explicit):
            raise ValueError(f"{DS_ENV_FILE_VAR}={explicit!r} does not name an existing file")
        paths.append(explicit)
    seen, ordered = set(), []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            ordered.append(path)
    return ordered


def load_deepspeed_env(environ=None, cwd=None):
    """Merge every existing `.deepspeed_env` file into one dict (most specific file wins)."""
    values = {}
    for path in env_file_paths(environ, cwd):
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                values.update(parse_env_file(handle.readlines(), source=path))
    return values


def exports_for_remote(environ, deepspeed_env, cwd):
    """Variables a remote node must receive: PYTHONPATH with cwd first, prefixed vars, .deepspeed_env."""
    exports = {}
    pythonpath = environ.get("PYTHONPATH", "")
    exports["PYTHONPATH"] = cwd + (os.pathsep + pythonpath if pythonpath else "")
    for key, value in environ.items():
        if key != "PYTHONPATH" and key.startswith(EXPORT_ENVS):
            exports[key] = value
    exports.update(deepspeed_env)
    return exports
