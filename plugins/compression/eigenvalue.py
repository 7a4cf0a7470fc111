"""Eigenvalue-based MoQ (``quantize_training.eigenvalue``): how sensitive each layer is.

A layer's sensitivity is the top eigenvalue (largest in magnitude) of the Hessian of the loss
with respect to its parameters, found by power iteration on Hessian-vector products
(``torch.autograd.grad`` of the gradient, computed with ``create_graph``): at most ``max_iter``
products, stopping once the estimate moves by less than ``tol`` relative to itself;
``stability`` keeps the normalisations away from zero. The layers are the children
``layer_name.0`` .. ``layer_name.{layer_num - 1}`` of the module list at ``layer_name`` (all of
them when ``layer_num`` is 0).

MoQ then stretches each layer's quantization period at every bit drop by
``1 + floor(4 * eigenvalue / largest eigenvalue)``: up to 5x for the most sensitive layer, as
the MoQ tutorial documents. A NaN / infinite eigenvalue becomes the largest finite one (1.0
when none is finite).
"""
import math
from typing import Dict, List, Tuple

import torch

# the random start vector comes from its own generator: estimating never moves training's RNG
START_SEED = 0


def sensitive_layers(module, config) -> List[Tuple[str, torch.nn.Module]]:
    """``[(qualified name, layer), ...]`` of the layers ``layer_name`` / ``layer_num`` name."""
    try:
        scope = module.get_submodule(config.layer_name)
    except AttributeError:
        raise ValueError(f"quantize_training.eigenvalue.layer_name: the model has no submodule "
                         f"'{config.layer_name}' (set it to the module list holding the layers, "
                         f"e.g. 'bert.encoder.layer')") from None
    layers = list(scope.named_children())
    if config.layer_num:
        if config.layer_num > len(layers):
            raise ValueError(f"quantize_training.eigenvalue.layer_num={config.layer_num}, but "
                             f"'{config.layer_name}' holds {len(layers)} layers")
        layers = layers[:config.layer_num]
    return [(f"{config.layer_name}.{name}", layer) for name, layer in layers]


def _normalized(vectors, stability):
    norm = math.sqrt(sum(float((v * v).sum()) for v in vectors))
    return [v / (norm + stability) for v in vectors]


def power_iteration(loss, params, config):
    """``(eigenvalue, products)``: the largest-magnitude eigenvalue of d²loss/dparams² and the
    number of Hessian-vector products it took (``config``: ``max_iter``, ``tol``,
    ``stability``). ``loss`` keeps its graph: the caller may still call ``backward`` on it."""
    params = [p for p in params if p.requires_grad]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    generator = torch.Generator(device="cpu").manual_seed(START_SEED)
    vectors = _normalized([torch.randn(p.shape, generator=generator).to(p) for p in params],
                          config.stability)
    eigenvalue, products = None, 0
    while products < config.max_iter:
        hessian_v = torch.autograd.grad(grads, params, grad_outputs=vectors, retain_graph=True)
        products += 1
        estimate = sum(float((h * v).sum()) for h, v in zip(hessian_v, vectors))
        vectors = _normalized([h.detach() for h in hessian_v], config.stability)
        converged = eigenvalue is not None and \
            abs(estimate - eigenvalue) / (abs(estimate) + config.stability) < config.tol
        eigenvalue = estimate
        if converged:
            break
    return eigenvalue, products


def layer_eigenvalues(loss, layers, config) -> Dict[str, float]:
    """``{layer name: |top eigenvalue|}`` of each layer, NaN / infinite ones replaced."""
    found = {name: abs(power_iteration(loss, layer.parameters(), config)[0])
             for name, layer in layers}
    finite = [value for value in found.values() if math.isfinite(value)]
    fallback = max(finite) if finite else 1.0
    return {name: value if math.isfinite(value) else fallback for name, value in found.items()}


def period_factors(eigenvalues: Dict[str, float]) -> Dict[str, int]:
    """``{layer: 1 + floor(4 * eigenvalue / largest)}``: how much longer each layer's period
    grows at a bit drop than the plain schedule's."""
    largest = max(eigenvalues.values(), default=0.0)
    if largest <= 0:
        return dict.fromkeys(eigenvalues, 1)
    return {name: 1 + int(math.floor(4 * value / largest)) for name, value in eigenvalues.items()}
