from deepspeed.data_efficiency.data_sampler import DeepSpeedDataSampler  # noqa: F401
