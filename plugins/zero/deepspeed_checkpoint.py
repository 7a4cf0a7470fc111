"""``deepspeed.checkpoint.DeepSpeedCheckpoint``: what a checkpoint tag folder holds and the
parallel shape it was saved with, read from the files themselves (upstream's class of this job,
which conversion and inspection tools construct on a folder).

    ckpt = DeepSpeedCheckpoint("<save_dir>/<tag>")
    ckpt.original_tp_degree, ckpt.original_pp_degree, ckpt.original_dp_degree
    ckpt.layer_keys            # ["layer_00", "layer_01", ...] of a pipeline checkpoint
    ckpt.get_zero_checkpoint_state(pp_index=0, tp_index=0, dp_index=1)

The degrees come from the model-states file: ``mp_world_size`` (every model-parallel rank,
tensor and pipeline together), ``pipeline_stages`` (a pipeline's stage count, written by the
pipe plugin) and ``dp_world_size``. Model-parallel rank ``r`` wrote ``mp_rank_<r>`` files:
the tensor-parallel rank without a pipeline, the stage without tensor parallelism. Asking for
other degrees (``tp_degree=...``) only reports the change (``is_change_*``); the re-cut itself
is ``ds_to_universal`` plus ``load_universal``, so a changed shape's per-rank readers refuse.
It lives in the ZeRO plugin with ``ds_to_universal``, which reads the same files.
"""
import os
import re

from deepspeed.checkpoint import CheckpointFormatError, load_file
from deepspeed.checkpoint.atomic import is_temporary_name
from deepspeed.checkpoint.constants import (LAYER_FILE_PREFIX, MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX,
                                            OPTIMIZER_STATE_DICT)
from deepspeed.checkpoint.layout import model_states_filename
from deepspeed.zero.checkpointing import optim_states_filename
from deepspeed.zero.zero_to_fp32 import OPTIM_FILE_RE, PIPELINE_STAGES

_LAYER_KEY = re.compile(rf"^({re.escape(LAYER_FILE_PREFIX)}\d+)-")


class DeepSpeedCheckpoint:
    """One checkpoint tag folder (see the module docstring)."""

    def __init__(self, dir, tp_degree=None, pp_degree=None, dp_degree=None):
        self.dir = os.fspath(dir)
        if not os.path.isdir(self.dir):
            raise FileNotFoundError(f"checkpoint folder '{self.dir}' does not exist (pass a tag "
                                    f"folder, e.g. <save_dir>/global_step10)")
        self.file_list = sorted(
            os.path.join(root, name) for root, _, names in os.walk(self.dir)
            for name in names if not is_temporary_name(name))
        base = {path: os.path.basename(path) for path in self.file_list}
        self.mp_rank_files = [p for p, n in base.items()
                              if n.startswith(MODEL_FILE_PREFIX) and n.endswith(MODEL_FILE_SUFFIX)]
        self.layer_files = [p for p, n in base.items() if _LAYER_KEY.match(n)]
        self.zero_files = [p for p, n in base.items() if OPTIM_FILE_RE.match(n)]
        first = os.path.join(self.dir, model_states_filename(0))
        if first not in self.mp_rank_files:
            raise CheckpointFormatError(
                f"'{self.dir}' is not a DeepSpeed checkpoint tag folder: it has no "
                f"{model_states_filename(0)} (it holds {sorted(base.values())[:10] or 'nothing'})")
        self.model_states = load_file(first)
        self.layer_keys = sorted({_LAYER_KEY.match(base[p]).group(1) for p in self.layer_files})
        self.layer_count = len(self.layer_keys)

        stages = int(self.model_states.get(PIPELINE_STAGES) or 1)
        model_parallel = int(self.model_states.get("mp_world_size", 1))
        self.original_pp_degree = stages
        self.original_tp_degree = max(model_parallel // stages, 1)
        self.original_dp_degree = int(self.model_states.get("dp_world_size", 1))
        self.tp_degree = tp_degree or self.original_tp_degree
        self.pp_degree = pp_degree or self.original_pp_degree
        self.dp_degree = dp_degree or self.original_dp_degree
        self.original_world_size = (self.original_tp_degree * self.original_pp_degree
                                    * self.original_dp_degree)
        self.world_size = self.tp_degree * self.pp_degree * self.dp_degree

    # ------------------------------------------------------------------ shape
    def is_change_tp_degree(self):
        return self.tp_degree != self.original_tp_degree

    def is_change_pp_degree(self):
        return self.pp_degree != self.original_pp_degree

    def is_change_dp_degree(self):
        return self.dp_degree != self.original_dp_degree

    def get_iteration(self):
        """The optimizer steps taken when the checkpoint was saved."""
        return int(self.model_states.get("global_steps", 0))

    def get_checkpoint_info(self, info_key=None):
        """The model-states file's entry ``info_key`` (the whole file's dict without one)."""
        return self.model_states if info_key is None else self.model_states.get(info_key)

    # ------------------------------------------------------------------ files of one rank
    def _model_parallel_rank(self, tp_index, pp_index):
        if self.is_change_tp_degree() or self.is_change_pp_degree():
            raise ValueError(
                f"'{self.dir}' was saved with tensor-parallel degree {self.original_tp_degree} "
                f"and {self.original_pp_degree} pipeline stages; reading it at "
                f"{self.tp_degree} x {self.pp_degree} needs a re-cut: convert it with "
                f"ds_to_universal and load it with \"checkpoint\": {{\"load_universal\": true}}")
        if not (0 <= tp_index < self.tp_degree and 0 <= pp_index < self.pp_degree):
            raise IndexError(f"tp_index {tp_index} / pp_index {pp_index} outside the saved "
                             f"degrees {self.tp_degree} x {self.pp_degree}")
        if self.tp_degree > 1 and self.pp_degree > 1:
            raise NotImplementedError(
                f"'{self.dir}' mixes tensor parallelism and pipeline stages, whose per-rank "
                f"files this reader does not map (ds_to_universal refuses them too)")
        return tp_index if self.pp_degree == 1 else pp_index

    def get_2d_parallel_state(self, tp_index, pp_index):
        """The model-states file written by that tensor-parallel rank / pipeline stage."""
        mp_rank = self._model_parallel_rank(tp_index, pp_index)
        return load_file(self._existing(model_states_filename(mp_rank)))

    def get_layer_files(self, layer_key):
        """The files of one layer (``"layer_03"``): one per tensor-parallel rank."""
        return [p for p in self.layer_files if _LAYER_KEY.match(os.path.basename(p)).group(1)
                == layer_key]

    def get_zero_checkpoint_state(self, pp_index, tp_index, dp_index):
        """The ZeRO optimizer state (``optimizer_state_dict``) that data-parallel rank
        ``dp_index`` of that model-parallel slice saved."""
        mp_rank = self._model_parallel_rank(tp_index, pp_index)
        if self.is_change_dp_degree() or not 0 <= dp_index < self.dp_degree:
            raise ValueError(f"dp_index {dp_index} at data-parallel degree {self.dp_degree}: "
                             f"'{self.dir}' holds the partitions of {self.original_dp_degree} "
                             f"ranks (ZeRO re-partitions them on load with elastic_checkpoint)")
        return load_file(self._existing(optim_states_filename(dp_index, mp_rank)))[
            OPTIMIZER_STATE_DICT]

    def _existing(self, name):
        path = os.path.join(self.dir, name)
        if path not in self.file_list:
            raise FileNotFoundError(f"'{path}' does not exist; '{self.dir}' holds "
                                    f"{[os.path.basename(p) for p in self.file_list][:12]}")
        return path

    def __repr__(self):
        return (f"DeepSpeedCheckpoint('{self.dir}': tp={self.original_tp_degree}, "
                f"pp={self.original_pp_degree}, dp={self.original_dp_degree}, "
                f"{self.layer_count} layer keys, {len(self.zero_files)} ZeRO files)")


__all__ = ["DeepSpeedCheckpoint"]
