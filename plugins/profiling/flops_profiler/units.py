"""Human-readable numbers for the profile: ``2480 -> '2.48 K'``, ``1200 MACs -> '1.2 KMACs'``.

Counts (flops, MACs, params) scale up to G at most, as in the documented profiles
(``'6279.86 G'`` flops, ``'3139.93 GMACs'``); rates and durations use every unit."""

_SCALES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3), ("", 1.0), ("m", 1e-3), ("u", 1e-6))


def _pick(num, units, top="G"):
    if units is not None:
        for name, scale in _SCALES:
            if name == units:
                return name, scale
        raise ValueError(f"unknown unit {units!r}; use one of {[n for n, _ in _SCALES]}")
    magnitude = abs(num)
    if magnitude == 0:
        return "", 1.0
    scales = _SCALES[[name for name, _ in _SCALES].index(top):]
    for name, scale in scales:
        if magnitude >= scale:
            return name, scale
    return _SCALES[-1]


def _shown(value, precision):
    value = round(value, precision)
    return str(int(value)) if value == int(value) else str(value)


def number_to_string(num, units=None, precision=2):
    """``num`` scaled to T/G/M/K/''/m/u, e.g. ``'2.48 K'`` (no trailing space without a unit)."""
    name, scale = _pick(num, units)
    return f"{_shown(num / scale, precision)} {name}".rstrip()


def macs_to_string(macs, units=None, precision=2):
    name, scale = _pick(macs, units)
    return f"{_shown(macs / scale, precision)} {name}MACs"


def flops_to_string(flops, units=None, precision=2):
    """A rate: ``'81.9 TFLOPS'``."""
    name, scale = _pick(flops, units, top="T")
    return f"{_shown(flops / scale, precision)} {name}FLOPS"


def params_to_string(params, units=None, precision=2):
    """Parameter counts say B (billion), not G."""
    return number_to_string(params, units=units, precision=precision).replace("G", "B")


def duration_to_string(seconds, units=None, precision=2):
    name, scale = _pick(seconds, units, top="")
    return f"{_shown(seconds / scale, precision)} {name}s"
