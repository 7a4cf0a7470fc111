"""``enable_cuda_graph=True``: the inference engine replays CUDA graphs (GPU only).

A token of greedy decoding costs hundreds of small kernel launches from Python; one graph
replay launches them all at once.

- ``engine.generate(...)`` (greedy): the prompt runs eagerly (prefill) into a static KV cache
  (Hugging Face's ``StaticCache``) sized for prompt + new tokens; every further token is one
  replay of a captured one-token step: the forward at the next position (position ids and an
  additive attention mask built from a device-side position, so nothing is baked in at capture
  time), the EOS rules of ``generate`` (EOS blocked before ``min_new_tokens``, finished rows
  padded with ``pad_token_id``) and the argmax. One graph per (batch size, cache length) is
  kept and reused, the cache reset between calls. Tokens are those of Hugging Face's greedy
  ``generate`` up to floating-point reassociation (the static cache's attention reduces over
  the whole, masked, cache).
- ``engine(...)``: the forward is captured per input signature (tensor shapes and dtypes,
  other arguments' values) on its first call and replayed after copying the inputs into the
  graph's static buffers; the outputs are returned as copies, since the next replay overwrites
  the graph's own.

What a graph cannot do is refused with the reason, never run eagerly behind the user's back:
sampling, beam search, padded prompts, logits processors and other ``generate`` options
outside ``GREEDY_KEYS``; forward outputs holding objects other than tensors (a KV cache: pass
``use_cache=False``); and any machine without a CUDA device (at ``init_inference``).
"""
import math

import torch

# generate() keyword arguments the captured greedy loop implements
GREEDY_KEYS = {"input_ids", "inputs", "attention_mask", "max_new_tokens", "min_new_tokens",
               "max_length", "min_length", "do_sample", "num_beams", "pad_token_id",
               "eos_token_id", "bos_token_id", "use_cache", "generation_config"}
# generation-config fields that change greedy tokens: unset (None) or at these values only
NEUTRAL_FIELDS = {"do_sample": (False,), "num_beams": (1,), "num_return_sequences": (1,),
                  "repetition_penalty": (1.0,), "no_repeat_ngram_size": (0,),
                  "bad_words_ids": (), "forced_bos_token_id": (), "forced_eos_token_id": (),
                  "suppress_tokens": (), "begin_suppress_tokens": (), "sequence_bias": (),
                  "guidance_scale": (1.0,), "exponential_decay_length_penalty": (),
                  "watermarking_config": (), "max_time": (), "stop_strings": (),
                  "return_dict_in_generate": (False,), "output_scores": (False,),
                  "output_logits": (False,)}
CACHE_ROUND = 128  # cache lengths are rounded up to this, so nearby lengths share a graph


class CudaGraphError(RuntimeError):
    """What ``enable_cuda_graph`` cannot run, with what to do instead."""


def refuse_without_cuda():
    """``init_inference(enable_cuda_graph=True)`` on a machine without CUDA: a clear error."""
    from deepspeed.accelerator import get_accelerator

    name = get_accelerator().device_name()
    if name != "cuda" or not torch.cuda.is_available():
        raise CudaGraphError(
            f"enable_cuda_graph=True needs a CUDA device (CUDA graphs replay captured GPU "
            f"kernels); the accelerator here is '{name}' and torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}. Leave enable_cuda_graph False on this machine")


class GreedyDecoder:
    """Greedy decoding of one batch size into a static cache of ``cache_len`` positions.

    ``capture=True`` (the engine, on CUDA) records the one-token step as a CUDA graph;
    ``capture=False`` runs the very same step eagerly, which is how the CPU tests check the
    decoding logic and the benchmark checks that a replay computes what the eager step does."""

    def __init__(self, model, batch, cache_len, eos_ids, capture):
        from transformers import StaticCache

        self.model, self.batch, self.cache_len = model, batch, cache_len
        device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        long = dict(dtype=torch.long, device=device)
        self.ids = torch.zeros(batch, 1, **long)  # the last chosen token, fed to the next step
        self.pos = torch.zeros(batch, 1, **long)  # its position
        self.generated = torch.zeros((), **long)
        self.min_new = torch.zeros((), **long)
        self.pad = torch.zeros((), **long)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.is_eos = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)
        self.is_eos[list(eos_ids)] = True
        self.eos_ids = tuple(eos_ids)
        self.positions = torch.arange(cache_len, **long)
        self.graph = None
        if capture:
            self._capture()

    # ------------------------------------------------------------------ the step
    def _choose(self, logits):
        """Next tokens from last-position ``logits`` [batch, vocab], as generate's greedy
        search: EOS blocked before min_new_tokens, finished rows get the pad token."""
        logits = logits.float()
        if self.eos_ids:
            blocked = self.is_eos & (self.generated < self.min_new)
            logits = logits.masked_fill(blocked, float("-inf"))
        chosen = logits.argmax(-1)
        if self.eos_ids:
            chosen = torch.where(self.finished, self.pad, chosen)
            self.finished |= self.is_eos[chosen]
        self.ids.copy_(chosen[:, None])
        self.generated.add_(1)

    def _step(self):
        allowed = self.positions[None, :] <= self.pos  # [batch, cache_len]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        mask = mask.masked_fill(~allowed, torch.finfo(self.dtype).min)[:, None, None, :]
        out = self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=mask,
                         past_key_values=self.cache, use_cache=True)
        self._choose(out.logits[:, -1, :])
        self.pos.add_(1)

    def _capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(stream):  # warm-up: cuBLAS handles, the cache's allocation
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    self._step()
            except RuntimeError as err:
                raise CudaGraphError(
                    f"enable_cuda_graph: capturing the decoding step of "
                    f"{type(self.model).__name__} failed ({err}); its forward does something a "
                    f"CUDA graph cannot hold (a host sync, a CPU tensor). Use "
                    f"enable_cuda_graph=False for this model") from err

    def replay(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    # ------------------------------------------------------------------ one generate call
    @torch.no_grad()
    def generate(self, prompt, new_tokens, min_new, pad):
        """``[batch, prompt + generated]`` tokens; stops early once every row has finished."""
        length = prompt.shape[1]
        self.cache.reset()
        self.finished.zero_()
        self.generated.zero_()
        self.min_new.fill_(min_new)
        self.pad.fill_(pad)
        positions = torch.arange(length, device=prompt.device)[None].expand(self.batch, -1)
        out = self.model(input_ids=prompt, position_ids=positions, past_key_values=self.cache,
                         use_cache=True)
        self._choose(out.logits[:, -1, :])
        self.pos.fill_(length)
        tokens = torch.empty(self.batch, new_tokens, dtype=torch.long, device=prompt.device)
        tokens[:, 0] = self.ids[:, 0]
        produced = 1
        while produced < new_tokens and not (self.eos_ids and bool(self.finished.all())):
            self.replay()
            tokens[:, produced] = self.ids[:, 0]
            produced += 1
        return torch.cat([prompt, tokens[:, :produced]], dim=1)


def _greedy_settings(model, prompt, kwargs):
    """(new tokens, min new tokens, pad id, eos ids) of a generate call, or CudaGraphError
    naming what a captured greedy loop does not do."""
    unknown = sorted(set(kwargs) - GREEDY_KEYS)
    if unknown:
        raise CudaGraphError(
            f"enable_cuda_graph: generate() options {unknown} are not supported by the captured "
            f"greedy decoding loop (it takes {sorted(GREEDY_KEYS)}); use enable_cuda_graph=False "
            f"for them")
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    settings = {key: getattr(config, key, None) for key in NEUTRAL_FIELDS}
    settings.update({k: kwargs[k] for k in NEUTRAL_FIELDS if k in kwargs})
    for key, neutral in NEUTRAL_FIELDS.items():
        value = settings.get(key)
        if value is not None and value not in neutral and not (value == [] or value == {}):
            raise CudaGraphError(
                f"enable_cuda_graph: generate() with {key}={value!r} is not greedy decoding, the "
                f"only decoding the captured loop does; use enable_cuda_graph=False for it")
    if kwargs.get("use_cache") is False:
        raise CudaGraphError("enable_cuda_graph: generate(use_cache=False) has no KV cache to "
                             "capture a step over; use enable_cuda_graph=False")
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask == 1)):
        raise CudaGraphError("enable_cuda_graph: padded prompts (attention_mask with zeros) are "
                             "not supported by the captured loop; pass prompts of one length "
                             "or use enable_cuda_graph=False")

    def pick(key):
        return kwargs[key] if kwargs.get(key) is not None else getattr(config, key, None)

    length = prompt.shape[1]
    new = pick("max_new_tokens")
    if new is None:
        max_length = pick("max_length")
        new = (max_length if max_length is not None else 20) - length  # generate's default
    if new < 1:
        raise CudaGraphError(f"enable_cuda_graph: nothing to generate (max_new_tokens={new} "
                             f"for a prompt of {length} tokens)")
    min_new = max(pick("min_new_tokens") or 0, (pick("min_length") or 0) - length)
    eos = pick("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    pad = pick("pad_token_id")
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0  # generate's fallback when pad is unset
    elif mask is None and pad not in eos_ids and bool((prompt == pad).any()):
        raise CudaGraphError(  # generate() would infer a padding mask from these tokens
            f"enable_cuda_graph: the prompt contains pad_token_id={pad}, which generate() "
            f"treats as padding when no attention_mask is given; pass attention_mask (all ones) "
            f"if they are real tokens, or use enable_cuda_graph=False for padded prompts")
    return int(new), int(min_new), int(pad), tuple(int(e) for e in eos_ids)


def _clone_outputs(value, where="output"):
    """A copy of a forward's outputs (tensors cloned), or CudaGraphError for objects a replay
    cannot refresh."""
    if torch.is_tensor(value):
        return value.clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):  # ModelOutput too
        copied = {k: _clone_outputs(v, f"{where}.{k}") for k, v in value.items()}
        return copied if type(value) is dict else type(value)(**copied)
    if isinstance(value, (tuple, list)):
        return type(value)(_clone_outputs(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise CudaGraphError(
        f"enable_cuda_graph: the forward's {where} is a {type(value).__name__}, which a graph "
        f"replay cannot refresh; pass use_cache=False to engine(...) (generate() keeps its own "
        f"static cache) or use enable_cuda_graph=False")


def _leaves(value, out):
    """The tensors of nested tuples/lists/dicts, in order (``out`` is filled and returned)."""
    if torch.is_tensor(value):
        out.append(value)
    elif isinstance(value, dict):
        for key in sorted(value):
            _leaves(value[key], out)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _leaves(item, out)
    return out


def _signature(value):
    """A hashable key of an argument structure: tensors by shape, dtype and device, other
    values by themselves."""
    if torch.is_tensor(value):
        return ("tensor", tuple(value.shape), value.dtype, str(value.device))
    if isinstance(value, dict):
        return ("dict", tuple((k, _signature(value[k])) for k in sorted(value)))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    try:
        hash(value)
    except TypeError:
        raise CudaGraphError(f"enable_cuda_graph: a forward argument of type "
                             f"{type(value).__name__} cannot key a captured graph; pass tensors "
                             f"and plain values, or use enable_cuda_graph=False") from None
    return ("value", value)


class CudaGraphs:
    """The engine's graphs: forward graphs per input signature, decoders per (batch, cache
    length)."""

    def __init__(self, module):
        self.module = module
        self.forward_graphs = {}
        self.decoders = {}

    def forward(self, args, kwargs):
        key = _signature((args, kwargs))
        entry = self.forward_graphs.get(key)
        if entry is None:
            entry = self.forward_graphs[key] = self._capture_forward(args, kwargs)
        graph, static_inputs, static_outputs = entry
        for static, given in zip(static_inputs, _leaves((args, kwargs), [])):
            static.copy_(given)
        graph.replay()
        return _clone_outputs(static_outputs)

    def _capture_forward(self, args, kwargs):
        inputs = _leaves((args, kwargs), [])
        if any(t.device.type != "cuda" for t in inputs):
            raise CudaGraphError("enable_cuda_graph: forward inputs must be CUDA tensors (got "
                                 f"{sorted({str(t.device) for t in inputs})})")
        static = [t.clone() for t in inputs]
        swap = dict(zip(map(id, inputs), static))
        static_args, static_kwargs = _replace((args, kwargs), swap)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(stream):
                for _ in range(2):
                    _clone_outputs(self.module(*static_args, **static_kwargs))  # checks outputs
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self.module(*static_args, **static_kwargs)
        return graph, static, outputs

    def generate(self, inputs, kwargs):
        prompt = inputs[0] if inputs else kwargs.get("input_ids", kwargs.get("inputs"))
        if not torch.is_tensor(prompt) or prompt.dim() != 2:
            raise CudaGraphError("enable_cuda_graph: generate() needs input_ids as a [batch, "
                                 "length] tensor")
        if prompt.device.type != "cuda":
            raise CudaGraphError(f"enable_cuda_graph: input_ids are on {prompt.device}; put "
                                 f"them (and the model) on the GPU")
        new, min_new, pad, eos_ids = _greedy_settings(self.module, prompt, kwargs)
        cache_len = math.ceil((prompt.shape[1] + new) / CACHE_ROUND) * CACHE_ROUND
        key = (prompt.shape[0], cache_len, eos_ids)
        decoder = self.decoders.get(key)
        if decoder is None:
            decoder = self.decoders[key] = GreedyDecoder(self.module, prompt.shape[0], cache_len,
                                                         eos_ids, capture=True)
        return decoder.generate(prompt, new, min_new, pad)


def _replace(value, swap):
    """``value`` with each tensor replaced by ``swap[id(tensor)]``."""
    if torch.is_tensor(value):
        return swap[id(value)]
    if isinstance(value, dict):
        return type(value)((k, _replace(v, swap)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return type(value)(_replace(v, swap) for v in value)
    return value
