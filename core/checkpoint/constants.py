"""Names of a checkpoint folder's files and of the keys inside them, under upstream's constant
names (``deepspeed.checkpoint.constants``), so tools written against upstream find our files.

Every name here is one this package writes (or, for ``BF16_ZERO_FILE_PREFIX``, reads): the
model-states files (``deepspeed.checkpoint.layout``), the ZeRO plugin's optimizer files, the
pipeline plugin's per-layer files, and the universal checkpoints' tensor files
(``deepspeed.checkpoint.universal``). The writers take their names from here.
"""
# ---------------------------------------------------------------- files
MODEL_FILE_PREFIX = "mp_rank_"  # mp_rank_XX_model_states.pt
MODEL_FILE_SUFFIX = "_model_states.pt"
ZERO_FILE_PREFIX = "zero_pp_rank_"  # zero_pp_rank_<dp>_mp_rank_XX_optim_states.pt
BF16_ZERO_FILE_PREFIX = "bf16_" + ZERO_FILE_PREFIX  # upstream's bf16 optimizer files (read)
OPTIM_FILE_SUFFIX = "_optim_states.pt"
LAYER_FILE_PREFIX = "layer_"  # layer_XX[-model_YY]-model_states.pt
LAYER_FILE_PREFIX_PATTERN = r"layer_(\d+)-model_.*$"

# ---------------------------------------------------------------- keys of the model-states file
DS_VERSION = "ds_version"
PARAM_SHAPES = "param_shapes"
BUFFER_NAMES = "buffer_names"
FROZEN_PARAM_SHAPES = "frozen_param_shapes"

# ---------------------------------------------------------------- keys of a ZeRO optimizer file
OPTIMIZER_STATE_DICT = "optimizer_state_dict"
PARTITION_COUNT = "partition_count"
SINGLE_PARTITION_OF_FP32_GROUPS = "single_partition_of_fp32_groups"  # this rank's fp32 partitions
ZERO_STAGE = "zero_stage"
PARAM_GROUPS = "param_groups"
LOSS_SCALER = "loss_scaler"

# ---------------------------------------------------------------- universal checkpoint tensors
PARAM = "param"  # zero/<name>/<key>.pt holds {PARAM: tensor}
FP32_WEIGHT_KEY = "fp32"  # zero/<name>/fp32.pt: the fp32 master weight
