"""``DeepSpeedTransformerConfig``: the settings of one fused BERT encoder layer.

Every keyword of the documented signature, with its documented default, plus the tutorial's
``max_seq_length`` (its snippet passes it; upstream rejects it, here it is stored and only
informational: the layer takes any sequence length). ``-1`` means "not set", as in the docs;
``intermediate_size <= 0`` means ``4 * hidden_size`` and a negative dropout ratio means no
dropout. Sizes are checked when a layer is built from the config (a config alone may be partial).
"""
import json
import math

_DEFAULTS = dict(batch_size=-1, hidden_size=-1, intermediate_size=-1, heads=-1,
                 attn_dropout_ratio=-1, hidden_dropout_ratio=-1, num_hidden_layers=-1,
                 initializer_range=-1, layer_norm_eps=1e-12, local_rank=-1, seed=-1, fp16=False,
                 pre_layer_norm=True, normalize_invertible=False, gelu_checkpoint=False,
                 adjust_init_range=True, attn_dropout_checkpoint=False, stochastic_mode=False,
                 return_tuple=False, training=True, max_seq_length=-1)


class TransformerConfig:
    """The size fields shared by transformer configs (upstream's base class)."""

    def __init__(self, batch_size, hidden_size, intermediate_size, heads, attn_dropout_ratio,
                 hidden_dropout_ratio, num_hidden_layers, initializer_range):
        self.layer_id = -1
        self.batch_size = batch_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.heads = heads
        self.attn_dropout_ratio = attn_dropout_ratio
        self.hidden_dropout_ratio = hidden_dropout_ratio
        self.num_hidden_layers = num_hidden_layers
        self.initializer_range = initializer_range


class DeepSpeedTransformerConfig(TransformerConfig):
    """Initialize the DeepSpeed Transformer Config (see the API docs for each field)."""

    def __init__(self, batch_size=-1, hidden_size=-1, intermediate_size=-1, heads=-1,
                 attn_dropout_ratio=-1, hidden_dropout_ratio=-1, num_hidden_layers=-1,
                 initializer_range=-1, layer_norm_eps=1e-12, local_rank=-1, seed=-1, fp16=False,
                 pre_layer_norm=True, normalize_invertible=False, gelu_checkpoint=False,
                 adjust_init_range=True, attn_dropout_checkpoint=False, stochastic_mode=False,
                 return_tuple=False, training=True, max_seq_length=-1):
        super().__init__(batch_size, hidden_size,
                         intermediate_size if intermediate_size > 0 else 4 * hidden_size,
                         heads, attn_dropout_ratio, hidden_dropout_ratio, num_hidden_layers,
                         initializer_range)
        self.layer_norm_eps = layer_norm_eps
        self.local_rank = local_rank
        self.seed = seed
        self.fp16 = fp16
        self.pre_layer_norm = pre_layer_norm
        self.normalize_invertible = normalize_invertible
        self.gelu_checkpoint = gelu_checkpoint
        self.adjust_init_range = adjust_init_range
        self.attn_dropout_checkpoint = attn_dropout_checkpoint
        self.stochastic_mode = stochastic_mode
        self.return_tuple = return_tuple
        self.training = training
        self.max_seq_length = max_seq_length

    @classmethod
    def from_dict(cls, json_object):
        unknown = sorted(set(json_object) - set(_DEFAULTS) - {"layer_id"})
        if unknown:
            raise ValueError(f"DeepSpeedTransformerConfig: unknown key(s) {unknown}; allowed: "
                             f"{sorted(_DEFAULTS)}")
        config = cls(**{k: v for k, v in json_object.items() if k != "layer_id"})
        config.layer_id = json_object.get("layer_id", -1)
        return config

    @classmethod
    def from_json_file(cls, json_file):
        with open(json_file, "r", encoding="utf-8") as reader:
            return cls.from_dict(json.load(reader))

    def to_dict(self):
        return dict(self.__dict__)

    def __repr__(self):
        return f"DeepSpeedTransformerConfig({json.dumps(self.to_dict(), sort_keys=True)})"

    # ---- derived values the layer uses, with the checks a layer needs ----
    def validate(self):
        """Raise ValueError naming the field when the config cannot build a layer."""
        for name in ("hidden_size", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"DeepSpeedTransformerConfig.{name} must be a positive int to "
                                 f"build a layer, got {value!r}")
        if self.hidden_size % self.heads:
            raise ValueError(f"DeepSpeedTransformerConfig.hidden_size ({self.hidden_size}) must be "
                             f"divisible by heads ({self.heads})")
        for name in ("attn_dropout_ratio", "hidden_dropout_ratio"):
            if getattr(self, name) >= 1:
                raise ValueError(f"DeepSpeedTransformerConfig.{name} must be < 1 (a negative value "
                                 f"means no dropout), got {getattr(self, name)!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"DeepSpeedTransformerConfig.layer_norm_eps must be > 0, got "
                             f"{self.layer_norm_eps!r}")

    def dropout(self, name):
        return max(float(getattr(self, name)), 0.0)

    def init_stds(self):
        """(std of most weights, std of the attention-output and layer-output weights)."""
        std = self.initializer_range if self.initializer_range > 0 else 0.02
        if self.adjust_init_range and self.num_hidden_layers > 0:
            return std, std / math.sqrt(2.0 * self.num_hidden_layers)
        return std, std
