"""Injection policies named by class, as the API reference writes them:
``init_inference(model, injection_policy={BertLayer: deepspeed.inference.HFBertLayerPolicy})``.

A policy says how one kind of transformer layer is split over the tensor-parallel ranks: the
Linear layers that write into the residual stream (``row_parallel``, paths inside the layer)
are split by rows and their outputs all-reduced; every other Linear of the layer is split by
columns. That is all a split needs here (kernel injection swaps attention for SDPA and fuses
the MLP's bias-GeLU on any layer, see ``kernel_inject``), so ``injection_policy`` also accepts
the names directly, ``{BertLayer: ("attention.output.dense", "output.dense")}``;
``as_linear_names`` turns the policy classes of a mapping into those names.
"""


class InjectionPolicy:
    """Base of the policy classes: ``row_parallel`` lists the Linears inside the layer whose
    outputs are summed over the tensor-parallel ranks."""

    row_parallel = ()


class HFBertLayerPolicy(InjectionPolicy):
    """Hugging Face BERT-style layers (``BertLayer``, ``RobertaLayer``, ...): the attention's
    output projection ``attention.output.dense`` and the MLP's ``output.dense`` are split by
    rows; the query / key / value projections and ``intermediate.dense`` by columns."""

    row_parallel = ("attention.output.dense", "output.dense")


def as_linear_names(injection_policy):
    """``injection_policy`` with every policy class value (an ``InjectionPolicy`` subclass)
    replaced by its ``row_parallel`` names; other values pass unchanged (the tensor-parallel
    policy check reports a value it cannot use)."""
    return {layer: (value.row_parallel if isinstance(value, type)
                    and issubclass(value, InjectionPolicy) else value)
            for layer, value in injection_policy.items()}
