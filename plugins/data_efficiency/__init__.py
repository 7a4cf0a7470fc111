"""``deepspeed.data_efficiency``: curriculum learning (legacy seqlen and data sampling), offline
data analysis, random layer-token drop and progressive layer drop. See README_SECTION.md.txt."""
from .curriculum_scheduler import CurriculumScheduler
from .data_analyzer import DataAnalyzer, DistributedDataAnalyzer
from .data_sampler import DeepSpeedDataSampler
from .indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder
from .progressive_layer_drop import ProgressiveLayerDrop
from .random_ltd import (RandomLayerTokenDrop, RandomLTDScheduler, convert_to_random_ltd,
                         remove_random_ltd_state_dict)
from .schedule_config import CurriculumConfigError

__all__ = ["CurriculumScheduler", "DataAnalyzer", "DistributedDataAnalyzer",
           "DeepSpeedDataSampler", "MMapIndexedDataset", "MMapIndexedDatasetBuilder",
           "ProgressiveLayerDrop", "RandomLayerTokenDrop", "RandomLTDScheduler",
           "convert_to_random_ltd", "remove_random_ltd_state_dict", "CurriculumConfigError"]
