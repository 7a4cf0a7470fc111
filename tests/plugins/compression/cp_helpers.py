"""Small models and configs shared by the compression tests (no downloads)."""
import contextlib
import logging

import torch


def tiny_bert(layers=2, hidden=32, heads=4, intermediate=64, labels=2, seed=0, vocab=50):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate,
                        max_position_embeddings=32, num_labels=labels,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    return BertForSequenceClassification(config).eval()


class TinyCNN(torch.nn.Module):
    def __init__(self, bn=False, seed=0):
        torch.manual_seed(seed)
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8) if bn else torch.nn.Identity()
        self.conv2 = torch.nn.Conv2d(8, 6, 3, padding=1)
        self.fc = torch.nn.Linear(6, 2)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def section(**techniques):
    """``{"compression_training": {...}}`` from technique -> (shared, groups)."""
    body = {}
    for name, (shared, groups) in techniques.items():
        body[name] = {"shared_parameters": {"enabled": True, **shared},
                      "different_groups": groups}
    return {"compression_training": body}


def group(modules, related=None, **params):
    out = {"params": params, "modules": modules}
    if related is not None:
        out["related_modules"] = related
    return out


@contextlib.contextmanager
def logged_lines():
    """The messages DeepSpeed's logger emits (INFO and up) inside the block, as a list."""
    from deepspeed.utils.logging import logger

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
