"""Build metadata under upstream's name (``deepspeed.git_version_info``), which launch scripts,
bug-report tools and tests read to learn what they run on.

``version`` is the API level (``deepspeed.__version__``). ``git_hash`` / ``git_branch`` are the
commit and branch the package was built from: recorded in a wheel at build time (setup.py, see
``deepspeed.utils.build_info``), else read from the checkout an editable install runs from,
else ``"unknown"``. ``installed_ops`` / ``compatible_ops`` map each op builder's name to whether
an ahead-of-time build is importable / whether this machine can build it (the builder's own
``is_installed()`` / ``is_compatible()``; ``deepspeed.ops.__compatible_ops__`` is the latter).
``torch_info`` describes the torch this process runs, which just-in-time builds compile
against: ``version`` (major.minor), ``bf16_support`` (the accelerator's answer), and the
``cuda_version`` / ``nccl_version`` / ``hip_version`` torch was built with ("0.0" for none).

Everything but ``version`` is computed on first access (git and compiler probes take time) and
kept for the process; ``op_status()`` computes the op tables afresh.
"""
import importlib
import os

from deepspeed.utils.build_info import INSTALLED_MODULE, checkout_info
from deepspeed.version import __version__ as version

_COMPUTED = ("git_hash", "git_branch", "installed_ops", "compatible_ops", "torch_info")


def git_info():
    """``(git_hash, git_branch)``: the build's record when the package was built as a wheel,
    else the source checkout's (``core/`` lies in the repository root of an editable install)."""
    try:
        built = importlib.import_module(f"deepspeed.{INSTALLED_MODULE}")
    except ModuleNotFoundError:
        return checkout_info(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return built.git_hash, built.git_branch


def op_status():
    """``(installed_ops, compatible_ops)``: ``{op name: bool}`` for every registered op builder
    the current accelerator creates. A builder that cannot be created, or whose check raises,
    is not compatible (``ds_report`` shows why)."""
    from deepspeed.accelerator import get_accelerator, installed_op_builders

    installed, compatible = {}, {}
    for class_name in installed_op_builders():
        try:
            builder = get_accelerator().create_op_builder(class_name)
        except Exception:  # a broken builder module: reported by ds_report, not buildable here
            builder = None
        if builder is None:
            continue
        name = builder.NAME
        installed[name] = bool(builder.is_installed())
        try:
            compatible[name] = bool(builder.is_compatible(verbose=False))
        except Exception:  # a third-party check that raises cannot vouch for its op
            compatible[name] = False
    return installed, compatible


def _major_minor(text):
    return ".".join(str(text).split(".")[:2]) if text else "0.0"


def torch_details():
    """``torch_info``'s dict for the running torch and accelerator."""
    import torch

    from deepspeed.accelerator import get_accelerator

    nccl = "0.0"
    if torch.version.cuda and torch.cuda.is_available():
        found = torch.cuda.nccl.version()
        nccl = ".".join(str(part) for part in found[:2]) if isinstance(found, tuple) else \
            f"{found // 1000}.{found % 1000 // 100}"
    return {"version": _major_minor(torch.__version__.split("+")[0]),
            "bf16_support": bool(get_accelerator().is_bf16_supported()),
            "cuda_version": _major_minor(torch.version.cuda),
            "nccl_version": nccl,
            "hip_version": _major_minor(getattr(torch.version, "hip", None))}


def __getattr__(name):
    if name not in _COMPUTED:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    computed = globals()
    if name in ("git_hash", "git_branch"):
        computed["git_hash"], computed["git_branch"] = git_info()
    elif name in ("installed_ops", "compatible_ops"):
        computed["installed_ops"], computed["compatible_ops"] = op_status()
    else:
        computed["torch_info"] = torch_details()
    return computed[name]


def __dir__():
    return sorted(set(globals()) | set(_COMPUTED))


__all__ = ["version", *_COMPUTED]
