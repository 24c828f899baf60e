"""The one configuration of xnortrain.

A :class:`Config` is read by the float reference trainer, the bit-exact
hardware model, the RTL generator and the host. It loads from TOML (or a
plain dict), checks every value at load time, and raises
:class:`ConfigError` naming the field, the bad value and what is allowed.

Layout of a configuration file (every section and key is optional except
``model.layers`` when no ``model.preset`` is given)::

    name = "mlp_mnist"
    [model]      input_shape, num_classes, input_format, layers = [{type=..}, ..]
    [data]       dataset, path, preprocess, binarize_threshold, dither, train_limit, test_limit, dev_size
    [train]      batch_size, epochs, seed, loss, eval_batch_size
    [train.lr]   schedule, initial, factor, patience, min, milestones
    [approx]     scheme, bn, dy, dy_bits, dw, storage, bn_eps
    [optimizer]  name, and one sub-table per optimiser family
    [e2train]    smd_prob, psg, psg_msb_bits, psg_beta

``--set key=value`` on the command line maps to :func:`apply_overrides`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (PYNQ board images): the same parser, published as tomli (a dependency there)
    import tomli as tomllib

import tomli_w

from .hw_config import HwConfig
from .schema import ConfigError, build, key_name, opt, sub

__all__ = [
    "ConfigError",
    "Config",
    "LayerSpec",
    "LayerShape",
    "load_config",
    "config_from_dict",
    "apply_overrides",
    "preset_path",
    "PRESETS",
    "SCHEMES",
]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

# Named presets: the ``--model`` name maps to a TOML file in ``configs/``.
PRESETS = {
    "mlp": "mlp_mnist.toml",
    "cnv": "cnv_cifar10.toml",
    "binarynet": "binarynet_cifar10.toml",
}


# ---------------------------------------------------------------------------
# Topology


LAYER_TYPES = ("dense", "conv", "maxpool")


@dataclass(frozen=True)
class LayerSpec:
    """One layer of the network as written in the configuration."""

    type: str
    units: int = 0  # dense: output neurons
    channels: int = 0  # conv: output channels
    kernel: int = 3  # conv kernel size (square)
    padding: str = "valid"  # conv: "valid" or "same" (stride is always 1)
    pool: int = 2  # maxpool window and stride
    bn: bool = True  # batch norm after this dense / conv layer
    before_bn: bool = False  # maxpool: pool the conv layer's Y before its BN (BinaryNet's order), not the BN output

    @property
    def has_weights(self) -> bool:
        return self.type in ("dense", "conv")


@dataclass(frozen=True)
class LayerShape:
    """A layer with its derived shapes (channels-first, per image)."""

    index: int  # position in model.layers
    spec: LayerSpec
    in_shape: tuple  # (C, H, W) or (N,)
    out_shape: tuple
    fan_in: int  # inputs summed per output (N_l of the paper); 0 for maxpool
    weight_shape: tuple  # dense: (in, out); conv: (out_c, in_c, k, k); () for maxpool

    @property
    def n_weights(self) -> int:
        return math.prod(self.weight_shape) if self.weight_shape else 0

    @property
    def out_channels(self) -> int:
        return self.out_shape[0]

    @property
    def out_size(self) -> int:
        return math.prod(self.out_shape)

    @property
    def in_size(self) -> int:
        return math.prod(self.in_shape)

    @property
    def spatial(self) -> int:
        """Output positions per channel (1 for dense)."""
        return self.out_size // self.out_channels if len(self.out_shape) == 3 else 1


def _parse_layer(i: int, d: Any) -> LayerSpec:
    path = f"model.layers[{i}]"
    if not isinstance(d, dict):
        raise ConfigError(f"{path} = {d!r}: expected a table like {{type = 'dense', units = 256}}")
    if d.get("type") not in LAYER_TYPES:
        raise ConfigError(f"{path}.type = {d.get('type')!r} is not allowed; allowed: " + ", ".join(LAYER_TYPES))
    allowed = {
        "dense": {"type", "units", "bn"},
        "conv": {"type", "channels", "kernel", "padding", "bn"},
        "maxpool": {"type", "pool", "before_bn"},
    }[d["type"]]
    extra = sorted(set(d) - allowed, key=str)
    if extra:
        raise ConfigError(
            f"{path}.{key_name(extra[0])}: not a field of a {d['type']} layer; allowed: {sorted(allowed)}"
        )
    for key, lo, hi in (("units", 1, 1 << 20), ("channels", 1, 1 << 16), ("kernel", 1, 15), ("pool", 1, 16)):
        if key in d:
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(f"{path}.{key} = {v!r} is out of range; allowed: integer {lo}..{hi}")
    if d["type"] == "dense" and "units" not in d:
        raise ConfigError(f"{path}.units is required for a dense layer")
    if d["type"] == "conv" and "channels" not in d:
        raise ConfigError(f"{path}.channels is required for a conv layer")
    if "padding" in d and d["padding"] not in ("valid", "same"):
        raise ConfigError(f"{path}.padding = {d['padding']!r} is not allowed; allowed: 'valid', 'same'")
    for key in ("bn", "before_bn"):
        if key in d and not isinstance(d[key], bool):
            raise ConfigError(f"{path}.{key} = {d[key]!r}: expected true or false")
    if d["type"] == "conv" and d.get("padding") == "same" and d.get("kernel", 3) % 2 == 0:
        raise ConfigError(f"{path}.kernel = {d['kernel']}: 'same' padding needs an odd kernel")
    return LayerSpec(**d)


# ---------------------------------------------------------------------------
# Sections


@dataclass
class ModelConfig:
    input_shape: list = opt([1, 28, 28], kind=list, doc="(C, H, W) of one input image")
    num_classes: int = opt(10, lo=2, hi=1000)
    input_format: str = opt(
        "float",
        choices=("float", "binary", "int8"),
        doc="first-layer input: real values in [-1,1], +-1 by threshold, or 8-bit integers",
    )
    layers: list = opt([], kind=list)

    def _validate(self, path):
        s = self.input_shape
        if len(s) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096 for v in s):
            raise ConfigError(f"{path}.input_shape = {s!r}: expected [channels, height, width], each 1..4096")
        if not self.layers:
            raise ConfigError(f"{path}.layers is empty: give at least one dense layer (or use a preset)")
        self.layers = [x if isinstance(x, LayerSpec) else _parse_layer(i, x) for i, x in enumerate(self.layers)]
        for i, spec in enumerate(self.layers):
            if spec.before_bn and (i == 0 or self.layers[i - 1].type != "conv"):
                raise ConfigError(f"{path}.layers[{i}].before_bn = true: only a maxpool right after a conv layer "
                                  f"can pool that layer's Y before its BN")


@dataclass
class DataConfig:
    dataset: str = opt("mnist", choices=("mnist", "fashion_mnist", "cifar10", "svhn"))
    path: str = opt("", doc="folder with the dataset files; empty = vendored MNIST")
    preprocess: str = opt("pm1", choices=("pm1", "binarize"), doc="scale to [-1,1] or binarise")
    binarize_threshold: float = opt(0.5, lo=0.0, hi=1.0, doc="on the [0,1] pixel scale")
    dither: bool = opt(False, doc="binarised input of training batches: a random threshold per pixel (levels "
                                  "1..254) instead of binarize_threshold; evaluation keeps the fixed threshold")
    train_limit: int = opt(0, lo=0, doc="use only the first N training images (0 = all)")
    test_limit: int = opt(0, lo=0, doc="use only the first N test images (0 = all)")
    dev_size: int = opt(0, lo=0, doc="training images held out to drive the development-based LR schedule")


#: Learning-rate limits shared by ``train.lr.initial`` and ``optimizer.lr``. The hardware takes a rate as a
#: shift ``round(-log2 lr)`` in a 6-bit register (``sim.hw.optim.lr_shift``, at most 63), so 2**-63 is the
#: smallest rate it represents; a smaller one would be silently rounded up to it. The float schedules
#: accept at most 10.
LR_MIN = 2.0**-63
LR_MAX = 10.0


@dataclass
class LRConfig:
    schedule: str = opt("development", choices=("constant", "development", "step", "cosine"))
    initial: float = opt(0.001, lo=LR_MIN, hi=LR_MAX, doc="the starting rate (2**-63 .. 10)")
    factor: float = opt(0.5, lo=0.0, lo_open=True, hi=1.0, doc="multiplier at each decay")
    patience: int = opt(2, lo=1, hi=1000, doc="development: epochs without dev improvement before decay")
    min: float = opt(1e-7, lo=0.0, hi=LR_MAX, doc="the schedule never goes below this")
    milestones: list = opt([], kind=list, doc="step: epochs at which lr *= factor")

    def _validate(self, path):
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.milestones):
            raise ConfigError(f"{path}.milestones = {self.milestones!r}: expected positive epoch numbers")


@dataclass
class TrainConfig:
    batch_size: int = opt(100, lo=1, hi=65536)
    epochs: int = opt(50, lo=1, hi=100000)
    max_steps: int = opt(0, lo=0, doc="stop after this many steps (0 = no limit); for short runs")
    seed: int = opt(0, lo=0, hi=2**32 - 1)
    loss: str = opt("cross_entropy", choices=("cross_entropy", "squared_hinge"))
    eval_batch_size: int = opt(1000, lo=1, hi=1 << 20)
    lr: LRConfig = sub(LRConfig)


SCHEMES = {
    # Algorithm 1 of Wang et al.: everything float32, l2 batch norm.
    "standard": dict(bn="l2", dy="float32", dw="float", storage="float32"),
    # Algorithm 2: BNN-specific l1 BN, po2_5 dY, bool dW, float16 elsewhere.
    "proposed": dict(bn="l1_bnn", dy="po2", dw="bool", storage="float16"),
}


@dataclass
class ApproxConfig:
    """Each approximation of the paper on its own switch; unset ones follow ``scheme``."""

    scheme: str = opt("proposed", choices=tuple(SCHEMES))
    bn: str = opt(None, choices=("l2", "l1", "l1_bnn"), kind=str)
    dy: str = opt(None, choices=("float32", "float16", "bfloat16", "int", "po2"), kind=str)
    dy_bits: int = opt(5, lo=2, hi=8, doc="k of po2_k / int-k block floating point")
    dw: str = opt(None, choices=("float", "bool"), kind=str)
    storage: str = opt(None, choices=("float32", "float16", "bfloat16"), kind=str)
    bn_eps: float = opt(1e-5, lo=0.0, hi=1.0)
    bn_momentum: float = opt(0.1, lo=0.0, lo_open=True, hi=1.0, doc="running-statistics update rate")

    def _validate(self, path):
        filled = []
        for key, value in SCHEMES[self.scheme].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
                filled.append(key)
        # Remember which values came from the scheme, so a later scheme change re-derives them.
        self._from_scheme = tuple(filled)


@dataclass
class AdamConfig:
    beta1: float = opt(0.9, lo=0.0, hi=1.0, hi_open=True)
    beta2: float = opt(0.999, lo=0.0, hi=1.0, hi_open=True)
    eps: float = opt(
        0.0, lo=0.0, doc="0 = auto: 1e-8 with float32 storage, 1e-3 with 16-bit storage (see Config.adam_eps)"
    )


@dataclass
class SGDConfig:
    momentum: float = opt(0.9, lo=0.0, hi=1.0, hi_open=True)
    weight_decay: float = opt(0.0, lo=0.0)


@dataclass
class BopConfig:
    tau: float = opt(1e-6, lo=0.0, doc="flip threshold on the gradient EMA")
    gamma: float = opt(1e-3, lo=0.0, lo_open=True, hi=1.0, doc="adaptivity rate of the EMA")


@dataclass
class IIRConfig:
    alpha: float = opt(1e-3, lo=0.0, lo_open=True, hi=1.0, doc="first EMA rate (lr x weight decay)")
    gamma: float = opt(0.1, lo=0.0, lo_open=True, hi=1.0, doc="second EMA rate (1 - momentum)")
    alpha_decay: str = opt("cosine", choices=("none", "cosine", "linear", "step"))
    decay_factor: float = opt(0.1, lo=0.0, lo_open=True, hi=1.0, doc="step decay: multiplier")
    decay_every: int = opt(10, lo=1, doc="step decay: epochs between decays")


@dataclass
class SwitchConfig:
    """Stochastic-switching family of Akesson (seed 004)."""

    mode: str = opt(
        "accumulate",
        choices=("deterministic", "stochastic", "momentum", "accumulate", "per_image"),
        doc="Networks IV (deterministic), V (stochastic), VI (momentum), VII (accumulate), VIII (per_image)",
    )
    sigma: float = opt(0.5, lo=0.0, hi=1.0, hi_open=True, doc="cut-off fraction of the maximum")
    lam: float = opt(0.1, lo=0.0, lo_open=True, hi=1.0, doc="largest switch probability")
    undo: bool = opt(False)
    momentum: float = opt(0.95, lo=0.0, hi=1.0, hi_open=True, doc="momentum mode: share of old momentum")
    acc_cutoff: int = opt(50, lo=1, hi=32767, doc="accumulate/per_image: saturation of the sign counter")
    sigma_prime: float = opt(0.9, lo=0.0, hi=1.0, doc="per_image: keep signs with |g| >= sigma' max|g|")


@dataclass
class OptimizerConfig:
    name: str = opt("adam", choices=("adam", "sgdm", "bop", "iir", "switch"))
    lr: float = opt(0.0, lo=0.0, hi=LR_MAX, doc="overrides train.lr.initial when > 0 (then 2**-63 .. 10, as it)")
    clip: float = opt(1.0, lo=0.0, lo_open=True, doc="latent weights are clipped to [-clip, clip]")
    beta_optimizer: str = opt(
        "adam", choices=("adam", "sgdm"), doc="optimiser of the BN biases when the weights use bop/iir/switch"
    )
    adam: AdamConfig = sub(AdamConfig)
    sgdm: SGDConfig = sub(SGDConfig)
    bop: BopConfig = sub(BopConfig)
    iir: IIRConfig = sub(IIRConfig)
    switch: SwitchConfig = sub(SwitchConfig)

    def _validate(self, path):
        if 0 < self.lr < LR_MIN:
            raise ConfigError(f"{path}.lr = {self.lr!r} is out of range; allowed: 0 (use train.lr.initial) or "
                              f">= {LR_MIN!r} (2**-63, the smallest rate the hardware's lr_shift represents)")

    @property
    def latent_free(self) -> bool:
        return self.name in ("bop", "iir", "switch")


@dataclass
class E2TrainConfig:
    smd_prob: float = opt(0.0, lo=0.0, hi=1.0, hi_open=True, doc="stochastic mini-batch dropping")
    psg: bool = opt(False, doc="predictive sign gradient for dW")
    psg_msb_bits: int = opt(4, lo=1, hi=16, doc="bits of the MSB predictors")
    psg_beta: float = opt(0.05, lo=0.0, hi=1.0, doc="adaptive threshold = beta * max|predicted|")


@dataclass
class Config:
    name: str = opt("custom")
    preset: str = opt("", doc="name of the preset this configuration started from")
    model: ModelConfig = sub(ModelConfig)
    data: DataConfig = sub(DataConfig)
    train: TrainConfig = sub(TrainConfig)
    approx: ApproxConfig = sub(ApproxConfig)
    optimizer: OptimizerConfig = sub(OptimizerConfig)
    e2train: E2TrainConfig = sub(E2TrainConfig)
    hw: HwConfig = sub(HwConfig)

    def _validate(self, path):
        check_name(self.name)
        shapes = self.layer_shapes()
        if not shapes[-1].spec.type == "dense" or shapes[-1].out_shape != (self.model.num_classes,):
            raise ConfigError(
                f"model.layers[{len(shapes) - 1}]: the last layer must be dense with units = "
                f"model.num_classes ({self.model.num_classes})"
            )
        self.hw.check_against(self)
        if self.e2train.psg and self.approx.dw != "bool":
            raise ConfigError("e2train.psg = true needs approx.dw = 'bool' (PSG produces sign gradients)")

    # -- derived quantities -------------------------------------------------
    @property
    def adam_eps(self) -> float:
        """Adam's epsilon. In 16-bit storage the second moment of a BN-bias gradient sits near float16's
        smallest normals, and with eps = 1e-8 the step m / (sqrt(v) + eps) explodes (the MLP's loss jumps
        to ~300 in the first steps); 1e-3 bounds it and stays small next to the bool weight gradients
        (1/sqrt(fan_in) >= 0.036). float32 keeps the usual 1e-8."""
        if self.optimizer.adam.eps > 0:
            return self.optimizer.adam.eps
        return 1e-8 if self.approx.storage == "float32" else 1e-3

    @property
    def lr(self) -> float:
        return self.optimizer.lr if self.optimizer.lr > 0 else self.train.lr.initial

    def layer_shapes(self) -> list[LayerShape]:
        """Per-layer shapes derived from the input shape and the layer list."""
        shape: tuple = tuple(self.model.input_shape)
        out = []
        for i, spec in enumerate(self.model.layers):
            path = f"model.layers[{i}]"
            if spec.type == "dense":
                n_in = math.prod(shape)
                out.append(LayerShape(i, spec, shape, (spec.units,), n_in, (n_in, spec.units)))
                shape = (spec.units,)
            elif spec.type == "conv":
                if len(shape) != 3:
                    raise ConfigError(f"{path}: a conv layer cannot follow a dense layer")
                c, h, w = shape
                k = spec.kernel
                if spec.padding == "valid":
                    h2, w2 = h - k + 1, w - k + 1
                else:
                    h2, w2 = h, w
                if h2 < 1 or w2 < 1:
                    raise ConfigError(f"{path}: kernel {k} with valid padding does not fit the {h}x{w} input")
                new = (spec.channels, h2, w2)
                out.append(LayerShape(i, spec, shape, new, c * k * k, (spec.channels, c, k, k)))
                shape = new
            else:
                if len(shape) != 3:
                    raise ConfigError(f"{path}: a maxpool layer cannot follow a dense layer")
                c, h, w = shape
                p = spec.pool
                if h < p or w < p:
                    raise ConfigError(f"{path}: pool {p} does not fit the {h}x{w} input")
                new = (c, h // p, w // p)
                out.append(LayerShape(i, spec, shape, new, 0, ()))
                shape = new
        return out

    def weight_layers(self) -> list[LayerShape]:
        return [s for s in self.layer_shapes() if s.spec.has_weights]

    @property
    def n_weights(self) -> int:
        return sum(s.n_weights for s in self.weight_layers())

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["model"]["layers"] = [_layer_to_dict(s) for s in self.model.layers]
        return d

    def to_toml(self) -> str:
        return _to_toml(self.to_dict())


def _layer_to_dict(spec: LayerSpec) -> dict:
    keep = {"dense": ("type", "units", "bn"), "conv": ("type", "channels", "kernel", "padding", "bn"),
            "maxpool": ("type", "pool")}[spec.type]
    if spec.before_bn:  # written only when set: configurations without it keep their text (and fingerprints)
        keep = (*keep, "before_bn")
    return {k: getattr(spec, k) for k in keep}


def _to_toml(d: dict) -> str:
    try:
        return tomli_w.dumps(d)
    except TypeError as e:  # a value TOML cannot hold (None)
        raise ConfigError(f"cannot write the configuration as TOML: {e}") from None


# ---------------------------------------------------------------------------
# Loading


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def preset_path(name: str) -> Path:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; allowed: " + ", ".join(PRESETS))
    return CONFIG_DIR / PRESETS[name]


def check_name(name: str) -> None:
    """``name`` names files (the default checkpoint ``results/<name>-<target>.ckpt.npz``, build folders): one
    plain file-name part, no folder separators, no ``..``, no control characters."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or ".." in name
            or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > 100):
        raise ConfigError(f"name = {name!r}: names files, so it must be a plain name of 1-100 characters without "
                          "'/', '\\', '..' or control characters")


def _read_toml(path: Path) -> dict:
    """The TOML file at ``path`` (UTF-8; a leading byte-order mark is accepted); every way of not being a
    readable TOML file is a :class:`ConfigError` naming the file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        if b"\0" in raw:
            raise ConfigError(f"{path}: a binary file, not a TOML configuration (text)")
        text = raw.decode("utf-8")
        return tomllib.loads(text[1:] if text.startswith("\ufeff") else text)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; expected a configuration file (.toml)") from None
    except NotADirectoryError:
        raise ConfigError(f"{path}: configuration file not found (a part of the path is a file, not a folder)") \
            from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied reading the configuration file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration file ({e.strerror or e})") from None


def _resolve(data: dict, seen: tuple = ()) -> dict:
    """Expand ``preset = "mlp"`` (or ``base = "file.toml"``) into the preset's values."""
    data = copy.deepcopy(data)
    preset = data.get("preset", "")
    if not isinstance(preset, str):
        raise ConfigError(f"preset = {preset!r}: expected a string, one of " + ", ".join(repr(p) for p in PRESETS))
    if preset:
        if preset in seen:
            raise ConfigError(f"preset {preset!r} refers to itself")
        base = _resolve(_read_toml(preset_path(preset)), seen + (preset,))
        base.pop("preset", None)
        merged = _merge(base, {k: v for k, v in data.items() if k != "preset"})
        merged["preset"] = preset
        return merged
    return data


def config_from_dict(data: dict) -> Config:
    return build(Config, _resolve(data), "")


def load_config(path_or_name: str | Path) -> Config:
    """Load a TOML file, or a preset by name (``mlp``, ``cnv``, ``binarynet``)."""
    if isinstance(path_or_name, str) and path_or_name in PRESETS:
        data = _read_toml(preset_path(path_or_name))
        data.setdefault("preset", "")
        cfg = config_from_dict(data)
        cfg.preset = path_or_name
        return cfg
    path = Path(path_or_name)
    try:
        return config_from_dict(_read_toml(path))
    except ConfigError as e:
        if str(e).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {e}") from None


def _parse_scalar(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string


def apply_overrides(cfg: Config, overrides: list[str] | dict) -> Config:
    """Return a new Config with ``key.sub=value`` overrides applied and re-validated."""
    data = cfg.to_dict()
    preset = data.pop("preset", "")
    items = overrides.items() if isinstance(overrides, dict) else [_split_override(o) for o in overrides]
    for key, value in items:
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                raise ConfigError(f"--set {key}: {p!r} is not a section of the configuration")
            node = node[p]
        if parts[-1] not in node:
            raise ConfigError(f"--set {key}: unknown field {parts[-1]!r}; known: " + ", ".join(sorted(node)))
        new = _parse_scalar(value) if isinstance(value, str) and not isinstance(overrides, dict) else value
        if isinstance(node[parts[-1]], dict) and not isinstance(new, dict):
            raise ConfigError(f"--set {key}: {key} is a section, not a value (got {new!r}); set one of its fields: "
                              + ", ".join(f"{key}.{k}" for k in sorted(node[parts[-1]])))
        node[parts[-1]] = new
    # Approximations that were filled from the scheme follow a changed scheme.
    set_keys = {k for k, _ in items} if isinstance(overrides, dict) else {_split_override(o)[0] for o in overrides}
    for key in getattr(cfg.approx, "_from_scheme", ()):
        if f"approx.{key}" not in set_keys:
            data["approx"][key] = None
    new = build(Config, data, "")
    new.preset = preset
    return new


def _split_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. train.epochs=5")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()
