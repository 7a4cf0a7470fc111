from deepspeed.data_efficiency.random_ltd.scheduler import RandomLTDScheduler  # noqa: F401
