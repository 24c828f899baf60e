"""Datapath widths derived from the configuration (docs/arithmetic.md, "Widths").

Every bound is a worst case over all inputs, weights and biases the formats allow,
so a register of the derived width can never overflow. ``derive_widths(cfg)``
returns one :class:`LayerWidths` per weight layer; :func:`check_widths` raises a
:class:`ConfigError` naming the quantity, the layer, the width and the limit when a
per-element accumulator would exceed ``hw.max_acc_bits``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..schema import ConfigError
from .arith import ArithParams

__all__ = [
    "hw_supported",
    "model_support_error",
    "pools_after",
    "pools_before_bn",
    "bn_spatial",
    "dx_cover",
    "LayerBounds",
    "signed_bits",
    "unsigned_bits",
    "layer_bounds",
    "derive_widths",
    "check_widths",
]


def signed_bits(m: int) -> int:
    """Bits of a two's-complement register holding every value in [-m, m]."""
    return int(m).bit_length() + 1


def unsigned_bits(m: int) -> int:
    return max(int(m).bit_length(), 1)


@dataclass
class LayerBounds:
    """Worst-case magnitudes of one weight layer's quantities (all integers)."""

    layer: int  # index among weight layers
    fan_in: int  # N
    fan_out: int  # M (output channels)
    n: int  # samples per channel in BN statistics (B, times spatial positions for conv)
    x_max: int  # |input|: 1, or 128 for 8-bit input
    y: int  # |Y| <= N x_max
    sum_y: int  # per-channel sum of Y
    S: int  # sum |B y - sum_y|
    C: int  # per-channel threshold numerator (BN unit, sequential)
    z: int  # |K y - C| (implicit; never stored per element)
    A: int  # sum |z| (per channel)
    alpha_q: int
    theta: int  # thresholds are saturated to [-(y+1), y+1]
    logit_q: int  # output layer only (0 elsewhere)
    dx: int  # gradient reaching this layer's BN output (from above / loss)
    P: int  # P1, P2 = sums of dx over the batch
    Q: int  # BN-backward integer
    po2_num: int  # |Q| B (conv: |Q|, n folded into the per-channel thresholds): the leading-one detector's operand
    dX: int  # dY_po2 W^T accumulator (conv: the transposed convolution; 0 for the first layer: not computed)
    dW: int  # X^T dY_po2 accumulator
    running: int  # running mean / scale in Q.running_frac

    def widths(self) -> dict[str, int]:
        """Register widths in bits (signed unless the quantity is non-negative)."""
        d = asdict(self)
        out = {}
        for key, v in d.items():
            if key in ("layer", "fan_in", "fan_out", "n", "x_max"):
                continue
            out[key] = unsigned_bits(v) if key in ("S", "A", "alpha_q", "po2_num") else signed_bits(v)
        return out

    def per_element(self) -> dict[str, int]:
        """Widths of the per-element datapath (what max_acc_bits limits)."""
        w = self.widths()
        keys = ["y", "sum_y", "S", "theta", "dx", "P", "Q", "po2_num", "dX", "dW", "running"]
        if self.logit_q:
            keys.append("logit_q")
        return {k: w[k] for k in keys}


def layer_bounds(cfg) -> list[LayerBounds]:
    """Worst-case bounds of every weight layer of ``cfg`` for the hardware model."""
    p = ArithParams.from_config(cfg)
    h = cfg.hw
    wl = cfg.weight_layers()
    B = cfg.train.batch_size
    fb = p.beta_frac
    beta_max = 1 << (p.beta_int - 1 + fb)  # |beta_q| <= 2^(I-1+Fb)
    beta_real = 1 << (p.beta_int - 1)
    out = []
    spatial = bn_spatial(cfg)
    # Gradient into the output layer's BN comes from the loss; into hidden layers from dX above.
    for j, s in enumerate(wl):
        first = j == 0
        x_max = 128 if (first and h.input_kind(cfg) == "int8") else 1
        n = B * spatial[j]  # BN statistics: over the batch and the (pooled, with before_bn) positions
        m = s.out_channels
        y = s.fan_in * x_max
        sum_y = n * y
        S = n * 2 * max(n - 1, 0) * y
        s_eff = max(S, 1)
        C = n * (1 << fb) * sum_y + beta_max * s_eff
        K = n * n * (1 << fb)
        z = K * y + C
        A = n * z
        alpha_q = ((1 + beta_real) << p.alpha_frac) + 1
        last = j == len(wl) - 1
        logit_q = (((n + 1) // 2 + beta_real) << p.logit_frac) + 1 if last else 0
        if last:
            dx = (1 << p.prob_frac) if p.loss == "cross_entropy" else (1 << p.logit_frac) + logit_q
        else:
            dx = wl[j + 1].out_channels * dx_cover(wl[j + 1]) * (1 << p.span)  # dX of the layer above
        P = n * dx
        Q = (1 << p.alpha_frac) * (n * dx + P) + alpha_q * P
        # output layer: the loss's 1/B cancels the B; conv: n = B H W goes into the per-channel thresholds
        po2_num = Q if (last or s.spec.type == "conv") else Q * n
        dX = 0 if first else m * dx_cover(s) * (1 << p.span)
        dW = B * s.spatial * x_max * (1 << p.span)  # over every position (the routed codes with before_bn)
        running = (2 * y + 1) << p.running_frac
        out.append(
            LayerBounds(j, s.fan_in, m, n, x_max, y, sum_y, S, C, z, A, alpha_q, y + 1, logit_q, dx, P, Q,
                        po2_num, dX, dW, running)
        )
    return out


def dx_cover(s) -> int:
    """Most addends of one ``dX`` value per output channel: 1 for a dense layer; for a conv layer (stride 1) the
    output positions whose window covers one input position, ``min(k, Ho) min(k, Wo)`` (valid or same)."""
    if s.spec.type != "conv":
        return 1
    k = s.spec.kernel
    return min(k, s.out_shape[1]) * min(k, s.out_shape[2])


def derive_widths(cfg) -> list[dict[str, int]]:
    """Per weight layer: the register width (bits) of every quantity."""
    return [b.widths() for b in layer_bounds(cfg)]


NAMES = {
    "y": "Y (popcount) accumulator",
    "sum_y": "BN sum of Y",
    "S": "BN l1 scale accumulator S",
    "theta": "BN threshold",
    "dx": "BN input gradient dx",
    "P": "BN backward sums P1/P2",
    "Q": "BN backward value Q",
    "po2_num": "po2 leading-one operand (|Q| B; conv |Q|)",
    "dX": "dX accumulator",
    "dW": "dW accumulator",
    "running": "running BN statistics",
    "logit_q": "output logits",
}


def hw_supported(cfg) -> bool:
    """Whether the generated RTL covers this topology: dense layers only, each with batch norm
    (``rtl_gen.plan.check_generator_support``). The bit-exact model covers more: :func:`model_support_error`."""
    return all(s.spec.type == "dense" and s.spec.bn for s in cfg.layer_shapes())


def model_support_error(cfg) -> str | None:
    """Why the bit-exact model cannot run this topology (one line naming the layer), or None.

    It runs dense and conv layers (stride 1, valid / same padding), each with batch norm, a maxpool directly after
    a conv layer (pooling the BN output before the sign, as the float reference, or with ``before_bn`` the conv's
    ``Y`` before its BN).
    """
    shapes = cfg.layer_shapes()
    for i, s in enumerate(shapes):
        where = f"model.layers[{s.index}]"
        if s.spec.has_weights and not s.spec.bn:
            return f"{where}.bn = false: the hardware model needs BN on every layer"
        if s.spec.type == "maxpool" and (i == 0 or shapes[i - 1].spec.type != "conv"):
            return f"{where}: the hardware model pools only the output of a conv layer (maxpool right after a conv)"
    return None  # the configuration itself requires a dense output layer of num_classes units


def pools_after(cfg) -> list[int]:
    """Per weight layer: the window of the maxpool that follows it (0: none)."""
    out = []
    for s in cfg.layer_shapes():
        if s.spec.has_weights:
            out.append(0)
        elif out:
            out[-1] = s.spec.pool
    return out


def pools_before_bn(cfg) -> list[bool]:
    """Per weight layer: whether the maxpool after it pools its ``Y`` before the BN (``before_bn``, BinaryNet's
    order ``conv -> maxpool -> BN -> sign``) rather than the BN output."""
    out = []
    for s in cfg.layer_shapes():
        if s.spec.has_weights:
            out.append(False)
        elif out:
            out[-1] = bool(s.spec.before_bn)
    return out


def bn_spatial(cfg) -> list[int]:
    """Per weight layer: the positions per image its BN statistics run over (the pooled ones for ``before_bn``)."""
    pools, first = pools_after(cfg), pools_before_bn(cfg)
    out = []
    for j, s in enumerate(cfg.weight_layers()):
        if first[j]:
            p = pools[j]
            out.append((s.out_shape[1] // p) * (s.out_shape[2] // p))
        else:
            out.append(s.spatial)
    return out


def check_widths(cfg, *, conv: bool = False) -> None:
    """Raise ConfigError when a per-element register would need more than ``hw.max_acc_bits`` bits.

    At load time (``HwConfig.check_against``) only the dense topologies the RTL builds are checked, so that
    float-only runs of conv presets (CNV, BinaryNet) at any ``approx.dy_bits`` keep loading; ``conv=True``
    (``HwModel``) checks every topology the bit-exact model runs.
    """
    if not (hw_supported(cfg) or (conv and model_support_error(cfg) is None)):
        return  # a topology the hardware model does not run (HwModel rejects it)
    limit = cfg.hw.max_acc_bits
    for b in layer_bounds(cfg):
        for key, bits in b.per_element().items():
            if bits > limit:
                raise ConfigError(
                    f"hw: the {NAMES[key]} of weight layer {b.layer} (fan-in {b.fan_in}, batch {b.n}, "
                    f"approx.dy_bits = {cfg.approx.dy_bits}) needs {bits} bits > hw.max_acc_bits = {limit}; "
                    f"lower approx.dy_bits or train.batch_size, or set hw.check_widths = false for float-only runs"
                )
