"""Bit-exact integer arithmetic of one on-chip training step (docs/arithmetic.md is the contract).

Every function here has the call shape of one hardware component, so the
component's cocotb test can compare against it:

===============================  =====================================================
:func:`xnor_popcount`            ``Y = X_hat W_hat`` (+-1 x +-1, or 8-bit x +-1 for the first layer)
:func:`bn_forward`               l1 BN statistics, thresholds, ``x_hat``, STE mask, alpha (training)
:func:`bn_forward_eval`          thresholds from running statistics (inference)
:func:`output_logits`            fixed-point logits of the output layer
:func:`loss_grad`                squared-hinge gradient, loss and correct count
:func:`bn_backward`              Algorithm 2 lines 10-12 (BNN-specific l1), integer ``Q`` and ``dbeta``
:func:`po2_quantise`             po2_k codes of ``dY`` (leading one + mantissa compare, layer bias)
:func:`po2_backward_dx`          ``dX = dY_po2 W_hat^T`` (shift, sign flip, add)
:func:`po2_backward_dw`          ``dW = X^T dY_po2``
:func:`po2_backward_dw_window`   ``X^T t``, ``t`` the windowed ternary codes (``hw.dw_window``)
:func:`conv_xnor_popcount`       the XNOR-popcount over sliding windows (stride 1, valid / same padding)
:func:`maxpool_argmax`           first maximum of each pooling window of ``Y``; ``maxpool_select`` / ``_route``
:func:`po2_backward_dx_conv`     ``dX``: the transposed convolution of the po2 codes with the weights
:func:`po2_backward_dw_conv`     ``dW``: the correlation of the input with the po2 codes over batch and positions
===============================  =====================================================

Conv activations are channels-first ``[B, C, H, W]`` and conv weights ``[Co, Ci, k, k]`` (the float
reference's layout); per-channel BN quantities of a conv layer are taken over ``n = B H W`` values.

All datapath values are integers (int64 per element; per-channel quantities of the
BN unit, computed once per channel per batch, as exact Python ints). Matrix products
of small integers are evaluated with float BLAS only when every partial sum is an
integer below 2**24 (float32) or 2**53 (float64), where float addition is exact
whatever the summation order: the result is provably the integer sum the hardware
forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ArithParams",
    "BnForward",
    "Po2Codes",
    "exact_matmul",
    "bit_length",
    "round_log2_ratio",
    "sqrt2_thresholds",
    "xnor_popcount",
    "bn_forward",
    "bn_forward_eval",
    "running_update",
    "output_logits",
    "output_logits_eval",
    "loss_grad",
    "loss_grad_scale",
    "softmax_q",
    "exp2_table",
    "LOG2E_Q16",
    "bn_backward",
    "po2_quantise",
    "po2_values",
    "po2_backward_dx",
    "po2_backward_dw",
    "po2_backward_dw_window",
    "dw_window_ternary",
    "div_round",
    "conv_windows",
    "conv_xnor_popcount",
    "maxpool_argmax",
    "maxpool_select",
    "maxpool_route",
    "route_codes",
    "po2_backward_dx_conv",
    "po2_backward_dw_conv",
    "po2_backward_dw_window_conv",
]


@dataclass(frozen=True)
class ArithParams:
    """The fixed-point parameters the datapath is built with (from ``cfg.hw`` and ``cfg.approx``)."""

    k: int = 5  # po2_k: sign + (k-1)-bit exponent field
    beta_frac: int = 16
    beta_int: int = 4
    alpha_frac: int = 10
    logit_frac: int = 8
    recip_guard: int = 8
    running_frac: int = 8
    running_shift: int = 3
    loss: str = "cross_entropy"  # or "squared_hinge"
    exp_frac: int = 16  # 2^f lookup table entries in Q.exp_frac
    prob_frac: int = 16  # softmax probabilities / loss gradient in Q.prob_frac

    @property
    def e_max(self) -> int:
        """Largest po2 exponent (the layer maximum gets it): 2**(k-2) - 1."""
        return (1 << (self.k - 2)) - 1

    @property
    def e_min(self) -> int:
        """Smallest po2 exponent: -2**(k-2) + 1 (field value 0 is reserved for zero)."""
        return -(1 << (self.k - 2)) + 1

    @property
    def span(self) -> int:
        """Largest shift of a po2 addend: e_max - e_min = 2**(k-1) - 2."""
        return self.e_max - self.e_min

    @property
    def beta_lo(self) -> int:
        return -(1 << (self.beta_int - 1 + self.beta_frac))

    @property
    def beta_hi(self) -> int:
        return (1 << (self.beta_int - 1 + self.beta_frac)) - 1

    @classmethod
    def from_config(cls, cfg) -> ArithParams:
        h = cfg.hw
        return cls(
            k=int(cfg.approx.dy_bits),
            beta_frac=h.beta_frac_bits,
            beta_int=h.beta_int_bits,
            alpha_frac=h.alpha_frac_bits,
            logit_frac=h.logit_frac_bits,
            recip_guard=h.recip_guard_bits,
            running_frac=h.running_frac_bits,
            running_shift=h.running_shift,
            loss=cfg.train.loss,
            exp_frac=h.exp_frac_bits,
            prob_frac=h.prob_frac_bits,
        )


# ---------------------------------------------------------------------------
# Integer helpers


def exact_matmul(a: np.ndarray, b: np.ndarray, bound: int) -> np.ndarray:
    """``a @ b`` of integer matrices as int64, exactly.

    ``bound`` must bound ``sum_j |a_ij| |b_jk|`` (hence every partial sum); below 2**24
    float32 BLAS is exact, below 2**53 float64, otherwise int64 matmul is used.
    """
    if bound < (1 << 24):
        r = np.asarray(a, dtype=np.float32) @ np.asarray(b, dtype=np.float32)
    elif bound < (1 << 53):
        r = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)
    elif bound < (1 << 62):
        return np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64)
    else:
        raise OverflowError(f"matrix product bound {bound} exceeds 62 bits")
    return r.astype(np.int64)


def bit_length(n: np.ndarray) -> np.ndarray:
    """Exact ``int.bit_length`` of a non-negative int64 array (0 -> 0)."""
    n = np.asarray(n, dtype=np.int64)
    _, e = np.frexp(n.astype(np.float64))
    e = e.astype(np.int64)
    # float64 rounding can carry into the next power of two for n >= 2**53: correct it.
    big = e > 53
    if np.any(big):
        over = big & ((n >> np.maximum(e - 1, 0)) == 0)
        e = e - over
    return e


def div_round(num, den):
    """Round-half-up quotient ``floor((2 num + den) / (2 den))`` for ``den > 0`` (ints or object arrays)."""
    return (2 * num + den) // (2 * den)


def _obj(a) -> np.ndarray:
    return np.asarray(a).astype(object)


def sqrt2_thresholds(m_d: int) -> tuple[int, int]:
    """``(ceil(sqrt2 * m_d), ceil(m_d / sqrt2))`` for an integer ``m_d >= 1``, exactly (integer square root)."""
    q = math.isqrt(2 * m_d * m_d)  # floor(sqrt2 m_d); sqrt2 m_d is irrational
    return q + 1, q // 2 + 1


def round_log2_ratio(num: np.ndarray, den, width: int | None = None, mult: int = 1) -> np.ndarray:
    """``[log2(num mult / den)]`` (round to nearest) for positive integers, exactly, as int64.

    ``num``: int64 array ``[..., C]``; ``den``: per-channel positive ints ``[C]`` (broadcast); ``mult``: a
    positive configuration constant (``n`` of a conv layer, folded into the per-channel constants so that the
    per-element operand stays ``num``). Hardware form: leading-one position ``n`` of ``num``, mantissa ``M_N``
    (``num`` left-aligned to ``W`` bits); per channel ``d = floor(log2(den / mult))`` and the thresholds
    ``T_hi = ceil(sqrt2 X)``, ``T_lo = ceil(X / sqrt2)`` of ``X = den 2^(W-1-d) / mult`` (in ``[2^(W-1), 2^W)``)::

        [log2(num mult / den)] = n - d + (M_N >= T_hi) - (M_N < T_lo)

    With ``mult = 1``, ``d`` is ``den``'s leading-one position and ``X`` its left-aligned mantissa ``M_D``.
    No tie is possible: ``num mult / den = sqrt2 * 2**j`` has no integer solution.
    Entries with ``num <= 0`` give meaningless values.
    """
    num = np.asarray(num, dtype=np.int64)
    mult = int(mult)
    if mult < 1:
        raise ValueError("round_log2_ratio: the constant factor must be >= 1")
    den_list = [int(v) for v in np.asarray(den, dtype=object).reshape(-1)]
    if any(v < 1 for v in den_list):
        raise ValueError("round_log2_ratio: denominators must be >= 1")
    bn = bit_length(np.maximum(num, 1))
    bd = [v.bit_length() for v in den_list]
    if width is None:  # the dense form aligns both operands to the wider; any W >= bitlen(num) is exact
        w = max(int(bn.max()) if bn.size else 1, max(bd, default=1) if mult == 1 else 1)
    else:
        w = int(width)
    if w > 61:
        raise OverflowError(f"round_log2_ratio: operands of {w} bits exceed the 61-bit model limit")
    m_n = np.maximum(num, 1) << (w - bn)
    t_hi = np.empty(len(den_list), dtype=np.int64)
    t_lo = np.empty(len(den_list), dtype=np.int64)
    d_pos = np.empty(len(den_list), dtype=np.int64)
    for i, v in enumerate(den_list):
        d = _floor_log2_ratio(v, mult)
        a = w - 1 - d  # X = v 2^a / mult
        up, down = (a, 0) if a >= 0 else (0, -a)
        r = math.isqrt(2 * (v << up) ** 2)  # floor(sqrt2 v 2^up): sqrt2 v 2^up is irrational
        t_hi[i] = r // (mult << down) + 1  # ceil(sqrt2 X) (X sqrt2 is irrational)
        t_lo[i] = r // (2 * mult << down) + 1  # ceil(X / sqrt2)
        d_pos[i] = d
    shape = (1,) * (num.ndim - 1) + (-1,)
    rho = (m_n >= t_hi.reshape(shape)).astype(np.int64) - (m_n < t_lo.reshape(shape)).astype(np.int64)
    return bn - 1 - d_pos.reshape(shape) + rho


def _floor_log2_ratio(a: int, b: int) -> int:
    """``floor(log2(a / b))`` for positive integers, exactly."""
    t = a.bit_length() - b.bit_length()
    return t if (a >= b << t if t >= 0 else a << -t >= b) else t - 1


def _rows(a: np.ndarray) -> np.ndarray:
    """A channels-first ``[B, C, H, W]`` tensor as the ``[B H W, C]`` matrix of its per-channel values (rows
    ordered b, h, w); a ``[B, C]`` matrix unchanged."""
    a = np.asarray(a)
    return a.transpose(0, 2, 3, 1).reshape(-1, a.shape[1]) if a.ndim == 4 else a


def _unrows(a: np.ndarray, shape: tuple) -> np.ndarray:
    """Inverse of :func:`_rows` for a tensor of ``shape``."""
    if len(shape) != 4:
        return a
    b, c, h, w = shape
    return np.ascontiguousarray(a.reshape(b, h, w, c).transpose(0, 3, 1, 2))


def _chan(v, ndim: int) -> np.ndarray:
    """A per-channel vector ``[C]`` shaped to broadcast against a ``[B, C]`` or ``[B, C, H, W]`` tensor."""
    return np.asarray(v).reshape((1, -1) + (1,) * (ndim - 2))


# ---------------------------------------------------------------------------
# Forward


def xnor_popcount(x: np.ndarray, w: np.ndarray, x_max: int = 1) -> np.ndarray:
    """``Y = X W`` for ``x`` ([B, N], +-1 or 8-bit integers with ``|x| <= x_max``) and ``w`` ([N, M], +-1).

    For +-1 inputs this is ``2 * popcount(XNOR(x, w)) - N`` per output; for 8-bit inputs a
    sign-flip-and-add. Result int64, ``|Y| <= N * x_max``.
    """
    return exact_matmul(x, w, int(x.shape[1]) * int(x_max))


@dataclass
class BnForward:
    """What the BN unit computes for one layer in training mode (per channel unless noted)."""

    x_hat: np.ndarray  # int8 [B, M] (conv: [B, M, H, W]) +-1 (per element)
    mask: np.ndarray  # bool, shape of x_hat: straight-through mask |x| <= 1 (per element)
    sum_y: np.ndarray  # int64: sum over the batch of y
    S: np.ndarray  # int64: sum |B y - sum_y| = B^2 * s (the l1 scale, exact)
    S_eff: np.ndarray  # object: max(S, 1)
    theta: np.ndarray  # int64: x_hat = +1 iff y >= theta
    theta_lo: np.ndarray  # int64: mask iff theta_lo <= y <= theta_hi
    theta_hi: np.ndarray
    alpha_q: np.ndarray  # object: alpha = mean|x| in Q.alpha_frac
    C: np.ndarray  # object: B 2^Fb sum_y - beta S_eff; z = K y - C, x = z / (S_eff 2^Fb)
    K: int  # B^2 2^Fb

    @property
    def n(self) -> int:
        """Values per channel: ``B`` (dense) or ``B H W`` (conv)."""
        return int(self.x_hat.size // max(self.x_hat.shape[1], 1))

    @property
    def zero(self) -> np.ndarray:
        """bool [M]: the batch l1 scale is 0 (all ``y`` equal); the channel passes no gradient (:func:`bn_backward`)."""
        return np.asarray(self.S) == 0


def _clamp_thresholds(t, y_bound: int) -> np.ndarray:
    """Saturate thresholds to [-(y_bound+1), y_bound+1] (exact: |y| <= y_bound)."""
    lo, hi = -(y_bound + 1), y_bound + 1
    return np.clip(np.asarray(t, dtype=object), lo, hi).astype(np.int64)


def bn_forward(y: np.ndarray, beta_q: np.ndarray, p: ArithParams, y_bound: int) -> BnForward:
    """Training-mode l1 BN of integer ``y`` ([B, M], or [B, M, H, W] of a conv layer, whose ``B`` below is the
    number of values per channel, ``n = B H W``) with bias ``beta_q`` (Q.beta_frac), threshold form.

    Exact: with ``sum_y``, ``d_b = B y_b - sum_y``, ``S = sum |d_b|`` (so mu = sum_y / B and
    s = S / B^2 exactly), ``x_b = (y_b - mu)/s + beta = z_b / (S 2^Fb)`` where
    ``z_b = K y_b - C``, ``K = B^2 2^Fb``, ``C = B 2^Fb sum_y - beta_q S``. Per element only
    compares against per-channel integer thresholds and adds are needed:

    * ``x_hat = +1 iff y >= theta = ceil(C / K)`` (sign(0) = +1);
    * mask ``|x| <= 1 iff theta_lo <= y <= theta_hi`` with ``theta_lo = ceil((C - S 2^Fb)/K)``,
      ``theta_hi = floor((C + S 2^Fb)/K)``;
    * ``S = B * sum_{y >= t_mu} y - B * sum_{y < t_mu} y - sum_y (n_ge - n_lt)``, ``t_mu = ceil(sum_y/B)``;
    * ``A = sum|z| = K * sum(x_hat y) - C * sum(x_hat)``; ``alpha_q = round(A 2^Fa / (B S 2^Fb))``
      (the one division per channel).

    ``S = 0`` (all ``y`` equal) is replaced by 1, which gives ``x = beta`` exactly; such a channel passes no
    gradient backwards (:attr:`BnForward.zero`, the ``zero`` argument of :func:`bn_backward`).
    """
    shape = np.shape(y)
    y = _rows(np.asarray(y, dtype=np.int64))  # conv: per channel over the batch and the positions
    n = int(y.shape[0])
    fb = p.beta_frac
    sum_y = y.sum(axis=0)
    t_mu = -((-sum_y) // n)
    ge = y >= t_mu
    y_s = np.where(ge, y, -y).sum(axis=0)
    n_s = (2 * ge.astype(np.int64) - 1).sum(axis=0)
    S = n * y_s - sum_y * n_s
    s_eff = _obj(np.maximum(S, 1))
    K = n * n * (1 << fb)
    C = n * (1 << fb) * _obj(sum_y) - _obj(beta_q) * s_eff
    one = s_eff * (1 << fb)
    theta = _clamp_thresholds(-((-C) // K), y_bound)
    theta_lo = _clamp_thresholds(-((-(C - one)) // K), y_bound)
    theta_hi = _clamp_thresholds((C + one) // K, y_bound)
    x_hat = np.where(y >= theta, np.int8(1), np.int8(-1))
    mask = (y >= theta_lo) & (y <= theta_hi)
    y_x = np.where(x_hat > 0, y, -y).sum(axis=0)
    n_x = x_hat.astype(np.int64).sum(axis=0)
    A = K * _obj(y_x) - C * _obj(n_x)
    alpha_q = div_round(A * (1 << p.alpha_frac), n * one)
    x_hat, mask = _unrows(x_hat, shape), _unrows(mask, shape)
    return BnForward(x_hat, mask, sum_y, S, s_eff, theta, theta_lo, theta_hi, alpha_q, C, K)


def bn_forward_eval(
    y: np.ndarray, beta_q: np.ndarray, mu_r: np.ndarray, s_r: np.ndarray, p: ArithParams, y_bound: int
) -> np.ndarray:
    """Inference-mode signs: ``x_hat = +1 iff y >= ceil((mu_r 2^Fb - beta_q s_r') / 2^(Fr+Fb))``.

    ``mu_r``, ``s_r``: running mean and l1 scale in Q.running_frac (units of Y); ``s_r' = max(s_r, 1)``.
    The divisor is a power of two, so the threshold is an arithmetic shift.
    """
    s_eff = _obj(np.maximum(np.asarray(s_r, dtype=np.int64), 1))
    num = _obj(mu_r) * (1 << p.beta_frac) - _obj(beta_q) * s_eff
    sh = 1 << (p.running_frac + p.beta_frac)
    theta = _clamp_thresholds(-((-num) // sh), y_bound)
    y = np.asarray(y, dtype=np.int64)
    return np.where(y >= _chan(theta, y.ndim), np.int8(1), np.int8(-1))


def running_update(mu_r, s_r, fwd: BnForward, p: ArithParams) -> tuple[np.ndarray, np.ndarray]:
    """Running statistics after a training batch: ``r += round((batch - r) 2^-shift)`` in Q.running_frac.

    Batch values: ``mu_b = round(sum_y 2^Fr / B)``, ``s_b = round(S 2^Fr / B^2)`` (round half up).
    """
    n = fwd.n
    fr, sh = p.running_frac, p.running_shift
    mu_b = np.asarray(div_round(_obj(fwd.sum_y) * (1 << fr), n), dtype=np.int64)
    s_b = np.asarray(div_round(_obj(fwd.S) * (1 << fr), n * n), dtype=np.int64)
    half = 1 << (sh - 1)
    mu_r = mu_r + ((mu_b - mu_r + half) >> sh)
    s_r = s_r + ((s_b - s_r + half) >> sh)
    return mu_r, s_r


def _fixed_quotient(num: np.ndarray, den: np.ndarray, frac: int, guard: int, den_shift: int) -> np.ndarray:
    """``round(num 2^frac / (den 2^den_shift))`` via a per-channel reciprocal (docs: "logits").

    ``R = floor(2^P / den)`` with ``P = bitlen(den) + frac + guard``; result
    ``(num R + 2^(sh-1)) >> sh`` with ``sh = P + den_shift - frac``. ``num``: [B, C] ints, ``den``: [C] ints >= 1.
    """
    out = np.empty(num.shape, dtype=np.int64)
    for c in range(num.shape[1]):
        d = int(den[c])
        P = d.bit_length() + frac + guard
        R = (1 << P) // d
        sh = P + den_shift - frac
        half = 1 << (sh - 1)
        out[:, c] = [(int(v) * R + half) >> sh for v in num[:, c]]
    return out


def output_logits(y: np.ndarray, fwd: BnForward, p: ArithParams) -> np.ndarray:
    """Training-mode logits ``x = z / (S' 2^Fb)`` of the output layer in Q.logit_frac (int64 [B, C])."""
    z = fwd.K * _obj(np.asarray(y, dtype=np.int64)) - fwd.C.reshape(1, -1)
    return _fixed_quotient(z, fwd.S_eff, p.logit_frac, p.recip_guard, p.beta_frac)


def output_logits_eval(y, beta_q, mu_r, s_r, p: ArithParams) -> np.ndarray:
    """Inference logits ``((y 2^Fr - mu_r) 2^Fb + beta_q s_r') / (s_r' 2^Fb)`` in Q.logit_frac."""
    s_eff = np.maximum(np.asarray(s_r, dtype=np.int64), 1)
    num = (_obj(np.asarray(y, dtype=np.int64)) * (1 << p.running_frac) - _obj(mu_r).reshape(1, -1)) * (
        1 << p.beta_frac
    ) + (_obj(beta_q) * _obj(s_eff)).reshape(1, -1)
    return _fixed_quotient(num, _obj(s_eff), p.logit_frac, p.recip_guard, p.beta_frac)


LOG2E_Q16 = 94548  # round(log2(e) 2^16)


def exp2_table(frac_in: int, frac_out: int) -> np.ndarray:
    """``T[f] = round(2^(f / 2^frac_in) 2^frac_out)`` for f in 0 .. 2^frac_in - 1 (configuration-time constants)."""
    f = np.arange(1 << frac_in, dtype=np.float64)
    return np.rint(np.exp2(f / (1 << frac_in)) * (1 << frac_out)).astype(np.int64)


def softmax_q(logits_q: np.ndarray, p: ArithParams) -> np.ndarray:
    """Softmax of Q.FL logits in Q.prob_frac, with a base-2 exponential table and one reciprocal per sample.

    ``d = x - max_c x`` (<= 0); ``t = floor(d LOG2E_Q16 / 2^16)`` (Q.FL, so ``e^d = 2^t``);
    ``e = T[t mod 2^FL] >> (-(t >> FL))`` (0 when the shift exceeds 62); ``sum = sum_c e`` (>= 2^Fe);
    ``R = floor(2^(Fp + Fe + 2) / sum)``; ``p = (e R + 2^(Fe + 1)) >> (Fe + 2)``.
    """
    xq = np.asarray(logits_q, dtype=np.int64)
    d = xq - xq.max(axis=1, keepdims=True)
    t = (d * LOG2E_Q16) >> 16
    table = exp2_table(p.logit_frac, p.exp_frac)
    ip = -(t >> p.logit_frac)  # >= 0
    fr = t & ((1 << p.logit_frac) - 1)
    e = np.where(ip > 62, 0, table[fr] >> np.minimum(ip, 62))
    tot = e.sum(axis=1, keepdims=True)
    sh = p.exp_frac + 2
    R = (1 << (p.prob_frac + sh)) // tot
    return (e * R + (1 << (sh - 1))) >> sh


def loss_grad(logits_q: np.ndarray, labels: np.ndarray, p: ArithParams) -> tuple[np.ndarray, float, int]:
    """Loss gradient ``g`` (int64 [B, C]), loss and correct count, for ``p.loss``.

    ``cross_entropy``: ``g = softmax_q(x) - 2^Fp onehot`` in Q.Fp; the gradient of the mean loss is
    ``g 2^-Fp / B``. ``squared_hinge``: ``t = +1`` for the label, -1 otherwise;
    ``m = max(0, 2^FL - t x_q)``; ``g = -t m`` in Q.FL; the gradient is ``2 g 2^-FL / B``.
    The ``1/B`` cancels against the B of the BN backward (see :func:`po2_quantise`), the 2 is a
    scale exponent (:func:`loss_grad_scale`). ``loss`` (reporting only: the host's number) is
    computed in float64 from the integer logits; ``correct`` = argmax (first on ties) == label.
    """
    xq = np.asarray(logits_q, dtype=np.int64)
    b = xq.shape[0]
    labels = np.asarray(labels).astype(np.intp)
    rows = np.arange(b)
    correct = int(np.count_nonzero(xq.argmax(axis=1) == labels)) if b else 0
    if p.loss == "squared_hinge":
        t = np.full(xq.shape, -1, dtype=np.int64)
        t[rows, labels] = 1
        m = np.maximum(0, (1 << p.logit_frac) - t * xq)
        g = -t * m
        loss = float((m.astype(np.float64) ** 2).sum() / (b * 4.0**p.logit_frac)) if b else 0.0
        return g, loss, correct
    g = softmax_q(xq, p)
    g[rows, labels] -= 1 << p.prob_frac
    z = xq / float(1 << p.logit_frac)
    zs = z - z.max(axis=1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=1, keepdims=True))
    loss = float(-logp[rows, labels].mean()) if b else 0.0
    return g, loss, correct


def loss_grad_scale(p: ArithParams) -> int:
    """Scale exponent of ``g``: the gradient of the mean loss is ``g 2^scale / B``."""
    return 1 - p.logit_frac if p.loss == "squared_hinge" else -p.prob_frac


# ---------------------------------------------------------------------------
# Backward


def bn_backward(
    dx: np.ndarray, x_hat: np.ndarray, alpha_q, p: ArithParams, zero=None
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2 lines 10-12 in integers: ``(Q, P1)`` (conv: ``dx`` [B, M, H, W], sums over ``n = B H W``).

    With ``P1 = sum_b dx_b`` (= dbeta, line 12) and ``P2 = sum_b dx_b x_hat_b``::

        Q_b = 2^Fa (B dx_b - P1) - alpha_q P2 x_hat_b        (int64 [B, M])

    except ``Q_b = 0`` for every sample of a channel flagged in ``zero`` (bool ``[M]``, the forward pass's
    :attr:`BnForward.zero`: batch l1 scale ``S = 0``). Such a channel's ``dy = v - mean(v) - ...`` would be
    divided by ``s = 0`` (``S' = 1`` stands in for it); it passes no gradient instead, so it neither sets the
    layer's po2 bias nor feeds ``dX``/``dW`` (docs/arithmetic.md section 5.1). ``P1`` (dbeta) is unchanged.

    so that ``dy_b = Q_b B / (2^Fa S')`` times the scale of ``dx``
    (``v = dx/s``, ``dy = v - mean(v) - alpha mean(v x_hat) x_hat`` with ``s = S'/B^2``).
    The 1/s is applied exactly inside :func:`po2_quantise`, which needs only ``log2|dy|``:
    no per-element multiply or divide.
    """
    shape = np.shape(dx)
    dx = _rows(np.asarray(dx, dtype=np.int64))  # conv: per channel over the batch and the positions
    n = dx.shape[0]
    xh = _rows(np.asarray(x_hat, dtype=np.int64))
    p1 = dx.sum(axis=0)
    p2 = (dx * xh).sum(axis=0)
    aq = np.asarray(alpha_q, dtype=np.int64)
    q = ((n * dx - p1) << p.alpha_frac) - (aq * p2) * xh
    if zero is not None:
        zero = np.asarray(zero, dtype=bool).reshape(-1)
        if zero.shape != (q.shape[1],):
            raise ValueError(f"bn_backward: zero has shape {zero.shape}; expected ({q.shape[1]},): one flag a channel")
        q = np.where(zero, 0, q)
    return _unrows(q, shape), p1


@dataclass
class Po2Codes:
    """po2_k codes of one layer's dY: ``value = (-1)^neg 2^(field - 1) 2^unit_exp``, 0 where ``field == 0``."""

    neg: np.ndarray  # bool sign bit
    field: np.ndarray  # uint8 exponent field 0..2^(k-1)-1 (0 = zero)
    bias: int  # b of the paper: exponent code e = log2|value| + b
    unit_exp: int  # e_min - b: exponent of the smallest nonzero magnitude

    def exponents(self, p: ArithParams) -> np.ndarray:
        """Exponent codes ``e`` (e_min..e_max; meaningless where field == 0)."""
        return self.field.astype(np.int64) - 1 + p.e_min

    def int_values(self) -> np.ndarray:
        """Signed integer values in units of ``2^unit_exp`` (int64; computed once)."""
        cached = self.__dict__.get("_ints")
        if cached is None:
            f = self.field.astype(np.int64)
            mag = np.where(f > 0, np.left_shift(1, np.maximum(f - 1, 0)), 0)
            cached = np.where(self.neg, -mag, mag)
            self.__dict__["_ints"] = cached
        return cached


def po2_quantise(q: np.ndarray, s_eff, scale_exp: int, p: ArithParams, times_batch: bool = True) -> Po2Codes:
    """po2_k of ``dy = Q B / (2^Fa S') 2^scale_exp`` (Algorithm 2 line 13), exactly in the log domain.

    ``e_raw = [log2(|Q| B / S')] + scale_exp - Fa`` per nonzero element (:func:`round_log2_ratio`);
    with ``times_batch = False`` the operand is ``|Q|`` (output layer: the loss gradient's 2/B cancels the B,
    and the caller adds 1 to ``scale_exp`` for the 2);
    bias ``b = e_max - max(e_raw)`` over the layer (rounding is monotone, so this is
    ``[log2 max|dy|]``); ``e = max(e_raw + b, e_min)``; field ``e - e_min + 1``; ``Q = 0`` -> field 0.
    An all-zero layer has ``b = 0`` and all fields 0. A conv layer's ``q`` is ``[B, M, H, W]`` with ``B`` read as
    ``n = B H W``; its operand is ``|Q|`` and ``n`` enters the per-channel thresholds
    (``round_log2_ratio(..., mult=n)``): the same exponents, ``bitlen(n)`` fewer bits per element.
    """
    shape = np.shape(q)
    q = _rows(np.asarray(q, dtype=np.int64))
    n = q.shape[0]
    nz = q != 0
    neg = _unrows(q < 0, shape)
    if not np.any(nz):
        return Po2Codes(neg, np.zeros(shape, dtype=np.uint8), 0, p.e_min)
    if len(shape) == 4:  # conv: operand |Q|, the factor n = B H W folded into the per-channel thresholds
        e_raw = round_log2_ratio(np.abs(q), s_eff, mult=n if times_batch else 1)
    else:
        e_raw = round_log2_ratio(np.abs(q) * n if times_batch else np.abs(q), s_eff)
    e_raw = e_raw + (scale_exp - p.alpha_frac)
    top = int(e_raw[nz].max())
    b = p.e_max - top
    e = np.maximum(e_raw + b, p.e_min)
    field = np.where(nz, e - p.e_min + 1, 0).astype(np.uint8)
    return Po2Codes(neg, _unrows(field, shape), b, p.e_min - b)


def po2_values(codes: Po2Codes) -> np.ndarray:
    """Float64 values of po2 codes (for tests and comparisons only)."""
    return np.ldexp(codes.int_values().astype(np.float64), codes.unit_exp)


def po2_backward_dx(codes: Po2Codes, w: np.ndarray, p: ArithParams) -> tuple[np.ndarray, int]:
    """``dX = dY_po2 W_hat^T`` ([B, N] int64, units ``2^unit_exp``) and its unit exponent.

    Each addend is a po2 magnitude shifted by ``field - 1`` and sign-flipped by the weight;
    grouped by exponent plane this is a popcount-like count per plane and one shift-add per plane.
    """
    d = codes.int_values()
    return exact_matmul(d, np.asarray(w).T, int(w.shape[1]) << p.span), codes.unit_exp


def po2_backward_dw(x: np.ndarray, codes: Po2Codes, p: ArithParams, x_max: int = 1) -> np.ndarray:
    """``dW = X^T dY_po2`` ([N, M] int64, units ``2^unit_exp``); only its sign is kept."""
    d = codes.int_values()
    return exact_matmul(np.asarray(x).T, d, (int(x.shape[0]) * int(x_max)) << p.span)


def dw_window_ternary(codes: Po2Codes, window: int) -> np.ndarray:
    """The ternary gradient ``t [B, M]`` in {-1, 0, +1} of ``hw.dw_window = window`` (docs/arithmetic.md 5.4):
    in each column (output channel) the codes whose exponent field lies within ``window`` planes of the
    column's largest over the batch count as their sign, the smaller ones and the zero code as 0."""
    if window < 1:
        raise ValueError(f"dw_window = {window}: the windowed gradient needs at least one plane")
    f = codes.field.astype(np.int64)
    top = f.max(axis=(0, 2, 3) if f.ndim == 4 else 0, keepdims=True)  # conv: over the batch and the positions
    keep = (f > 0) & (f > top - window)
    return np.where(keep, np.where(codes.neg, -1, 1), 0).astype(np.int64)


def po2_backward_dw_window(x: np.ndarray, codes: Po2Codes, window: int, x_max: int = 1) -> np.ndarray:
    """``X^T t`` with ``t`` of :func:`dw_window_ternary` ([N, M] int64): a signed popcount per weight (one
    masked XNOR-popcount pass for binary ``x``); only its sign is kept, as of :func:`po2_backward_dw`."""
    t = dw_window_ternary(codes, window)
    return exact_matmul(np.asarray(x).T, t, int(x.shape[0]) * int(x_max))


# ---------------------------------------------------------------------------
# Convolution (stride 1, valid or same zero padding) and max pooling


def _conv_pad(k: int, padding: str) -> int:
    if padding == "valid":
        return 0
    if padding == "same" and k % 2:
        return (k - 1) // 2
    raise ValueError(f"conv padding = {padding!r} with kernel {k}: allowed 'valid', or 'same' with an odd kernel")


def conv_windows(x: np.ndarray, k: int, padding: str) -> np.ndarray:
    """The sliding ``k x k`` windows of ``x`` ([B, C, H, W] integers) as the matrix ``[B Ho Wo, C k k]``: rows
    ordered (b, h, w), columns (c, i, j) like ``w.reshape(Co, -1)``; ``same`` padding adds ``(k-1)/2`` zeros on
    each side, and a zero is a skipped term of the sum (never -1 or +1)."""
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"conv input has shape {x.shape}; expected [B, C, H, W]")
    pad = _conv_pad(k, padding)
    xt = x.transpose(0, 2, 3, 1)
    xt = np.pad(xt, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else xt
    win = np.lib.stride_tricks.sliding_window_view(xt, (k, k), axis=(1, 2))  # [B, Ho, Wo, C, k, k]
    b, ho, wo, c = win.shape[:4]
    return win.reshape(b * ho * wo, c * k * k)


def _conv_out_hw(x_shape: tuple, k: int, padding: str) -> tuple[int, int]:
    pad = _conv_pad(k, padding)
    return x_shape[2] + 2 * pad - k + 1, x_shape[3] + 2 * pad - k + 1


def _check_conv_weights(w: np.ndarray, c_in: int) -> None:
    if w.ndim != 4 or w.shape[1] != c_in or w.shape[2] != w.shape[3]:
        raise ValueError(f"conv weights have shape {w.shape}; expected [Co, {c_in}, k, k]")


def conv_xnor_popcount(x: np.ndarray, w: np.ndarray, padding: str = "valid", x_max: int = 1) -> np.ndarray:
    """``Y[b, o, h, v] = sum_{c, i, j} x_pad[b, c, h + i, v + j] w[o, c, i, j]`` ([B, Co, Ho, Wo] int64).

    ``x`` [B, Ci, H, W] (+-1, or 8-bit with ``|x| <= x_max`` for the first layer), ``w`` [Co, Ci, k, k] +-1;
    stride 1; ``x_pad`` is ``x`` with ``(k-1)/2`` zeros around it for ``same`` padding. For +-1 input each
    output is ``2 popcount(XNOR) - N_valid`` over the window's ``N_valid`` unpadded positions:
    ``|Y| <= N x_max`` with ``N = Ci k k``.
    """
    x = np.asarray(x)
    w = np.asarray(w)
    _check_conv_weights(w, x.shape[1])
    co, ci, k, _ = w.shape
    ho, wo = _conv_out_hw(x.shape, k, padding)
    y = exact_matmul(conv_windows(x, k, padding), w.reshape(co, -1).T, ci * k * k * int(x_max))
    return np.ascontiguousarray(y.reshape(x.shape[0], ho, wo, co).transpose(0, 3, 1, 2))


def po2_backward_dx_conv(codes: Po2Codes, w: np.ndarray, padding: str, p: ArithParams) -> tuple[np.ndarray, int]:
    """``dX`` of a conv layer, the transposed convolution ([B, Ci, H, W] int64, units ``2^unit_exp``)::

        dX[b, c, h, v] = sum_{o, i, j} d[b, o, h + pad - i, v + pad - j] w[o, c, i, j]

    over the output positions that exist (``d`` the po2 values, ``pad`` 0 or ``(k-1)/2``): the codes padded by
    ``k - 1 - pad`` zeros correlated with the kernel flipped in both spatial axes. At most ``Co min(k, Ho)
    min(k, Wo)`` addends of ``2^(f-1)`` each.
    """
    d = codes.int_values()
    w = np.asarray(w)
    _check_conv_weights(w, w.shape[1])
    co, ci, k, _ = w.shape
    if d.ndim != 4 or d.shape[1] != co:
        raise ValueError(f"conv dY codes have shape {d.shape}; expected [B, {co}, Ho, Wo]")
    e = k - 1 - _conv_pad(k, padding)
    dpad = np.pad(d, ((0, 0), (0, 0), (e, e), (e, e)))
    flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)  # [Ci, Co, k, k]
    return conv_xnor_popcount(dpad, flipped, "valid", 1 << p.span), codes.unit_exp


def po2_backward_dw_conv(x: np.ndarray, codes: Po2Codes, k: int, padding: str, p: ArithParams, x_max: int = 1,
                         t: np.ndarray | None = None) -> np.ndarray:
    """``dW[o, c, i, j] = sum_{b, h, v} x_pad[b, c, h + i, v + j] d[b, o, h, v]`` ([Co, Ci, k, k] int64, units
    ``2^unit_exp``): the correlation of the layer input with the po2 values over the batch and the positions
    (``n = B Ho Wo`` addends, padding terms 0). With ``t`` (the ternary codes of ``hw.dw_window``) the same sum of
    ``t`` instead of the po2 values. Only its sign is kept."""
    x = np.asarray(x)
    d = codes.int_values() if t is None else np.asarray(t)
    co = d.shape[1]
    cols = conv_windows(x, k, padding)  # [n, Ci k k]
    bound = cols.shape[0] * int(x_max) * (1 if t is not None else 1 << p.span)
    dw = exact_matmul(cols.T, _rows(d), bound)  # [Ci k k, Co]
    return np.ascontiguousarray(dw.T.reshape(co, x.shape[1], k, k))


def po2_backward_dw_window_conv(x: np.ndarray, codes: Po2Codes, window: int, k: int, padding: str,
                                p: ArithParams, x_max: int = 1) -> np.ndarray:
    """:func:`po2_backward_dw_conv` of the windowed ternary codes (:func:`dw_window_ternary`: each channel's
    largest exponent field over the batch and the positions sets its window)."""
    return po2_backward_dw_conv(x, codes, k, padding, p, x_max, t=dw_window_ternary(codes, window))


def maxpool_argmax(y: np.ndarray, pool: int) -> np.ndarray:
    """Per non-overlapping ``pool x pool`` window of ``y`` ([B, C, H, W]; stride ``pool``, trailing rows and
    columns dropped): the index ``i pool + j`` (row-major within the window) of its **first** largest value, uint8
    [B, C, H // pool, W // pool]. Ties (frequent: ``Y`` is an integer popcount) go to the lowest index."""
    y = np.asarray(y)
    b, c, h, w = y.shape
    ho, wo = h // pool, w // pool
    blocks = y[:, :, : ho * pool, : wo * pool].reshape(b, c, ho, pool, wo, pool).transpose(0, 1, 2, 4, 3, 5)
    return blocks.reshape(b, c, ho, wo, pool * pool).argmax(axis=-1).astype(np.uint8)


def maxpool_select(a: np.ndarray, idx: np.ndarray, pool: int) -> np.ndarray:
    """The values of ``a`` ([B, C, H, W]) at each window's index ``idx`` (:func:`maxpool_argmax`)."""
    a = np.asarray(a)
    b, c, ho, wo = idx.shape
    blocks = a[:, :, : ho * pool, : wo * pool].reshape(b, c, ho, pool, wo, pool).transpose(0, 1, 2, 4, 3, 5)
    blocks = blocks.reshape(b, c, ho, wo, pool * pool)
    return np.take_along_axis(blocks, idx.astype(np.intp)[..., None], axis=-1)[..., 0]


def maxpool_route(d: np.ndarray, idx: np.ndarray, shape: tuple, pool: int) -> np.ndarray:
    """Max-pool backward: ``d`` ([B, C, Ho, Wo]) placed at each window's index ``idx``, 0 at every other
    position of ``shape`` ([B, C, H, W], including rows and columns the pooling dropped)."""
    d = np.asarray(d)
    b, c, ho, wo = idx.shape
    blocks = np.zeros((b, c, ho, wo, pool * pool), dtype=d.dtype)
    np.put_along_axis(blocks, idx.astype(np.intp)[..., None], d[..., None], axis=-1)
    out = np.zeros(shape, dtype=d.dtype)
    out[:, :, : ho * pool, : wo * pool] = (
        blocks.reshape(b, c, ho, wo, pool, pool).transpose(0, 1, 2, 4, 3, 5).reshape(b, c, ho * pool, wo * pool))
    return out


def route_codes(codes: Po2Codes, idx: np.ndarray, shape: tuple, pool: int) -> Po2Codes:
    """Max-pool backward of po2 codes (maxpool ``before_bn``): the pooled codes ([B, C, Ho, Wo]) at each window's
    index ``idx`` (:func:`maxpool_route`), zero (field 0) at every other position of ``shape``; same bias."""
    return Po2Codes(maxpool_route(codes.neg, idx, shape, pool), maxpool_route(codes.field, idx, shape, pool),
                    codes.bias, codes.unit_exp)
