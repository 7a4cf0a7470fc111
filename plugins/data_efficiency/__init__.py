"""``deepspeed.data_efficiency``: curriculum learning (legacy seqlen and data sampling), offline
data analysis, random layer-token drop and progressive layer drop. See README.md."""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "CurriculumScheduler": "deepspeed.data_efficiency.curriculum_scheduler",
    "DataAnalyzer": "deepspeed.data_efficiency.data_analyzer",
    "DistributedDataAnalyzer": "deepspeed.data_efficiency.data_analyzer",
    "DeepSpeedDataSampler": "deepspeed.data_efficiency.data_sampler",
    "MMapIndexedDataset": "deepspeed.data_efficiency.indexed_dataset",
    "MMapIndexedDatasetBuilder": "deepspeed.data_efficiency.indexed_dataset",
    "ProgressiveLayerDrop": "deepspeed.data_efficiency.progressive_layer_drop",
    "RandomLayerTokenDrop": "deepspeed.data_efficiency.random_ltd",
    "RandomLTDScheduler": "deepspeed.data_efficiency.random_ltd",
    "convert_to_random_ltd": "deepspeed.data_efficiency.random_ltd",
    "remove_random_ltd_state_dict": "deepspeed.data_efficiency.random_ltd",
    "CurriculumConfigError": "deepspeed.data_efficiency.schedule_config",
}

__all__ = ["CurriculumScheduler", "DataAnalyzer", "DistributedDataAnalyzer",
           "DeepSpeedDataSampler", "MMapIndexedDataset", "MMapIndexedDatasetBuilder",
           "ProgressiveLayerDrop", "RandomLayerTokenDrop", "RandomLTDScheduler",
           "convert_to_random_ltd", "remove_random_ltd_state_dict", "CurriculumConfigError"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
