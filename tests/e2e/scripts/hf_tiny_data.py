"""The random token dataset every HF e2e script trains on (run as scripts, they find this module
next to themselves on sys.path)."""
import torch


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n=32, seq=16):
        self.x = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}
