"""Per-batch training-energy model after Wang et al. (Section 6, Tables 3 and 4).

The source paper estimated energy with QKeras' energy tool extended to
training: an in-order processor on a 45 nm process with a *cacheless* memory
hierarchy, using Horowitz's energy figures (M. Horowitz, "Computing's energy
problem (and what we can do about it)", ISSCC 2014, pp. 10-14). This module
follows the same method with its own, explicit counts:

* every line of Algorithm 1 / 2 is counted per layer: arithmetic operations
  (by kind and width) and memory traffic (bits read and written, per variable);
* with ``memory="dram"`` (the paper's cacheless model) every access goes to DRAM
  at 1.3 nJ per 64-bit word; ``"dram_high"`` uses 2.6 nJ; ``"sram"`` charges
  each tensor at the 8 KB / 32 KB / 1 MB SRAM figure that holds it;
* with ``float_ops="fp32"`` (the paper: "native support for only 32-bit fixed-
  and floating-point arithmetic") all floating-point arithmetic is float32
  whatever the storage format; ``"storage"`` uses float16 arithmetic when the
  storage is 16-bit.

No constant is fitted to the paper's totals; ``docs/memory_energy.md``
compares the results with Table 3 and explains the differences.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from .config import Config, ConfigError
from .memory_model import dtype_bits, dw_dtype, dy_dtype, known_preset, paper_scheme, switch_acc_bits

__all__ = [
    "HOROWITZ_45NM_PJ",
    "MEMORY_LEVELS",
    "FLOAT_OPS",
    "op_energy_pj",
    "EnergyLine",
    "EnergyReport",
    "energy_table",
    "paper_reference",
    "report",
]

# Horowitz, ISSCC 2014, "Computing's energy problem", 45 nm, 0.9 V (pJ per operation / per 64-bit access).
HOROWITZ_45NM_PJ = {
    "int8_add": 0.03,
    "int32_add": 0.1,
    "fp16_add": 0.4,
    "fp32_add": 0.9,
    "int8_mult": 0.2,
    "int32_mult": 3.1,
    "fp16_mult": 1.1,
    "fp32_mult": 3.7,
    "sram_8kb_64b": 10.0,
    "sram_32kb_64b": 20.0,
    "sram_1mb_64b": 100.0,
    "dram_64b_low": 1300.0,
    "dram_64b_high": 2600.0,
}

MEMORY_LEVELS = ("dram", "dram_high", "sram")
FLOAT_OPS = ("fp32", "storage")

# Per-batch energy (mJ) of Table 3 (Adam, B = 100).
_PAPER_MJ = {
    ("mlp", "standard"): 2.40,
    ("mlp", "proposed"): 0.97,
    ("cnv", "standard"): 144.24,
    ("cnv", "proposed"): 52.61,
    ("binarynet", "standard"): 855.41,
    ("binarynet", "proposed"): 196.26,
}


def int_add_pj(bits: int) -> float:
    """Integer add of ``bits`` width: Horowitz's 8- and 32-bit points, linear in between and proportional outside."""
    h = HOROWITZ_45NM_PJ
    if bits <= 8:
        return h["int8_add"] * bits / 8
    if bits <= 32:
        return h["int8_add"] + (h["int32_add"] - h["int8_add"]) * (bits - 8) / 24
    return h["int32_add"] * bits / 32


def op_energy_pj(kind: str) -> float:
    """Energy of one operation. Kinds: fp32_add, fp16_mult, ... (bf16 costs as fp16), int<w>_add, xnor."""
    if kind == "xnor":
        return int_add_pj(1)
    if kind.startswith("bf16_"):
        kind = "fp16_" + kind[5:]
    if kind in HOROWITZ_45NM_PJ:
        return HOROWITZ_45NM_PJ[kind]
    if kind.startswith("int") and kind.endswith("_add") and kind[3:-4].isdigit():
        return int_add_pj(int(kind[3:-4]))
    raise ValueError(f"unknown operation kind {kind!r}")


def _access_pj_per_bit(memory: str, tensor_bits: float) -> float:
    h = HOROWITZ_45NM_PJ
    if memory == "dram":
        return h["dram_64b_low"] / 64
    if memory == "dram_high":
        return h["dram_64b_high"] / 64
    size = tensor_bits / 8
    if size <= 8 * 1024:
        return h["sram_8kb_64b"] / 64
    if size <= 32 * 1024:
        return h["sram_32kb_64b"] / 64
    return h["sram_1mb_64b"] / 64


# ---------------------------------------------------------------------------


@dataclass
class EnergyLine:
    """One line of the algorithm for one layer: operation counts and memory traffic."""

    phase: str  # forward / loss / backward / update
    line: str  # "L4", "L10-12", ...
    what: str
    layer: int | None  # index in model.layers (None: whole network)
    ops: dict = field(default_factory=dict)  # kind -> count
    traffic: list = field(default_factory=list)  # (variable, "r"/"w", bits)
    op_pj: float = 0.0
    mem_pj: float = 0.0
    priced: list = field(default_factory=list)  # (variable, "r"/"w", bits, pJ), filled by energy_table

    def add_ops(self, kind: str, count: float) -> None:
        if count:
            self.ops[kind] = self.ops.get(kind, 0) + count

    def access(self, variable: str, rw: str, bits: float) -> None:
        if bits:
            self.traffic.append((variable, rw, bits))

    @property
    def total_pj(self) -> float:
        return self.op_pj + self.mem_pj


@dataclass
class EnergyReport:
    config_name: str
    preset: str
    scheme: str
    optimizer: str
    batch_size: int
    memory: str
    float_ops: str
    approx: dict
    lines: list[EnergyLine] = field(default_factory=list)
    paper_mj: float | None = None

    # totals in mJ (1 mJ = 1e9 pJ)
    @property
    def op_mj(self) -> float:
        return sum(x.op_pj for x in self.lines) * 1e-9

    @property
    def mem_mj(self) -> float:
        return sum(x.mem_pj for x in self.lines) * 1e-9

    @property
    def total_mj(self) -> float:
        return self.op_mj + self.mem_mj

    def by_line(self) -> list[dict]:
        """Lines summed over layers, in first-appearance order."""
        acc: dict = {}
        for x in self.lines:
            key = (x.phase, x.line)
            d = acc.setdefault(key, {"phase": x.phase, "line": x.line, "what": x.what, "op_mj": 0.0, "mem_mj": 0.0})
            d["op_mj"] += x.op_pj * 1e-9
            d["mem_mj"] += x.mem_pj * 1e-9
        out = list(acc.values())
        for d in out:
            d["total_mj"] = d["op_mj"] + d["mem_mj"]
        return out

    def by_variable(self) -> list[dict]:
        acc: dict = defaultdict(lambda: {"read_bits": 0.0, "write_bits": 0.0, "mj": 0.0})
        for x in self.lines:
            for var, rw, bits, pj in x.priced:
                d = acc[var]
                d["read_bits" if rw == "r" else "write_bits"] += bits
                d["mj"] += pj * 1e-9
        return [{"variable": k, **v, "mib": (v["read_bits"] + v["write_bits"]) / 8 / (1 << 20)} for k, v in acc.items()]

    def by_layer(self) -> list[dict]:
        acc: dict = {}
        for x in self.lines:
            d = acc.setdefault(x.layer, {"layer": x.layer, "op_mj": 0.0, "mem_mj": 0.0})
            d["op_mj"] += x.op_pj * 1e-9
            d["mem_mj"] += x.mem_pj * 1e-9
        return list(acc.values())

    def op_counts(self) -> dict:
        acc: dict = defaultdict(float)
        for x in self.lines:
            for k, v in x.ops.items():
                acc[k] += v
        return dict(acc)

    def paper_diff_pct(self) -> float | None:
        if self.paper_mj is None:
            return None
        return 100.0 * (self.total_mj - self.paper_mj) / self.paper_mj

    def to_dict(self) -> dict:
        return {
            "kind": "energy",
            "config": self.config_name,
            "preset": self.preset,
            "scheme": self.scheme,
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "memory": self.memory,
            "float_ops": self.float_ops,
            "approx": dict(self.approx),
            "constants_pj": dict(HOROWITZ_45NM_PJ),
            "total_mj": self.total_mj,
            "arithmetic_mj": self.op_mj,
            "memory_mj": self.mem_mj,
            "by_line": self.by_line(),
            "by_variable": self.by_variable(),
            "by_layer": self.by_layer(),
            "op_counts": self.op_counts(),
            "lines": [
                {
                    "phase": x.phase,
                    "line": x.line,
                    "what": x.what,
                    "layer": x.layer,
                    "ops": dict(x.ops),
                    "traffic_bits": {
                        "read": sum(b for _, rw, b in x.traffic if rw == "r"),
                        "write": sum(b for _, rw, b in x.traffic if rw == "w"),
                    },
                    "op_mj": x.op_pj * 1e-9,
                    "mem_mj": x.mem_pj * 1e-9,
                }
                for x in self.lines
            ],
            "paper": None
            if self.paper_mj is None
            else {"mj": self.paper_mj, "source": "Table 3", "diff_pct": self.paper_diff_pct()},
        }

    def format_table(self) -> str:
        a = self.approx
        head = (
            f"Training energy per batch: {self.config_name} (preset {self.preset or '-'}), scheme {self.scheme} "
            f"[bn {a['bn']}, dY {a['dy']}, dW {a['dw']}, storage {a['storage']}], optimiser {self.optimizer}, "
            f"batch {self.batch_size}; 45 nm Horowitz model, memory {self.memory}, float ops {self.float_ops}"
        )
        out = [head, ""]
        out.append(f"{'phase':<9} {'line':<7} {'what':<38} {'ops mJ':>10} {'mem mJ':>10} {'total mJ':>10} {'%':>6}")
        out.append("-" * 96)
        tot = self.total_mj or 1.0
        for d in self.by_line():
            out.append(
                f"{d['phase']:<9} {d['line']:<7} {d['what'][:38]:<38} {d['op_mj']:>10.3f} {d['mem_mj']:>10.3f} "
                f"{d['total_mj']:>10.3f} {100 * d['total_mj'] / tot:>6.1f}"
            )
        out.append("-" * 96)
        out.append(f"{'Total':<56} {self.op_mj:>10.3f} {self.mem_mj:>10.3f} {self.total_mj:>10.3f} {100.0:>6.1f}")
        out.append("")
        out.append(f"{'variable':<16} {'MiB moved':>10} {'mJ':>10}")
        for d in sorted(self.by_variable(), key=lambda d: -d["mj"]):
            out.append(f"{d['variable']:<16} {d['mib']:>10.2f} {d['mj']:>10.3f}")
        if self.paper_mj is not None:
            out.append("")
            out.append(f"paper (Table 3): {self.paper_mj:.2f} mJ (diff {self.paper_diff_pct():+.1f} %)")
        return "\n".join(out)


# ---------------------------------------------------------------------------
# Operation counts per element / per weight


def _bn_forward_ops(kind: str) -> tuple[int, int]:
    """(adds, mults) per element of Y for Algorithm 1/2 line 6 (and line 7 for l1_bnn)."""
    # mean: 1 add; centre: 1 add; l2: square 1 mult + 1 add / l1: |.| free + 1 add;
    # scale by 1/sigma: 1 mult; + beta: 1 add; l1_bnn adds alpha = mean |x|: 1 add.
    if kind == "l2":
        return 4, 2
    if kind == "l1":
        return 4, 1
    return 5, 1


def _bn_backward_ops(kind: str) -> tuple[int, int]:
    """(adds, mults) per element for lines 10-12."""
    # line 10: v = dx / sigma: 1 mult. line 11: mean(v) 1 add; v*x 1 mult (sign flip for x_hat) + 1 add;
    # v - mu(v) - m*x: 2 adds + 1 mult (sign flip for x_hat). line 12: 1 add.
    if kind == "l2":
        return 5, 3  # x used twice in full precision
    if kind == "l1":
        return 5, 2  # Eq. (1): mu(v * x) with real x, then * x_hat
    return 5, 1  # Algorithm 2: both uses of x are x_hat (alpha is per channel)


def _optimizer_ops(name: str, cfg: Config) -> tuple[int, int, dict]:
    """(float adds, float mults, other ops) per weight for line 18."""
    if name == "adam":
        # m: 2 mult 1 add; v: 3 mult 1 add; sqrt, divide (1 mult-equivalent each), lr 1 mult,
        # + eps 1 add, W - step 1 add, clip 2 compares (adds).
        return 6, 8, {}
    if name == "sgdm":
        return 4, 2, {}  # m = mu m + g; W -= lr m; clip
    if name == "bop":
        return 2, 2, {}  # m = (1-g) m + g dW; |m| > tau (sign test free)
    if name == "iir":
        return 2, 4, {}  # two first-order filters; sign of the output is free
    sw = cfg.optimizer.switch
    lfsr = {"int16_add": 1}  # one LFSR step and compare per weight
    if sw.mode in ("accumulate", "per_image"):
        bits = switch_acc_bits(sw.acc_cutoff)
        return 0, 0, {f"int{bits}_add": 4, **lfsr}  # count, saturate, threshold, probability compare
    if sw.mode == "momentum":
        return 3, 2, lfsr
    return 2, 1, lfsr if sw.mode == "stochastic" else {}


def _optimizer_state_bits(cfg: Config) -> list[tuple[str, int]]:
    """Optimiser variables read and written per weight (besides dW): (variable, bits)."""
    o = cfg.optimizer
    sb = dtype_bits(cfg.approx.storage)
    if o.name == "adam":
        return [("W", sb), ("momenta", sb), ("momenta", sb)]
    if o.name == "sgdm":
        return [("W", sb)] + ([("momenta", sb)] if o.sgdm.momentum > 0 else [])
    if o.name == "bop":
        return [("momenta", sb)]
    if o.name == "iir":
        return [("IIR filters", sb), ("IIR filters", sb)]
    if o.switch.mode in ("accumulate", "per_image"):
        return [("accumulators", switch_acc_bits(o.switch.acc_cutoff))]
    if o.switch.mode == "momentum":
        return [("momenta", sb)]
    return []


# ---------------------------------------------------------------------------


def paper_reference(cfg: Config) -> float | None:
    """Table 3's per-batch energy (mJ) for this configuration, or None if it is not one of the paper's settings."""
    preset, scheme = known_preset(cfg), paper_scheme(cfg)
    if preset is None or scheme is None:
        return None
    return _PAPER_MJ[(preset, scheme)]


def energy_table(cfg: Config, memory: str = "dram", float_ops: str = "fp32") -> EnergyReport:
    """Per-batch training energy of ``cfg``, broken down by algorithm line, layer and variable."""
    if memory not in MEMORY_LEVELS:
        raise ConfigError(f"energy memory = {memory!r} is not allowed; allowed: {', '.join(MEMORY_LEVELS)}")
    if float_ops not in FLOAT_OPS:
        raise ConfigError(f"energy float_ops = {float_ops!r} is not allowed; allowed: {', '.join(FLOAT_OPS)}")
    a = cfg.approx
    B = cfg.train.batch_size
    shapes = cfg.layer_shapes()
    wl = [s for s in shapes if s.spec.has_weights]
    sb = dtype_bits(a.storage)
    xb = 1 if a.bn == "l1_bnn" else sb  # bits of the retained activations X
    dyd = dy_dtype(cfg)
    dyb = dtype_bits(dyd)
    dwb = dtype_bits(dw_dtype(cfg))
    in_bits = {"binary": 1, "int8": 8}.get(cfg.model.input_format, sb)
    f = "fp32" if float_ops == "fp32" or a.storage == "float32" else ("bf16" if a.storage == "bfloat16" else "fp16")
    fadd, fmul = f"{f}_add", f"{f}_mult"
    dy_float = a.dy in ("float32", "float16", "bfloat16")

    lines: list[EnergyLine] = []

    def new(phase, line, what, layer):
        x = EnergyLine(phase, line, what, layer)
        lines.append(x)
        return x

    # ---------------- forward
    k = -1
    for s in shapes:
        if s.spec.type == "maxpool":
            x = new("forward", "pool", "max pooling (forward)", s.index)
            x.add_ops(fadd, B * s.out_size * (s.spec.pool**2 - 1))  # comparisons
            x.access("X_hat", "r", B * s.in_size * 1)
            x.access("X_hat", "w", B * s.out_size * 1)
            continue
        k += 1
        first = k == 0
        macs = B * s.out_size * s.fan_in
        C = s.out_channels
        x = new("forward", "L3-4", "Y = X_hat W_hat (XNOR-popcount)", s.index)
        if first and cfg.model.input_format != "binary":
            if cfg.model.input_format == "int8":
                x.add_ops(f"int{_acc_bits(s.fan_in, 8)}_add", macs)  # add/sub by the weight sign
            else:
                x.add_ops(fmul, macs)
                x.add_ops(fadd, macs)
            x.access("X", "r", B * s.in_size * in_bits)
        else:
            x.add_ops("xnor", macs)
            x.add_ops(f"int{_acc_bits(s.fan_in, 1)}_add", macs)
            x.access("X_hat", "r", B * s.in_size * 1)
        x.access("W_hat", "r", s.n_weights * 1)
        x.access("Y", "w", B * s.out_size * sb)
        if s.spec.bn:
            x = new("forward", "L5-6", f"batch norm ({a.bn})", s.index)
            adds, mults = _bn_forward_ops(a.bn)
            n = B * s.out_size
            x.add_ops(fadd, adds * n)
            x.add_ops(fmul, mults * n + 4 * C)  # per channel: sqrt/reciprocal, 1/B
            x.access("Y", "r", n * sb)
            x.access("beta", "r", C * sb)
            x.access("mu, sigma", "w", 2 * C * sb)
            x.access("X", "w", n * xb)
            if a.bn == "l1_bnn":
                x.access("alpha", "w", C * sb)
        if xb > 1 and s is not wl[-1]:
            # a binary copy for the next layer's XNOR (the real X stays for the backward pass)
            x = new("forward", "L2", "X_hat = sgn(X)", s.index)
            x.access("X_hat", "w", B * s.out_size * 1)

    # ---------------- loss
    last = wl[-1]
    x = new("loss", "loss", "softmax cross-entropy gradient", last.index)
    nl = B * last.out_size
    x.add_ops(fmul, 2 * nl)
    x.add_ops(fadd, 2 * nl)
    x.access("X", "r", nl * sb)
    x.access("dX", "w", nl * sb)

    # ---------------- backward
    k = len(wl)
    for s in reversed(shapes):
        if s.spec.type == "maxpool":
            if k == 0:
                continue  # pooling of the raw input: no gradient flows there
            x = new("backward", "pool", "max pooling (backward routing)", s.index)
            x.access("dX", "r", B * s.out_size * sb)
            x.access("dX", "w", B * s.in_size * sb)
            continue
        k -= 1
        first = k == 0
        n = B * s.out_size
        C = s.out_channels
        macs = B * s.out_size * s.fan_in
        if s.spec.bn:
            x = new("backward", "L10-12", f"batch norm backward ({a.bn})", s.index)
            adds, mults = _bn_backward_ops(a.bn)
            x.add_ops(fadd, adds * n)
            x.add_ops(fmul, mults * n + 3 * C)
            x.access("dX", "r", n * sb)
            x.access("X", "r", n * xb)
            x.access("mu, sigma", "r", C * sb)
            if a.bn == "l1_bnn":
                x.access("alpha", "r", C * sb)
            x.access("dbeta", "w", C * sb)
            if dy_float:
                x.access("dY", "w", n * dyb)
        if not dy_float:
            x = new("backward", "L13", f"dY = quantise({dyd})", s.index)
            x.add_ops("int32_add", (3 if a.dy == "po2" else 2) * n)  # max |dY|, exponent / scale, rounding
            if not s.spec.bn:
                x.access("dX", "r", n * sb)
            x.access("dY", "w", n * dyb)
        if not first:
            x = new("backward", "L14", "dX = dY W_hat^T", s.index)
            _matmul_ops(x, a.dy, macs, fadd, fmul, binary_other=True)
            if not dy_float:
                x.add_ops("int32_add", B * s.in_size)  # int32 sums back to the float dX
            x.access("dY", "r", n * dyb)
            x.access("W_hat", "r", s.n_weights * 1)
            x.access("dX", "w", B * s.in_size * sb)
        x = new("backward", "L15", "dW = X_hat^T dY", s.index)
        binary_in = not first or cfg.model.input_format == "binary"
        _matmul_ops(x, a.dy, macs, fadd, fmul, binary_other=binary_in)
        if first:
            x.access("X", "r", B * s.in_size * in_bits)
        else:
            x.access("X", "r", B * s.in_size * xb)
        x.access("dY", "r", n * dyb)
        x.access("dW", "w", s.n_weights * dwb)

    # ---------------- update
    oname = cfg.optimizer.name
    adds, mults, other = _optimizer_ops(oname, cfg)
    state = _optimizer_state_bits(cfg)
    for s in wl:
        nw = s.n_weights
        x = new("update", "L18", f"W update ({oname})", s.index)
        x.add_ops(fadd, adds * nw)
        x.add_ops(fmul, mults * nw)
        for kind, c in other.items():
            x.add_ops(kind, c * nw)
        x.access("dW", "r", nw * dwb)
        for var, bits in state:
            x.access(var, "r", nw * bits)
            x.access(var, "w", nw * bits)
        if cfg.optimizer.latent_free:
            x.access("W_hat", "r", nw * 1)
        x.access("W_hat", "w", nw * 1)
        if oname == "switch" and cfg.optimizer.switch.undo:
            x.access("undo copy", "w", nw * 1)
    beta_opt = oname if oname in ("adam", "sgdm") else cfg.optimizer.beta_optimizer
    b_adds, b_mults, _ = _optimizer_ops(beta_opt, cfg)
    b_state = 2 if beta_opt == "adam" else (1 if cfg.optimizer.sgdm.momentum > 0 else 0)
    for s in wl:
        if not s.spec.bn:
            continue
        C = s.out_channels
        x = new("update", "L19", f"beta update ({beta_opt})", s.index)
        x.add_ops(fadd, b_adds * C)
        x.add_ops(fmul, b_mults * C)
        x.access("dbeta", "r", C * sb)
        for var in ["beta"] + ["beta momenta"] * b_state:
            x.access(var, "r", C * sb)
            x.access(var, "w", C * sb)

    # ---------------- price everything
    for x in lines:
        x.op_pj = sum(c * op_energy_pj(kind) for kind, c in x.ops.items())
        priced = []
        for var, rw, bits in x.traffic:
            pj = bits * _access_pj_per_bit(memory, bits)
            priced.append((var, rw, bits, pj))
        x.priced = priced
        x.mem_pj = sum(p[3] for p in priced)

    return EnergyReport(
        config_name=cfg.name,
        preset=cfg.preset,
        scheme=a.scheme,
        optimizer=oname,
        batch_size=B,
        memory=memory,
        float_ops=float_ops,
        approx={"bn": a.bn, "dy": dyd, "dw": dw_dtype(cfg), "storage": a.storage},
        lines=lines,
        paper_mj=paper_reference(cfg),
    )


def _acc_bits(fan_in: int, operand_bits: int) -> int:
    """Width of an exact accumulator of ``fan_in`` signed terms of ``operand_bits`` bits."""
    return operand_bits + max(1, math.ceil(math.log2(fan_in + 1)))


def _matmul_ops(x: EnergyLine, dy: str, macs: int, fadd: str, fmul: str, *, binary_other: bool) -> None:
    """Lines 14-15: one operand is dY, the other binary (W_hat or X_hat) or a real first-layer input."""
    if dy in ("float32", "float16", "bfloat16"):
        # the paper's baseline: float multiply-accumulate, as software does for any operand
        x.add_ops(fmul, macs)
        x.add_ops(fadd, macs)
    elif dy == "po2":
        if binary_other:
            # Section 5.2: shift the power of two into an int32, flip its sign, accumulate
            x.add_ops("int32_add", 2 * macs)
        else:
            x.add_ops("int32_add", macs)  # exponent add on the real operand
            x.add_ops(fadd, macs)
    else:  # int-k block floating point
        if binary_other:
            x.add_ops("int32_add", macs)  # add or subtract
        else:
            x.add_ops(fmul, macs)
            x.add_ops(fadd, macs)


def report(cfg: Config, memory: str = "dram", float_ops: str = "fp32") -> tuple[str, dict]:
    """(readable table, JSON-able dict) for the command line."""
    r = energy_table(cfg, memory, float_ops)
    return r.format_table(), r.to_dict()


def compare_with_paper(memory: str = "dram", float_ops: str = "fp32") -> str:
    """Per-batch energy of the paper's three models, standard and proposed, beside Table 3."""
    from .config import apply_overrides, load_config

    out = [f"Training energy per batch (mJ), Adam, B = 100, memory {memory}, float ops {float_ops}", ""]
    out.append(
        f"{'model':<10} {'scheme':<9} {'ours':>9} {'ops':>8} {'memory':>8} {'paper':>8} {'diff %':>7} "
        f"{'saving':>7} {'paper':>6}"
    )
    for name in ("mlp", "cnv", "binarynet"):
        res = {}
        for scheme in ("standard", "proposed"):
            cfg = apply_overrides(load_config(name), [f"approx.scheme={scheme}"])
            res[scheme] = energy_table(cfg, memory, float_ops)
        for scheme, r in res.items():
            saving = paper_saving = ""
            if scheme == "proposed":
                saving = f"{res['standard'].total_mj / r.total_mj:.2f}x"
                paper_saving = f"{res['standard'].paper_mj / r.paper_mj:.2f}x"
            out.append(
                f"{name:<10} {scheme:<9} {r.total_mj:>9.2f} {r.op_mj:>8.2f} {r.mem_mj:>8.2f} {r.paper_mj:>8.2f} "
                f"{r.paper_diff_pct():>+7.1f} {saving:>7} {paper_saving:>6}"
            )
    return "\n".join(out)


if __name__ == "__main__":
    print(compare_with_paper())
