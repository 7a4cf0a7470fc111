from deepspeed.data_efficiency.random_ltd.basic_layer import RandomLayerTokenDrop  # noqa: F401
