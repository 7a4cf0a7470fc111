"""``deepspeed.utils.z3_leaf_module``: upstream's import path of ZeRO-3's leaf-module marker.

The real module is ``deepspeed.zero.z3_leaf_module`` (only ZeRO-3 reads the mark); setup.py maps
this folder onto upstream's name (see UPSTREAM_PATHS there). The functions are also names of
``deepspeed.utils`` itself (``deepspeed.utils.set_z3_leaf_modules``), exported there through the
entry-point group ``deepspeed.exports.utils``.
"""
from deepspeed.zero.z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_modules,
                                           set_z3_leaf_modules_by_name, unset_z3_leaf_modules,
                                           z3_leaf_module, z3_leaf_parameter)

__all__ = ["get_z3_leaf_modules", "set_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "unset_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]

# deepspeed.utils keeps its function z3_leaf_module when this module is imported (upstream binds
# the function last); see deepspeed.utils._PackageWhereExportsWin
EXPORTED_NAME_WINS = True
