"""``deepspeed.checkpoint.ds_to_universal``: upstream's import path of the ZeRO -> universal
checkpoint converter.

The real module is ``deepspeed.zero.ds_to_universal``; setup.py maps this folder onto upstream's
name (see UPSTREAM_PATHS there), because ``deepspeed.checkpoint`` is a core package and the core
never imports a plugin. ``python -m deepspeed.checkpoint.ds_to_universal`` runs the converter
(``__main__``), like the ``ds_to_universal`` console script.
"""
from deepspeed.zero.ds_to_universal import convert, main, parse_arguments, resolve_input

__all__ = ["convert", "main", "parse_arguments", "resolve_input"]
