"""``get_model_profile``: profile one inference forward (or ``generate``) of a model."""
import torch

from deepspeed.profiling.flops_profiler.profiler import FlopsProfiler
from deepspeed.profiling.flops_profiler.units import (macs_to_string, number_to_string,
                                                      params_to_string)

_MODES = ("forward", "generate")


def _model_dtype_device(model):
    for param in model.parameters():
        return param.dtype, param.device
    return torch.get_default_dtype(), torch.device("cpu")


def _inputs(model, input_shape, args, kwargs):
    if input_shape is None:
        assert args or kwargs, "args and/or kwargs must be specified if input_shape is None"
        return list(args), dict(kwargs)
    assert isinstance(input_shape, tuple), "input_shape must be a tuple"
    assert len(input_shape) >= 1, "input_shape must have at least one element"
    dtype, device = _model_dtype_device(model)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return [torch.randn(input_shape, dtype=dtype, device=device)], {}


def get_model_profile(model, input_shape=None, args=[], kwargs={}, print_profile=True,
                      detailed=True, module_depth=-1, top_modules=1, warm_up=1, as_string=True,
                      output_file=None, ignore_modules=None, mode="forward"):
    """Profile ``model`` on a random tensor of ``input_shape`` (its only positional argument) or
    on ``args``/``kwargs``, after ``warm_up`` unprofiled passes; return ``(flops, macs,
    params)``, formatted when ``as_string``. ``mode='generate'`` profiles ``model.generate``."""
    assert isinstance(model, torch.nn.Module), "model must be a PyTorch module"
    if mode not in _MODES:
        raise ValueError(f"get_model_profile: mode={mode!r} is not supported; use one of {_MODES}")
    args = list(args) if args is not None else []
    kwargs = dict(kwargs) if kwargs is not None else {}
    call_args, call_kwargs = _inputs(model, input_shape, args, kwargs)
    model.eval()
    run = model if mode == "forward" else model.generate

    profiler = FlopsProfiler(model)
    with torch.no_grad():
        for _ in range(warm_up):
            run(*call_args, **call_kwargs)
        try:
            profiler.start_profile(ignore_list=ignore_modules)
            run(*call_args, **call_kwargs)
        except BaseException:
            profiler.end_profile()  # torch's own ops back, and no hooks left on the model
            raise
        profiler.stop_profile()
    flops = profiler.get_total_flops()
    macs = profiler.get_total_macs()
    params = profiler.get_total_params()
    if print_profile:
        profiler.print_model_profile(profile_step=warm_up, module_depth=module_depth,
                                     top_modules=top_modules, detailed=detailed,
                                     output_file=output_file)
    profiler.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params
