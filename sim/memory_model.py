"""Training-memory model: the variable and lifetime analysis of Wang et al., Table 2.

Every variable of one training step (Algorithm 1 or 2 of the source paper) is
listed with its data type, its size for the configured network and batch, and
whether it has *per-layer lifetime* (it is only alive while one layer's
forward or backward pass runs, so only the largest layer's instance counts)
or must stay in memory across the forward, backward and update phases (every
layer's instance counts).

Two sizing conventions are offered (``convention=``):

``"paper"`` (default)
    Reproduces the paper's Tables 2, 3 and 4. Worked out by fitting candidate
    readings against all three published models (see ``docs/memory_energy.md``):
    X is the input of every weight layer (after pooling; the input image
    included and stored like the other activations); convolution outputs keep
    their input's height and width when activation sizes are computed (as
    with 'same' padding) while weight counts come from the real layer shapes;
    the shared dX/Y buffer and the dY buffer are both sized by the largest
    input or output of any weight layer (the first layer's input included);
    BN-bias momenta, binary weight copies and straight-through masks are not
    counted, and latent-free optimisers (Bop, IIR, switching) hold no weight
    row at all.

``"exact"``
    What a device running the configured network must actually hold: real
    (valid-padding) shapes, the first layer's input in ``model.input_format``,
    X as the pre-pooling BN output of every weight layer, per-layer buffers
    sized by the tensors that really exist (dX_1 is never computed), binary
    weights of latent-free optimisers, the 1-bit straight-through mask and the
    pooling arg-max that the reference keeps, and the BN-bias optimiser state.

Sizes are exact bit counts (a bool element is 1/8 byte); MiB = 2**20 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .config import Config, ConfigError, load_config

__all__ = [
    "CONVENTIONS",
    "MemoryRow",
    "MemoryReport",
    "memory_table",
    "paper_reference",
    "report",
    "dtype_bits",
    "known_preset",
    "paper_scheme",
]

MIB = 1 << 20
CONVENTIONS = ("paper", "exact")

_FLOAT_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}

# The paper's published totals (MiB) for its three models with Adam and B = 100.
# BinaryNet's row comes from Table 2 (425.35 / 118.23); Table 3 prints 425.31 / 118.21.
_PAPER_MIB = {
    ("mlp", "standard"): (7.40, "Table 3"),
    ("mlp", "proposed"): (2.56, "Table 3"),
    ("cnv", "standard"): (128.33, "Table 3"),
    ("cnv", "proposed"): (27.13, "Table 3"),
    ("binarynet", "standard"): (425.35, "Table 2"),
    ("binarynet", "proposed"): (118.23, "Table 2"),
}


def dtype_bits(name: str) -> int:
    """Bits per element of a data-type name used in the tables (float32, bool, po2_5, int7, ...)."""
    if name in _FLOAT_BITS:
        return _FLOAT_BITS[name]
    if name == "bool":
        return 1
    for prefix in ("po2_", "int"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return int(name[len(prefix) :])
    raise ValueError(f"unknown data type {name!r}; allowed: float32, float16, bfloat16, bool, po2_<k>, int<k>")


@dataclass(frozen=True)
class MemoryRow:
    """One variable (or group of variables) of the training step."""

    name: str
    dtype: str
    elements: int  # number of stored elements (summed over layers, or of the largest layer)
    per_layer: bool  # True: only alive during one layer's pass, so only the largest layer counts
    note: str = ""
    layer: int | None = None  # for per-layer rows: index (in model.layers) of the layer that sets the size

    @property
    def bits(self) -> int:
        return dtype_bits(self.dtype)

    @property
    def bytes(self) -> float:
        return self.elements * self.bits / 8

    @property
    def mib(self) -> float:
        return self.bytes / MIB


@dataclass
class MemoryReport:
    """Result of :func:`memory_table`: rows plus the context they were computed for."""

    config_name: str
    preset: str
    scheme: str
    optimizer: str
    batch_size: int
    convention: str
    approx: dict
    rows: list[MemoryRow] = field(default_factory=list)
    paper_mib: float | None = None
    paper_source: str = ""

    @property
    def total_bytes(self) -> float:
        return sum(r.bytes for r in self.rows)

    @property
    def total_mib(self) -> float:
        return self.total_bytes / MIB

    def row(self, name: str) -> MemoryRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no memory row named {name!r}; rows: {[r.name for r in self.rows]}")

    def percent(self, r: MemoryRow) -> float:
        total = self.total_bytes
        return 100.0 * r.bytes / total if total else 0.0

    def paper_diff_pct(self) -> float | None:
        if self.paper_mib is None:
            return None
        return 100.0 * (self.total_mib - self.paper_mib) / self.paper_mib

    def to_dict(self) -> dict:
        return {
            "kind": "memory",
            "config": self.config_name,
            "preset": self.preset,
            "scheme": self.scheme,
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "convention": self.convention,
            "approx": dict(self.approx),
            "rows": [
                {
                    "name": r.name,
                    "dtype": r.dtype,
                    "bits": r.bits,
                    "elements": r.elements,
                    "bytes": r.bytes,
                    "mib": r.mib,
                    "percent": self.percent(r),
                    "per_layer": r.per_layer,
                    "layer": r.layer,
                    "note": r.note,
                }
                for r in self.rows
            ],
            "total_bytes": self.total_bytes,
            "total_mib": self.total_mib,
            "paper": None
            if self.paper_mib is None
            else {"mib": self.paper_mib, "source": self.paper_source, "diff_pct": self.paper_diff_pct()},
        }

    def format_table(self) -> str:
        a = self.approx
        head = (
            f"Training memory: {self.config_name} (preset {self.preset or '-'}), scheme {self.scheme} "
            f"[bn {a['bn']}, dY {a['dy']}, dW {a['dw']}, storage {a['storage']}], optimiser {self.optimizer}, "
            f"batch {self.batch_size}, convention {self.convention}"
        )
        lines = [head, ""]
        lines.append(f"{'Variable':<22} {'per-layer':<9} {'type':<9} {'MiB':>10} {'%':>7}  note")
        lines.append("-" * 78)
        for r in self.rows:
            pl = "yes" if r.per_layer else "no"
            if r.per_layer and r.layer is not None:
                pl += f" (L{r.layer})"
            lines.append(f"{r.name:<22} {pl:<9} {r.dtype:<9} {r.mib:>10.2f} {self.percent(r):>7.2f}  {r.note}".rstrip())
        lines.append("-" * 78)
        lines.append(f"{'Total':<22} {'':<9} {'':<9} {self.total_mib:>10.2f} {100.0:>7.2f}")
        if self.paper_mib is not None:
            lines.append(f"paper ({self.paper_source}): {self.paper_mib:.2f} MiB (diff {self.paper_diff_pct():+.2f} %)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Data types of each variable, from the resolved approximation switches.


def storage_dtype(cfg: Config) -> str:
    return cfg.approx.storage


def dy_dtype(cfg: Config) -> str:
    dy = cfg.approx.dy
    if dy == "po2":
        return f"po2_{cfg.approx.dy_bits}"
    if dy == "int":
        return f"int{cfg.approx.dy_bits}"
    return dy


def dw_dtype(cfg: Config) -> str:
    return "bool" if cfg.approx.dw == "bool" else cfg.approx.storage


def x_dtype(cfg: Config) -> str:
    """Retained activations: binary only with the BNN-specific l1 BN (Algorithm 2 lines 9-12)."""
    return "bool" if cfg.approx.bn == "l1_bnn" else cfg.approx.storage


def input_dtype(cfg: Config) -> str:
    fmt = cfg.model.input_format
    if fmt == "binary":
        return "bool"
    if fmt == "int8":
        return "int8"
    return cfg.approx.storage


def switch_acc_bits(cutoff: int) -> int:
    """Bits of a saturating signed counter holding -cutoff..+cutoff."""
    return max(2, math.ceil(math.log2(2 * cutoff + 1)))


def optimizer_state(cfg: Config) -> list[tuple[str, str, int, str]]:
    """Per-weight optimiser state as (row name, dtype, copies per weight, note)."""
    o = cfg.optimizer
    s = cfg.approx.storage
    if o.name == "adam":
        return [("Momenta", s, 2, "Adam m and v")]
    if o.name == "sgdm":
        return [("Momenta", s, 1, "SGD momentum")] if o.sgdm.momentum > 0 else []
    if o.name == "bop":
        return [("Momenta", s, 1, "Bop gradient EMA")]
    if o.name == "iir":
        return [("IIR filters", s, 2, "two EMA filter states")]
    # stochastic-switching family (Akesson, seed 004)
    mode = o.switch.mode
    out = []
    if mode == "momentum":
        out.append(("Momenta", s, 1, "switching momentum"))
    elif mode in ("accumulate", "per_image"):
        bits = switch_acc_bits(o.switch.acc_cutoff)
        out.append(("Accumulators", f"int{bits}", 1, f"saturating sign counters, cut-off {o.switch.acc_cutoff}"))
    if o.switch.undo:
        out.append(("Undo copy", "bool", 1, "previous binary weights"))
    return out


# ---------------------------------------------------------------------------
# Activation sizes


def _same_spatial_sizes(cfg: Config) -> list[tuple[int, int]]:
    """(input size, output size) per layer, with conv outputs keeping their input's H x W.

    This is the paper convention: activation sizes as if every convolution used
    'same' padding. Dense layers keep their real sizes (their fan-in is taken from
    the real network, as are all weight counts).
    """
    shape = tuple(cfg.model.input_shape)
    out = []
    for s in cfg.layer_shapes():
        n_in = s.in_size if s.spec.type == "dense" else math.prod(shape)
        if s.spec.type == "conv":
            new = (s.spec.channels,) + tuple(shape[1:])
        elif s.spec.type == "maxpool":
            p = s.spec.pool
            new = (shape[0], max(1, shape[1] // p), max(1, shape[2] // p))
        else:
            new = (s.spec.units,)
        out.append((n_in, math.prod(new)))
        shape = new
    return out


def _argmax(values: list[tuple[int, int]]) -> tuple[int, int | None]:
    best, idx = 0, None
    for size, i in values:
        if size > best:
            best, idx = size, i
    return best, idx


# ---------------------------------------------------------------------------


def known_preset(cfg: Config) -> str | None:
    """The preset name if cfg still has the paper's setting for it (topology, Adam, B = 100)."""
    name = cfg.preset
    if name not in ("mlp", "cnv", "binarynet"):
        return None
    base = load_config(name)
    if cfg.model.layers != base.model.layers or list(cfg.model.input_shape) != list(base.model.input_shape):
        return None
    if cfg.optimizer.name != "adam" or cfg.train.batch_size != 100:
        return None
    return name


def paper_scheme(cfg: Config) -> str | None:
    """'standard' / 'proposed' when every approximation switch matches that scheme exactly."""
    a = cfg.approx
    if (a.bn, a.dy, a.dw, a.storage) == ("l2", "float32", "float", "float32"):
        return "standard"
    if (a.bn, a.dy, a.dw, a.storage) == ("l1_bnn", "po2", "bool", "float16") and a.dy_bits == 5:
        return "proposed"
    return None


def paper_reference(cfg: Config) -> float | None:
    """The paper's total memory (MiB) for this configuration, or None if it is not one of its settings."""
    ref = _paper_entry(cfg)
    return None if ref is None else ref[0]


def _paper_entry(cfg: Config) -> tuple[float, str] | None:
    preset, scheme = known_preset(cfg), paper_scheme(cfg)
    if preset is None or scheme is None:
        return None
    return _PAPER_MIB[(preset, scheme)]


def memory_table(cfg: Config, convention: str = "paper") -> MemoryReport:
    """Every variable of one training step of ``cfg`` with type, size and lifetime."""
    if convention not in CONVENTIONS:
        raise ConfigError(f"memory convention = {convention!r} is not allowed; allowed: {', '.join(CONVENTIONS)}")
    B = cfg.train.batch_size
    shapes = cfg.layer_shapes()
    wl = [s for s in shapes if s.spec.has_weights]
    n_w = sum(s.n_weights for s in wl)
    bn_layers = [s for s in wl if s.spec.bn]
    n_ch = sum(s.out_channels for s in bn_layers)
    stor = storage_dtype(cfg)
    latent_free = cfg.optimizer.latent_free
    paper = convention == "paper"

    rows: list[MemoryRow] = []

    # X: activations retained from the forward pass for the backward pass.
    if paper:
        sizes = _same_spatial_sizes(cfg)
        x_elems = B * sum(sizes[s.index][0] for s in wl)
        rows.append(MemoryRow("X", x_dtype(cfg), x_elems, False, "input of every weight layer, image included"))
        buf, buf_layer = _argmax([(max(sizes[s.index]), s.index) for s in wl])
        dy_buf, dy_layer = buf, buf_layer
    else:
        first = shapes[0]
        rows.append(MemoryRow("X (network input)", input_dtype(cfg), B * first.in_size, False, "read by dW of layer 0"))
        x_elems = B * sum(s.out_size for s in wl)
        rows.append(MemoryRow("X", x_dtype(cfg), x_elems, False, "output of every weight layer (before pooling)"))
        # dX exists for every layer input except the network's; Y for every weight layer.
        cands = [(s.out_size, s.index) for s in wl] + [(s.in_size, s.index) for s in shapes[1:]]
        buf, buf_layer = _argmax(cands)
        dy_buf, dy_layer = _argmax([(s.out_size, s.index) for s in wl])

    rows.append(MemoryRow("dX, Y", stor, B * buf, True, "shared: equal size, disjoint lifetimes", buf_layer))
    rows.append(MemoryRow("mu, sigma", stor, 2 * n_ch, False, "batch statistics per channel"))
    if cfg.approx.bn == "l1_bnn":
        rows.append(MemoryRow("alpha", stor, n_ch, False, "mean |x| per channel (Alg. 2 line 7)"))
        if not paper:
            mask = B * sum(s.in_size for s in wl[1:])
            rows.append(MemoryRow("STE mask", "bool", mask, False, "|x| <= 1 bit per binarised activation"))
    if not paper:
        # A pooled maximum's window position (p*p choices) routes its gradient back.
        argmax: dict[int, int] = {}
        for s in shapes:
            if s.spec.type == "maxpool" and s.index > 0:
                bits = max(1, math.ceil(math.log2(s.spec.pool**2)))
                argmax[bits] = argmax.get(bits, 0) + B * s.out_size
        for bits, n in sorted(argmax.items()):
            rows.append(MemoryRow("pool arg-max", f"int{bits}", n, False, "window position of each pooled maximum"))
    rows.append(MemoryRow("dY", dy_dtype(cfg), B * dy_buf, True, "matrix-product gradient", dy_layer))

    if not latent_free:
        rows.append(MemoryRow("W", stor, n_w, False, "latent weights"))
    elif not paper:
        rows.append(MemoryRow("W", "bool", n_w, False, "binary weights (no latent weights)"))
    rows.append(MemoryRow("dW", dw_dtype(cfg), n_w, False, "weight gradients, kept for the update phase"))
    rows.append(MemoryRow("beta, dbeta", stor, 2 * n_ch, False, "BN biases and their gradients"))
    for name, dt, copies, note in optimizer_state(cfg):
        rows.append(MemoryRow(name, dt, copies * n_w, False, note))
    if not paper and n_ch:
        bo = cfg.optimizer.beta_optimizer if latent_free else cfg.optimizer.name
        k = 2 if bo == "adam" else (1 if cfg.optimizer.sgdm.momentum > 0 else 0)
        if k:
            rows.append(MemoryRow("beta momenta", stor, k * n_ch, False, f"{bo} state of the BN biases"))

    ref = _paper_entry(cfg)
    return MemoryReport(
        config_name=cfg.name,
        preset=cfg.preset,
        scheme=cfg.approx.scheme,
        optimizer=cfg.optimizer.name,
        batch_size=B,
        convention=convention,
        approx={
            "bn": cfg.approx.bn,
            "dy": dy_dtype(cfg),
            "dw": dw_dtype(cfg),
            "storage": stor,
        },
        rows=rows,
        paper_mib=None if ref is None else ref[0],
        paper_source="" if ref is None else ref[1],
    )


def report(cfg: Config, convention: str = "paper") -> tuple[str, dict]:
    """(readable table, JSON-able dict) for the command line."""
    r = memory_table(cfg, convention)
    return r.format_table(), r.to_dict()


def compare_with_paper(convention: str = "paper") -> str:
    """Totals of the paper's three models, standard and proposed, beside its Tables 2 and 3."""
    from .config import apply_overrides

    out = [f"Training memory (MiB), Adam, B = 100, convention {convention}", ""]
    out.append(f"{'model':<10} {'scheme':<9} {'ours':>9} {'paper':>9} {'diff %':>8}  source")
    for name in ("mlp", "cnv", "binarynet"):
        for scheme in ("standard", "proposed"):
            r = memory_table(apply_overrides(load_config(name), [f"approx.scheme={scheme}"]), convention)
            out.append(
                f"{name:<10} {scheme:<9} {r.total_mib:>9.2f} {r.paper_mib:>9.2f} {r.paper_diff_pct():>+8.2f}  "
                f"{r.paper_source}"
            )
    return "\n".join(out)


if __name__ == "__main__":
    print(compare_with_paper("paper"))
    print()
    print(compare_with_paper("exact"))
