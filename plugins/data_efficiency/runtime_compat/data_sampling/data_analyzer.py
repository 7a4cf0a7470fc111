from deepspeed.data_efficiency.data_analyzer import DataAnalyzer, DistributedDataAnalyzer  # noqa: F401
