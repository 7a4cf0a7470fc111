"""The small seeded MLP and regression data that many tests train, defined once.

Importable from every test as ``from tiny_models import mlp, regression_data``: ``tests/`` holds
the root ``conftest.py`` (and no ``__init__.py``), so pytest puts it on ``sys.path`` before any
test module is imported, and the ``dist_pool`` rank processes start with that ``sys.path``.

Both are deterministic: ``mlp`` reseeds the global RNG before building (the same weights in
every process and every call), ``regression_data`` draws from its own generator (the global RNG
is left alone). A test that needs a model of a particular shape on purpose (tied weights,
frozen or unused layers, odd bucket sizes) keeps its own class; this module is only for the
plain ``Linear -> activation -> Linear`` stack.
"""
import torch


def mlp(*sizes, activation=torch.nn.ReLU, dropout=None, seed=0):
    """``Linear(sizes[0], sizes[1]) -> activation() [-> Dropout(dropout)] -> Linear(sizes[1],
    sizes[2]) ...`` as a ``torch.nn.Sequential``, built right after ``torch.manual_seed(seed)``
    (``seed=None``: without touching the global RNG). ``mlp(8, 16, 4)`` is
    ``Sequential(Linear(8, 16), ReLU(), Linear(16, 4))``, so ``model[0]`` and ``model[2]`` are
    its Linears (``model[3]`` the last one with ``dropout``)."""
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least an input and an output size, got {sizes}")
    if seed is not None:
        torch.manual_seed(seed)
    layers = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        if index:
            layers.append(activation())
            if dropout is not None:
                layers.append(torch.nn.Dropout(dropout))
        layers.append(torch.nn.Linear(fan_in, fan_out))
    return torch.nn.Sequential(*layers)


def regression_data(rows, in_features, out_features, seed=1):
    """``(x, y)``: ``rows`` standard-normal inputs ``(rows, in_features)`` and targets
    ``(rows, out_features)``, both drawn, in that order, from one generator seeded ``seed``.
    The targets depend on ``rows``: slice one draw rather than drawing per piece."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, in_features, generator=g),
            torch.randn(rows, out_features, generator=g))
