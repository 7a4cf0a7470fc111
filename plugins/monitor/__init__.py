"""``deepspeed.monitor``: training events to TensorBoard, Weights & Biases, CSV files and Comet."""
