from deepspeed.data_efficiency.indexed_dataset import *  # noqa: F401,F403
from deepspeed.data_efficiency.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder  # noqa: F401
