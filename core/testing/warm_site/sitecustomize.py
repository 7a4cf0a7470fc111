"""Client half of the warm Python server (``deepspeed.testing.warm_python``).

A test suite that starts many Python programs (the ``deepspeed`` launcher's ranks, example
scripts, trainers) pays ~2.5 CPU s per program to import torch. When ``DS_WARM_PYTHON`` names a
server's socket, this module, which every interpreter runs at start-up because its folder is on
``PYTHONPATH``, hands the program (argv, environment, working directory, open file
descriptors, sys.path) to a server that imported torch once; the server forks a copy that runs
the program, and this process only relays signals and the exit status. Anything this cannot
reproduce exactly (``-c``, ``-W``, ``-X``, another interpreter or namespace, import-time
variables that differ) falls back to the normal start-up, silently: the interpreter simply
goes on. Standard library only, and nothing imported before the decision: it runs in every
Python started under the suite.
"""
import os
import sys

try:
    import _ds_warm_python_client

    _ds_warm_python_client.hand_over()
except Exception as error:  # never stop an interpreter from starting: say why, start normally
    sys.stderr.write(f"warm python: starting normally ({type(error).__name__}: {error})\n")


def _chain_next_sitecustomize():
    """Run the sitecustomize this file shadows (a distribution's), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain_next_sitecustomize()
