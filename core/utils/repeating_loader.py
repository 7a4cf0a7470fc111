"""``deepspeed.utils.RepeatingLoader``: a loader that starts over instead of ending, so a
``train_batch()`` loop never sees ``StopIteration`` (the pipeline tutorial wraps its loader in
it)."""


class RepeatingLoader:
    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
