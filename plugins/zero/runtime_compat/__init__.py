"""``deepspeed.runtime.zero``: upstream's import paths for ZeRO, re-exporting ``deepspeed.zero``
(setup.py maps this folder there; see RUNTIME_COMPAT)."""
