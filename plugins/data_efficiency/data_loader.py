"""The loader ``deepspeed.initialize(training_data=...)`` returns when curriculum data sampling
is enabled: a ``torch.utils.data.DataLoader`` over ``DeepSpeedDataSampler`` batches that
applies the user's post-process function (``engine.set_data_post_process_func``) with the
sampler's state, and counts the micro batches it handed out, which is all a checkpoint needs to
resume the same sample order (the sampler replays its draws up to that count).
"""
from torch.utils.data import DataLoader


class CurriculumDataLoader:
    def __init__(self, dataset, sampler, collate_fn=None, num_workers=0, pin_memory=False):
        self.dataset = dataset
        self.data_sampler = sampler
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.post_process_func = None
        self.micro_batches = 0

    def __len__(self):
        return len(self.data_sampler)

    def __iter__(self):
        self.data_sampler.fast_forward(self.micro_batches)
        loader = DataLoader(self.dataset, batch_sampler=self.data_sampler,
                            collate_fn=self.collate_fn, num_workers=self.num_workers,
                            pin_memory=self.pin_memory)
        for batch in loader:
            self.micro_batches += 1
            if self.post_process_func is not None:
                batch = self.post_process_func(batch, self.data_sampler.state_dict())
            yield batch

    def state_dict(self):
        return {"micro_batches": self.micro_batches}

    def load_state_dict(self, state):
        self.micro_batches = int(state["micro_batches"])
