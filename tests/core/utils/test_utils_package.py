"""What importing `deepspeed.utils` costs and binds, checked in fresh interpreters (the names a
package binds depend on what was imported before, which one test process cannot undo)."""
import subprocess
import sys


def _run(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_importing_the_package_does_not_import_torch():
    """The launcher's processes log through deepspeed.utils and never touch a tensor."""
    assert _run("import sys, deepspeed.utils\nprint('torch' in sys.modules)").strip() == "False"


def test_helpers_load_on_first_use_whatever_was_imported_before():
    """`z3_leaf_module` is both a function of the package and the name of its module: the
    function must win even when the module was imported first (as the zero plugin does)."""
    out = _run("import inspect\n"
               "import deepspeed.utils.z3_leaf_module\n"
               "import deepspeed.utils.tensor_fragment\n"
               "from deepspeed.utils import z3_leaf_module, safe_get_full_grad, RepeatingLoader\n"
               "print(inspect.isfunction(z3_leaf_module), inspect.isfunction(safe_get_full_grad),\n"
               "      inspect.isclass(RepeatingLoader))\n")
    assert out.split() == ["True", "True", "True"]
