"""Names on disk: where each piece of a checkpoint lives, and how a tag becomes a directory.

    save_dir/
      latest                                 the tag of the newest complete checkpoint (text)
      <tag>/                                 default tag: global_step<engine.global_steps>
        mp_rank_00_model_states.pt           module, optimizer, scheduler, counters, client_state
        rng_state_rank_<global rank>.pt      python / numpy / torch / accelerator RNG, per rank
        ...                                  files plugins add (ZeRO optimizer shards, ...)

The ``mp_rank_XX_model_states.pt`` name and the ``latest`` file follow DeepSpeed, so offline
tools written for DeepSpeed checkpoints read ours. The per-rank RNG file is ours.
"""
import os

from deepspeed.checkpoint.atomic import is_temporary_name
from deepspeed.checkpoint.constants import MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX

LATEST_FILENAME = "latest"
DEFAULT_TAG_PREFIX = "global_step"
MODEL_STATES_SUFFIX = MODEL_FILE_SUFFIX


def default_tag(global_steps):
    return f"{DEFAULT_TAG_PREFIX}{global_steps}"


def model_states_filename(mp_rank=0):
    return f"{MODEL_FILE_PREFIX}{mp_rank:02d}{MODEL_FILE_SUFFIX}"


def rng_state_filename(global_rank):
    return f"rng_state_rank_{global_rank}.pt"


def normalize_tag(tag):
    """The tag as the directory name it becomes; ints (``save_checkpoint(d, 7)``) are allowed
    and cast to str, as DeepSpeed does. A tag must be one plain path component."""
    if isinstance(tag, bool) or not isinstance(tag, (str, int)):
        raise TypeError(f"checkpoint tag must be a str or int, got {type(tag).__name__} {tag!r}")
    text = str(tag)
    if (not text.strip() or text in (".", "..") or "/" in text or os.sep in text
            or (os.altsep and os.altsep in text) or "\0" in text):
        raise ValueError(f"checkpoint tag {text!r} is not a valid directory name: it must be "
                         f"non-empty, not '.' or '..', and contain no path separator")
    if text == LATEST_FILENAME or is_temporary_name(text):
        raise ValueError(f"checkpoint tag {text!r} is reserved for the checkpoint's own files")
    return text


def latest_path(save_dir):
    return os.path.join(os.fspath(save_dir), LATEST_FILENAME)


def read_latest(load_dir):
    """The tag named by ``load_dir/latest``, or None when there is no such file."""
    path = latest_path(load_dir)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tag = f.read().strip()
    if not tag:
        raise ValueError(f"'{path}' is empty; it should hold the tag of the latest checkpoint "
                         f"(one of {list_tags(load_dir)})")
    return tag


def list_tags(save_dir):
    """Sorted names of the checkpoint directories under ``save_dir`` (for error messages)."""
    save_dir = os.fspath(save_dir)
    if not os.path.isdir(save_dir):
        return []
    return sorted(name for name in os.listdir(save_dir)
                  if os.path.isdir(os.path.join(save_dir, name)) and not name.startswith("."))


def checkpoint_dir_for_load(load_dir, tag):
    """``load_dir/tag``, or FileNotFoundError naming what is missing and what exists."""
    load_dir = os.fspath(load_dir)
    if not os.path.isdir(load_dir):
        raise FileNotFoundError(f"checkpoint directory '{load_dir}' does not exist")
    path = os.path.join(load_dir, tag)
    if not os.path.isdir(path):
        tags = list_tags(load_dir)
        raise FileNotFoundError(
            f"checkpoint tag '{tag}' not found: '{path}' does not exist; checkpoints in "
            f"'{load_dir}': {tags if tags else 'none'}")
    return path


def required_file(checkpoint_dir, filename):
    path = os.path.join(checkpoint_dir, filename)
    if not os.path.isfile(path):
        present = sorted(n for n in os.listdir(checkpoint_dir) if not is_temporary_name(n))
        raise FileNotFoundError(f"checkpoint file '{path}' does not exist; "
                                f"'{checkpoint_dir}' holds: {present if present else 'nothing'}")
    return path
