"""Feed Ulysses ranks: each rank's batch is shared with its sequence-parallel group and every
shared batch is handed out as one sequence slice per rank.

Labels are shifted *before* slicing (``shift_labels``, last position -100): shifting inside a
slice would lose the label of each slice's last token, which belongs to the next rank.
"""
import torch

from deepspeed import comm as dist
from deepspeed.sequence.parallel_state import check_size

IGNORE_INDEX = -100


def _to_cpu(batch):
    return {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in batch.items()}


class UlyssesSPDataLoaderAdapter:

    def __init__(self, dl, sp_rank, sp_group, sp_world_size, device):
        check_size("sp_world_size", sp_world_size)
        if not 0 <= sp_rank < sp_world_size:
            raise ValueError(f"sp_rank {sp_rank} is outside 0..{sp_world_size - 1}")
        self.dl = dl
        self.sp_rank, self.sp_group, self.sp_world_size = sp_rank, sp_group, sp_world_size
        self.device = torch.device(device) if device is not None else None

    def __len__(self):
        return len(self.dl) * self.sp_world_size

    def __getattr__(self, name):
        # sampler, dataset, batch_size...: the wrapped loader's (Trainer/Accelerate inspect them)
        if name == "dl":
            raise AttributeError(name)
        return getattr(self.dl, name)

    def __iter__(self):
        for batch in self.dl:
            if not isinstance(batch, dict):
                raise TypeError("UlyssesSPDataLoaderAdapter needs batches that are dicts of tensors "
                                f"(input_ids, labels, ...), got {type(batch).__name__}")
            gathered = [None] * self.sp_world_size
            if self.sp_world_size > 1:
                dist.all_gather_object(gathered, _to_cpu(batch), group=self.sp_group)
            else:
                gathered = [_to_cpu(batch)]
            for shared in gathered:
                yield self._shard(shared)

    def _shard(self, batch):
        if "input_ids" not in batch:
            raise KeyError(f"the batch has no input_ids (keys: {sorted(batch)}); the adapter slices "
                           "every tensor along input_ids' sequence dimension")
        input_ids = batch["input_ids"]
        bs, seqlen = input_ids.shape[:2]
        if seqlen % self.sp_world_size != 0:
            raise ValueError(f"sequence length {seqlen} is not divisible by sequence_parallel_size "
                             f"{self.sp_world_size}; pad the batches to a multiple of it")
        batch = dict(batch)
        labels = batch.pop("labels", None)
        if "shift_labels" not in batch:
            if labels is None:
                raise KeyError("the batch has neither labels nor shift_labels: Ulysses needs the "
                               "labels shifted over the whole sequence before it is sliced")
            pad = torch.full((bs, 1), IGNORE_INDEX, dtype=labels.dtype)
            batch["shift_labels"] = torch.cat([labels[:, 1:], pad], dim=1)
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(seqlen).unsqueeze(0).expand(bs, seqlen).clone()
        mask = batch.get("attention_mask")
        if torch.is_tensor(mask) and bool(mask.all()):
            batch.pop("attention_mask")  # all-ones: the Ulysses attention is causal by itself
        chunk = seqlen // self.sp_world_size
        start = self.sp_rank * chunk
        out = {}
        for key, value in batch.items():
            if torch.is_tensor(value) and value.dim() >= 2 and value.shape[1] == seqlen:
                value = value[:, start:start + chunk].contiguous()
            if torch.is_tensor(value) and self.device is not None:
                value = value.to(self.device)
            out[key] = value
        return out
