from deepspeed.data_efficiency.random_ltd.helper import convert_to_random_ltd, remove_random_ltd_state_dict  # noqa: F401
