"""The 1-bit optimizers' ``optimizer.type`` names under upstream's constant names
(``deepspeed.runtime.config.ONEBIT_ADAM_OPTIMIZER`` ...): exported there through the entry-point
group ``deepspeed.exports.runtime.config``, and the keys of the plugin's optimizer table."""
ONEBIT_ADAM_OPTIMIZER = "onebitadam"
ZERO_ONE_ADAM_OPTIMIZER = "zerooneadam"
ONEBIT_LAMB_OPTIMIZER = "onebitlamb"

__all__ = ["ONEBIT_ADAM_OPTIMIZER", "ZERO_ONE_ADAM_OPTIMIZER", "ONEBIT_LAMB_OPTIMIZER"]
