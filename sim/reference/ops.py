"""NumPy building blocks of the float reference trainer.

Everything here works on float32 arrays (float64 inputs stay float64, which
the gradient checks in the tests use; every other input is converted to
float32). Activations are channels-first: dense tensors are ``[B, C]``, conv
tensors ``[B, C, H, W]``; batch-norm statistics are taken per channel over the
batch and all spatial positions, so the paper's batch size ``B`` becomes
``B * H * W`` for a conv layer.

Contents

* :func:`sign`, :func:`ste_mask` -- binarisation with sign(0) = +1 and the
  straight-through cancellation mask ``|x| <= 1``.
* Batch norm without a trainable scale (the paper drops gamma), three kinds:

  - ``"l2"``: standard BN, Algorithm 1 lines 6 and 10-12 (exact gradient);
  - ``"l1"``: l1 BN, ``x = (y - mu) / (mean|y - mu| + eps) + beta``, with the
    *exact* gradient of that forward pass (see :func:`bn_backward`);
  - ``"l1_bnn"``: the same forward pass with the BNN-specific backward pass of
    Algorithm 2 lines 9-12, which only keeps the signs of ``x``, the mean
    magnitude ``alpha`` and the l1 scale ``s`` between the passes.

* Activation-gradient quantisers (:func:`quantise_dy`): float16, bfloat16,
  layer-wise block floating point ("int"), power of two (``po2_k``).
* Losses: softmax cross entropy, squared hinge.
* Convolution (stride 1, "valid" or "same" zero padding) via im2col, with
  helpers that view a conv layer as a dense layer on ``cols``
  (:func:`conv_dy_matrix`, :func:`conv_weight_matrix`,
  :func:`conv_weight_from_matrix`); max pooling (floor for odd sizes).
* E2-Train's predictive sign gradient (:func:`predictive_sign_grad`) and its
  MSB predictor (:func:`msb_quantise`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .storage import round_bfloat16

__all__ = [
    "sign",
    "ste_mask",
    "BN_KINDS",
    "bn_forward",
    "bn_forward_eval",
    "bn_backward",
    "DY_KINDS",
    "quantise_dy",
    "po2_quantise",
    "po2_encode",
    "po2_decode",
    "bfp_quantise",
    "bfp_encode",
    "bfp_decode",
    "msb_quantise",
    "softmax_cross_entropy",
    "squared_hinge",
    "conv2d_forward",
    "conv2d_backward",
    "conv2d_backward_weight",
    "conv2d_backward_input",
    "conv_dy_matrix",
    "conv_weight_matrix",
    "conv_weight_from_matrix",
    "maxpool_forward",
    "maxpool_backward",
    "pooled_bn_beta",
    "predictive_sign_grad",
]

BN_KINDS = ("l2", "l1", "l1_bnn")
DY_KINDS = ("float32", "float16", "bfloat16", "int", "po2")

_SQRT_HALF = np.float64(math.sqrt(0.5))
# The smallest float32 >= sqrt(1/2): for float32 f, f >= sqrt(1/2) exactly iff f >= this.
_SQRT_HALF_UP32 = np.float32(_SQRT_HALF)
if _SQRT_HALF_UP32 < _SQRT_HALF:
    _SQRT_HALF_UP32 = np.nextafter(_SQRT_HALF_UP32, np.float32(1))


# ---------------------------------------------------------------------------
# Helpers


def _float(x) -> np.ndarray:
    """``x`` as a float array: float64 stays float64, anything else becomes float32."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        return x
    return x.astype(np.float32, copy=False)


def _check_kind(kind: str, allowed: tuple, what: str) -> None:
    if kind not in allowed:
        raise ValueError(f"{what} = {kind!r} is not allowed; allowed: {', '.join(allowed)}")


def _check_bits(bits, lo: int, what: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not lo <= int(bits) <= 16:
        raise ValueError(f"{what} = {bits!r} is out of range; allowed: integer {lo}..16")
    return int(bits)


def _max_abs(v: np.ndarray, what: str) -> float:
    """Largest magnitude of ``v`` (0.0 for an empty array); raises on inf / NaN."""
    if v.size == 0:
        return 0.0
    m = float(np.max(np.abs(v)))
    if not math.isfinite(m):
        raise ValueError(f"{what}: the tensor holds non-finite values (max |v| = {m}); training has diverged")
    return m


def _round_log2(a: np.ndarray) -> np.ndarray:
    """``[log2 a]`` (round to nearest) for positive ``a``, exactly, as int64.

    With ``a = f * 2**e`` and ``f`` in [0.5, 1), ``log2 a`` rounds to ``e`` when
    ``f >= sqrt(1/2)`` and to ``e - 1`` otherwise. sqrt(1/2) is irrational, so
    no float32 or float64 value sits on a tie. Zeros give meaningless values.
    """
    f, e = np.frexp(a)
    return e.astype(np.int64) - (f.astype(np.float64) < _SQRT_HALF)


def _bn_axes(y: np.ndarray) -> tuple[tuple, tuple]:
    """Reduction axes and the broadcast shape of a per-channel vector."""
    if y.ndim == 2:
        return (0,), (1, -1)
    if y.ndim == 4:
        return (0, 2, 3), (1, -1, 1, 1)
    raise ValueError(f"batch norm input has shape {y.shape}; expected [B, C] or [B, C, H, W]")


# ---------------------------------------------------------------------------
# Binarisation


def sign(x) -> np.ndarray:
    """+1 where ``x >= 0``, else -1, as float32 (float64 for float64 input). sign(0) = +1."""
    x = np.asarray(x)
    dt = np.float64 if x.dtype == np.float64 else np.float32
    return np.where(x >= 0, dt(1), dt(-1))


def ste_mask(x) -> np.ndarray:
    """Straight-through estimator mask: True where ``|x| <= 1`` (the gradient passes), else False."""
    return np.abs(np.asarray(x)) <= 1


# ---------------------------------------------------------------------------
# Batch normalisation


def bn_forward(y, beta, kind: str, eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """Training-mode batch norm of ``y`` ([B, C] or [B, C, H, W]) with bias ``beta`` ([C]).

    ``l2``: ``x = (y - mu) / sqrt(var + eps) + beta``;
    ``l1`` and ``l1_bnn``: ``x = (y - mu) / (s + eps) + beta`` with ``s = mean|y - mu|``
    (Algorithm 2 line 6; eps is ours, the paper has none).
    Statistics are per channel over the batch (and spatial positions); ``var``
    is the biased batch variance.

    Returns ``(x, cache)``. ``cache["mu"]`` and ``cache["scale"]`` are the batch
    mean and scale ([C]; ``var`` for l2, ``s`` for l1 kinds), for the running
    statistics that :func:`bn_forward_eval` uses. The rest of the cache is what
    the backward pass of ``kind`` needs and nothing more:

    * ``l2`` / ``l1``: ``xn`` (the normalised ``x - beta``, full precision) and ``inv``
      ([C], ``1/sqrt(var + eps)`` resp. ``1/(s + eps)``);
    * ``l1_bnn``: ``x_hat`` (int8 +-1, the signs of ``x`` with sign(0) = +1),
      ``alpha`` ([C], ``mean|x|``, Algorithm 2 line 7), ``s`` ([C]) and ``eps``.
      No full-precision activation is kept.

    A channel whose values are all equal has ``s = var = 0``; with ``eps = 0`` its
    divisor is taken as 1 (so ``x = beta`` there) instead of dividing by zero.

    Constant channels of the l1 kinds (docs/arithmetic.md section 5.1, the same rule as the
    bit-exact model's ``S = 0``): a channel is constant when all its batch values of ``y`` are
    equal (``max == min``; ``y`` arrives rounded to the storage format, so values closer than
    its resolution count as equal). Such a channel gets ``x = beta`` exactly (``d = 0``, not
    the float rounding of ``y - mean(y)`` divided by eps), ``s = 0``, and ``cache["const"]``
    flags it ([C] bool) so that :func:`bn_backward` passes no gradient through it. ``l2`` keeps
    standard BN (eps under the square root bounds its gradient).
    """
    _check_kind(kind, BN_KINDS, "batch norm kind")
    y = _float(y)
    axes, bshape = _bn_axes(y)
    beta = _float(beta).astype(y.dtype, copy=False)
    if beta.shape != (y.shape[1],):
        raise ValueError(f"beta has shape {beta.shape}; expected ({y.shape[1]},) for input {y.shape}")
    mu = y.mean(axis=axes)
    d = y - mu.reshape(bshape)
    const = None
    if kind != "l2":
        const = y.max(axis=axes) == y.min(axis=axes) if y.size else np.zeros(y.shape[1], dtype=bool)
        if const.any():
            mu = np.where(const, y.max(axis=axes), mu).astype(y.dtype, copy=False)
            d = np.where(const.reshape(bshape), y.dtype.type(0), d)
    if kind == "l2":
        scale = np.mean(d * d, axis=axes)
        denom = np.sqrt(scale + eps)
    else:
        scale = np.mean(np.abs(d), axis=axes)
        denom = scale + eps
    denom = np.where(denom > 0, denom, 1).astype(y.dtype, copy=False)
    inv = (1 / denom).astype(y.dtype, copy=False)
    xn = d * inv.reshape(bshape)
    x = xn + beta.reshape(bshape)
    if kind == "l2":
        cache = {"xn": xn, "inv": inv, "mu": mu, "scale": scale}
    elif kind == "l1":
        cache = {"xn": xn, "inv": inv, "mu": mu, "scale": scale, "const": const}
    else:
        cache = {
            "x_hat": np.where(x >= 0, np.int8(1), np.int8(-1)),
            "alpha": np.mean(np.abs(x), axis=axes),
            "s": scale,
            "eps": float(eps),
            "mu": mu,
            "scale": scale.copy(),  # its own array: the caller may round or update it
            "const": const,
        }
    return x, cache


def bn_forward_eval(y, beta, kind: str, running_mu, running_scale, eps: float = 1e-5) -> np.ndarray:
    """Inference-mode batch norm with running statistics (``running_scale`` = var for l2, s for l1 kinds)."""
    _check_kind(kind, BN_KINDS, "batch norm kind")
    y = _float(y)
    _, bshape = _bn_axes(y)
    dt = y.dtype
    mu = _float(running_mu).astype(dt, copy=False).reshape(bshape)
    sc = _float(running_scale).astype(dt, copy=False)
    denom = np.sqrt(sc + eps) if kind == "l2" else sc + eps
    denom = np.where(denom > 0, denom, 1).astype(dt, copy=False).reshape(bshape)
    return (y - mu) / denom + _float(beta).astype(dt, copy=False).reshape(bshape)


def bn_backward(dx, cache: dict, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Gradients ``(dy, dbeta)`` of batch norm from ``dx`` = dLoss/dx and the forward cache.

    With ``mean`` over the batch (and spatial positions) of one channel and
    ``dbeta = sum(dx)`` in every case:

    * ``l2`` (exact; Algorithm 1 lines 10-12 with ``xn = x - beta``):
      ``v = dx / sqrt(var + eps)``, ``dy = v - mean(v) - mean(v * xn) * xn``.
    * ``l1`` (exact gradient of the l1 forward pass). ``s = mean|d|``,
      ``d = y - mu``, depends on ``y`` through ``ds/dy_j = (sgn d_j - mean(sgn d)) / n``,
      which gives
      ``v = dx / (s + eps)``, ``dy = v - mean(v) - mean(v * xn) * (sgn(d) - mean(sgn(d)))``
      with ``sgn(0) = 0`` (the subgradient of ``|.|`` at 0).
    * ``l1_bnn`` (Algorithm 2 lines 10-12): ``v = dx / (s + eps)``,
      ``dy = v - mean(v) - mean(v * x_hat * alpha) * x_hat``.

    For the l1 kinds ``dy = 0`` in every channel that :func:`bn_forward` flagged constant
    (``cache["const"]``): its ``1/(s + eps)`` would be ``1/eps``, so one constant channel
    would dominate (and in float16 overflow) the layer's gradient. ``dbeta`` is kept.
    """
    _check_kind(kind, BN_KINDS, "batch norm kind")
    dx = _float(dx)
    axes, bshape = _bn_axes(dx)
    dbeta = dx.sum(axis=axes)
    if kind in ("l2", "l1"):
        xn = cache["xn"]
        v = dx * cache["inv"].astype(dx.dtype, copy=False).reshape(bshape)
        coef = np.mean(v * xn, axis=axes, keepdims=True)
        if kind == "l2":
            direction = xn
        else:
            sg = np.sign(xn)
            direction = sg - sg.mean(axis=axes, keepdims=True)
        dy = v - v.mean(axis=axes, keepdims=True) - coef * direction
    else:
        denom = cache["s"].astype(dx.dtype) + cache["eps"]
        denom = np.where(denom > 0, denom, 1).astype(dx.dtype, copy=False)
        v = dx / denom.reshape(bshape)
        xh = cache["x_hat"].astype(dx.dtype)
        alpha = cache["alpha"].astype(dx.dtype, copy=False).reshape(bshape)
        coef = np.mean(v * xh, axis=axes, keepdims=True) * alpha
        dy = v - v.mean(axis=axes, keepdims=True) - coef * xh
    const = cache.get("const")
    if kind != "l2" and const is not None and np.any(const):
        dy = np.where(np.asarray(const, dtype=bool).reshape(bshape), dx.dtype.type(0), dy)
    return dy.astype(dx.dtype, copy=False), dbeta


# ---------------------------------------------------------------------------
# Activation-gradient quantisation


def po2_encode(v, k: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Codes of ``po2_k(v)`` for one layer-wise tensor ``v``.

    ``po2_k(v) = sgn(v) * 2**(exp(v) - b)`` with
    ``exp(v) = max(-2**(k-2), [log2|v| + b])`` and ``b = 2**(k-2) - 1 - [log2 max|v|]``
    ([.] = round to nearest; ties cannot happen, see :func:`_round_log2`).
    The exponent field has k-1 bits: -2**(k-2) .. 2**(k-2) - 1; the largest
    magnitude always gets the top code 2**(k-2) - 1. Nonzero values too small
    for the range are clamped to the smallest power, 2**(-2**(k-2) - b), not
    flushed to zero.

    The format has no code for zero, while ``sgn(0) = 0`` makes the paper's
    po2(0) = 0; a zero therefore needs its own flag, returned as ``is_zero``.

    Returns ``(sign, exp, bias, is_zero)``: int8 +-1 (zeros get +1), int16 exponent
    codes (zeros get the smallest code), the Python int ``b``, and a bool mask.
    An all-zero (or empty) tensor gives ``bias = 0`` and all ``is_zero``.
    """
    k = _check_bits(k, 2, "po2 bits k")
    v = np.asarray(v, dtype=np.float32)
    half = 1 << (k - 2)
    is_zero = v == 0
    sgn = np.where(v < 0, np.int8(-1), np.int8(1))
    m = _max_abs(v, "po2_quantise")
    if m == 0:
        return sgn, np.full(v.shape, -half, dtype=np.int16), 0, is_zero
    bias = half - 1 - int(_round_log2(np.asarray(m, dtype=np.float64)))
    with np.errstate(divide="ignore"):
        e = _round_log2(np.abs(v)) + bias
    exp = np.where(is_zero, -half, np.maximum(-half, e)).astype(np.int16)
    return sgn, exp, bias, is_zero


def po2_decode(sign_code, exp, bias: int, is_zero) -> np.ndarray:
    """Values (float32) of po2 codes: ``sign * 2**(exp - bias)``, 0 where ``is_zero``."""
    mag = np.ldexp(np.float32(1), np.asarray(exp, dtype=np.int64) - int(bias))
    out = np.asarray(sign_code, dtype=np.float32) * mag.astype(np.float32, copy=False)
    return np.where(np.asarray(is_zero), np.float32(0), out)


def po2_quantise(v, k: int) -> np.ndarray:
    """``po2_k(v)`` of Wang et al. Section 5.2 (see :func:`po2_encode`); float32 result, shape of ``v``.

    Same values as ``po2_decode(*po2_encode(v, k))``, computed without the codes.
    For k = 8 the smallest power can fall below float32's range (2**-149) when
    ``max|v|`` is tiny; such values underflow to 0 as a float32 store would.
    """
    k = _check_bits(k, 2, "po2 bits k")
    v = np.asarray(v, dtype=np.float32)
    m = _max_abs(v, "po2_quantise")
    if m == 0:
        return np.zeros(v.shape, dtype=np.float32)
    half = 1 << (k - 2)
    bias = half - 1 - int(_round_log2(np.asarray(m, dtype=np.float64)))
    f, e = np.frexp(np.abs(v))
    # f >= sqrt(1/2) exactly <=> f >= the first float32 above sqrt(1/2) (sqrt(1/2) is not a float32).
    e += f >= _SQRT_HALF_UP32
    e -= 1  # e = [log2|v|]
    np.maximum(e, -half - bias, out=e)  # value exponent exp(v) - b, clamped at -2**(k-2) - b
    return np.ldexp(np.sign(v), e)


def bfp_encode(v, k: int) -> tuple[np.ndarray, int]:
    """k-bit layer-wise block floating point: ``v ~ mant * 2**exp`` with one shared ``exp``.

    ``mant`` are k-bit two's-complement integers (-2**(k-1) .. 2**(k-1) - 1, so at
    most 2**k levels), rounded to nearest (ties to even) and saturated. The
    shared exponent is the smallest one at which the largest magnitude ``M`` is
    representable to within half a step, i.e. the smallest ``exp`` with
    ``M <= (2**(k-1) - 1/2) * 2**exp``; no element then loses more than half a
    step (only a tie at the top saturates, by exactly half a step).
    An all-zero tensor gives ``exp = 0`` and zero mantissas.
    """
    k = _check_bits(k, 2, "int bits k")
    v = _float(v)
    m = _max_abs(v, "int (block floating point) quantisation")
    qmax = (1 << (k - 1)) - 1
    if m == 0:
        return np.zeros(v.shape, dtype=np.int16), 0
    top = qmax + 0.5
    exp = math.ceil(math.log2(m / top))
    while m > math.ldexp(top, exp):  # guard the float log against off-by-one
        exp += 1
    while m <= math.ldexp(top, exp - 1):
        exp -= 1
    mant = np.rint(np.ldexp(v.astype(np.float64), -exp))
    return np.clip(mant, -qmax - 1, qmax).astype(np.int16), exp


def bfp_decode(mant, exp: int) -> np.ndarray:
    """Values (float32) of block floating-point codes."""
    return np.ldexp(np.asarray(mant, dtype=np.float64), int(exp)).astype(np.float32)


def bfp_quantise(v, k: int) -> np.ndarray:
    """k-bit layer-wise block floating point ("int-k" of the paper's Table 4), float32 values."""
    return bfp_decode(*bfp_encode(v, k))


def quantise_dy(dy, kind: str, bits: int = 5) -> np.ndarray:
    """Quantise a layer's matrix-product gradient dY (Algorithm 2 line 13) to format ``kind``.

    ``float32`` is the identity, ``float16`` IEEE half (round to nearest even;
    overflow gives inf, as a real float16 store would), ``bfloat16`` round to
    nearest even, ``int`` k-bit block floating point (:func:`bfp_quantise`),
    ``po2`` po2_k (:func:`po2_quantise`); ``bits`` is k for the last two and
    ignored otherwise. The whole array is one layer-wise block.
    """
    _check_kind(kind, DY_KINDS, "dy format")
    dy = np.asarray(dy, dtype=np.float32)
    if kind == "float32":
        return dy
    if kind == "float16":
        with np.errstate(over="ignore"):
            return dy.astype(np.float16).astype(np.float32)
    if kind == "bfloat16":
        return round_bfloat16(dy)
    if kind == "int":
        return bfp_quantise(dy, bits)
    return po2_quantise(dy, bits)


# ---------------------------------------------------------------------------
# Losses


def _check_labels(logits: np.ndarray, labels) -> np.ndarray:
    labels = np.asarray(labels)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"logits {logits.shape} and labels {labels.shape}: expected [B, classes] and [B]")
    return labels.astype(np.intp, copy=False)


def softmax_cross_entropy(logits, labels) -> tuple[float, np.ndarray, int]:
    """Mean softmax cross entropy over the batch.

    Returns ``(mean_loss, dlogits, correct)``: ``dlogits`` is the gradient of the
    *mean* loss, ``(softmax - onehot) / B``; ``correct`` is the number of rows
    whose argmax (first one on ties) equals the label.
    """
    z = _float(logits)
    labels = _check_labels(z, labels)
    b = z.shape[0]
    rows = np.arange(b)
    zs = z - z.max(axis=1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=1, keepdims=True))
    loss = float(-logp[rows, labels].mean()) if b else 0.0
    grad = np.exp(logp)
    grad[rows, labels] -= 1
    grad /= max(b, 1)
    correct = int(np.count_nonzero(z.argmax(axis=1) == labels)) if b else 0
    return loss, grad, correct


def squared_hinge(logits, labels) -> tuple[float, np.ndarray, int]:
    """BinaryNet's squared hinge loss with one-hot targets in {-1, +1}.

    ``loss = mean_b sum_c max(0, 1 - t_bc * z_bc)**2``. Returns
    ``(mean_loss, dlogits, correct)`` as :func:`softmax_cross_entropy`.
    """
    z = _float(logits)
    labels = _check_labels(z, labels)
    b = z.shape[0]
    t = np.full(z.shape, -1, dtype=z.dtype)
    t[np.arange(b), labels] = 1
    m = np.maximum(0, 1 - t * z)
    loss = float((m * m).sum() / b) if b else 0.0
    grad = (-2 / max(b, 1)) * t * m
    correct = int(np.count_nonzero(z.argmax(axis=1) == labels)) if b else 0
    return loss, grad.astype(z.dtype, copy=False), correct


# ---------------------------------------------------------------------------
# Convolution (stride 1) and max pooling


def _conv_pad(k: int, padding: str) -> int:
    if padding == "valid":
        return 0
    if padding == "same":
        if k % 2 == 0:
            raise ValueError(f"conv kernel = {k}: 'same' padding needs an odd kernel")
        return (k - 1) // 2
    raise ValueError(f"conv padding = {padding!r} is not allowed; allowed: valid, same")


def _check_conv(x_shape: tuple, w_shape: tuple) -> None:
    if len(x_shape) != 4 or len(w_shape) != 4 or x_shape[1] != w_shape[1] or w_shape[2] != w_shape[3]:
        raise ValueError(f"conv input {tuple(x_shape)} and weights {tuple(w_shape)}: expected [B,Ci,H,W], [Co,Ci,k,k]")


def conv_dy_matrix(dy) -> np.ndarray:
    """``dy`` [B, Co, Ho, Wo] as the [B*Ho*Wo, Co] matrix whose rows match the rows of ``cols``."""
    dy = _float(dy)
    return dy.transpose(0, 2, 3, 1).reshape(-1, dy.shape[1])


def conv_weight_matrix(w) -> np.ndarray:
    """Conv weights [Co, Ci, k, k] as the [Ci*k*k, Co] matrix ``w.reshape(Co, -1).T``: ``y_matrix = cols @ it``."""
    w = _float(w)
    return w.reshape(w.shape[0], -1).T


def conv_weight_from_matrix(m, w_shape) -> np.ndarray:
    """Inverse of :func:`conv_weight_matrix`: a [Ci*k*k, Co] matrix (e.g. a weight gradient) as [Co, Ci, k, k]."""
    return np.ascontiguousarray(np.asarray(m).T.reshape(w_shape))


def conv2d_forward(x, w, padding: str = "valid") -> tuple[np.ndarray, np.ndarray]:
    """Stride-1 convolution (cross-correlation, as in every deep-learning framework).

    ``x`` [B, Ci, H, W], ``w`` [Co, Ci, k, k]; ``padding`` "valid" (no padding) or
    "same" (odd k, (k-1)/2 zeros on each side). Zero padding means a 0 input,
    which a binary network cannot produce itself: border outputs sum fewer +-1
    terms (hardware must treat padded positions as "skip", not as -1 or +1).

    Returns ``(y, cols)`` with ``y`` [B, Co, Ho, Wo] and ``cols`` the im2col
    matrix [B*Ho*Wo, Ci*k*k]: rows ordered (b, h, w), columns (c, i, j) like
    ``w.reshape(Co, -1)``. As a matrix ``y`` is ``cols @ w.reshape(Co, -1).T``
    (= ``conv_weight_matrix(w)``), so the layer is a dense layer with input
    ``cols``; see :func:`conv_dy_matrix` and :func:`conv_weight_from_matrix`.
    """
    x = _float(x)
    w = _float(w).astype(x.dtype, copy=False)
    _check_conv(x.shape, w.shape)
    co, _, k, _ = w.shape
    p = _conv_pad(k, padding)
    xt = x.transpose(0, 2, 3, 1)  # channels-last
    xt = np.pad(xt, ((0, 0), (p, p), (p, p), (0, 0))) if p else np.ascontiguousarray(xt)
    # Windows of the channels-last copy are already in (b, h, w | c, i, j) order; the
    # reshape copies them (about twice as fast as windowing the channels-first array).
    win = sliding_window_view(xt, (k, k), axis=(1, 2))  # [B, Ho, Wo, Ci, k, k]
    b, ho, wo, ci = win.shape[:4]
    cols = win.reshape(b * ho * wo, ci * k * k)
    ymat = cols @ conv_weight_matrix(w)
    y = np.ascontiguousarray(ymat.reshape(b, ho, wo, co).transpose(0, 3, 1, 2))
    return y, cols


def conv2d_backward_weight(dy, cols, w_shape) -> np.ndarray:
    """dLoss/dw [Co, Ci, k, k] from ``dy`` [B, Co, Ho, Wo] and the forward ``cols``."""
    dmat = conv_dy_matrix(dy)
    return conv_weight_from_matrix(cols.astype(dmat.dtype, copy=False).T @ dmat, w_shape)


def conv2d_backward_input(dy, w, x_shape, padding: str = "valid") -> np.ndarray:
    """dLoss/dx [B, Ci, H, W] from ``dy`` [B, Co, Ho, Wo] and the weights."""
    dy = _float(dy)
    w = _float(w).astype(dy.dtype, copy=False)
    _check_conv(tuple(x_shape), w.shape)
    b, ci, h, wd = x_shape
    co, _, k, _ = w.shape
    p = _conv_pad(k, padding)
    ho, wo = dy.shape[2], dy.shape[3]
    dmat = np.ascontiguousarray(conv_dy_matrix(dy))  # [B*Ho*Wo, Co]
    dxp = np.zeros((b, h + 2 * p, wd + 2 * p, ci), dtype=dy.dtype)  # channels-last while scattering
    for i in range(k):
        for j in range(k):
            part = dmat @ np.ascontiguousarray(w[:, :, i, j])  # [B*Ho*Wo, Ci]
            dxp[:, i : i + ho, j : j + wo, :] += part.reshape(b, ho, wo, ci)
    return np.ascontiguousarray(dxp[:, p : p + h, p : p + wd, :].transpose(0, 3, 1, 2))


def conv2d_backward(dy, w, cols, x_shape, padding: str = "valid") -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dw)`` of :func:`conv2d_forward`."""
    return conv2d_backward_input(dy, w, x_shape, padding), conv2d_backward_weight(dy, cols, w.shape)


def maxpool_forward(x, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping p x p max pooling of [B, C, H, W] (stride p; floor: trailing rows/columns dropped).

    Returns ``(out, argmax)``: ``out`` [B, C, H//p, W//p] and the uint8 index
    (row-major within the window) of the first maximum of each window.
    """
    x = _float(x)
    if x.ndim != 4:
        raise ValueError(f"maxpool input has shape {x.shape}; expected [B, C, H, W]")
    if not 1 <= p <= 16:
        raise ValueError(f"maxpool pool = {p}: allowed 1..16")
    b, c, h, w = x.shape
    ho, wo = h // p, w // p
    if ho < 1 or wo < 1:
        raise ValueError(f"maxpool pool = {p} does not fit the {h}x{w} input")
    blocks = x[:, :, : ho * p, : wo * p].reshape(b, c, ho, p, wo, p).transpose(0, 1, 2, 4, 3, 5)
    blocks = blocks.reshape(b, c, ho, wo, p * p)
    idx = blocks.argmax(axis=-1)
    out = np.take_along_axis(blocks, idx[..., None], axis=-1)[..., 0]
    return out, idx.astype(np.uint8)


def pooled_bn_beta(p: int, kind: str = "l1_bnn") -> float:
    """Initial BN bias of a layer whose BN output is max-pooled over ``p x p`` windows before the sign.

    With ``beta = 0`` half of the BN outputs are positive, so the largest of ``p^2`` of them is positive in
    ``1 - 2^-(p^2)`` of the windows (94 % for ``p = 2``): the pooled activations start almost all +1 and
    carry little information until beta has moved. This bias puts the median of the window's largest
    output at 0 for normally distributed BN outputs: ``-Phi^-1(2^(-1/p^2))`` standard deviations, times
    ``sqrt(pi / 2)`` for the l1 kinds, whose unit is the mean absolute deviation (``p = 2``: -1.251 for l1,
    -0.998 for l2; ``p = 1``: 0).
    """
    if p <= 1:
        return 0.0
    z = NormalDist().inv_cdf(2.0 ** (-1.0 / (p * p)))
    return -z * (math.sqrt(math.pi / 2) if kind != "l2" else 1.0)


def maxpool_backward(dout, argmax, x_shape, p: int) -> np.ndarray:
    """dLoss/dx of :func:`maxpool_forward`: each window's gradient goes to its (first) maximum."""
    dout = _float(dout)
    b, c, h, w = x_shape
    ho, wo = dout.shape[2], dout.shape[3]
    blocks = np.zeros((b, c, ho, wo, p * p), dtype=dout.dtype)
    np.put_along_axis(blocks, argmax.astype(np.intp)[..., None], dout[..., None], axis=-1)
    dx = np.zeros((b, c, h, w), dtype=dout.dtype)
    dx[:, :, : ho * p, : wo * p] = (
        blocks.reshape(b, c, ho, wo, p, p).transpose(0, 1, 2, 4, 3, 5).reshape(b, c, ho * p, wo * p)
    )
    return dx


# ---------------------------------------------------------------------------
# E2-Train predictive sign gradient


def msb_quantise(v, bits: int) -> np.ndarray:
    """The ``bits`` most significant bits of ``v`` as a sign-magnitude fixed-point tensor.

    Per-tensor scale ``S = 2**e`` with ``max|v| < S`` (``e`` from frexp), step
    ``S * 2**-(bits-1)`` (the paper's Delta = 2**-(B_msb - 1) on [-1, 1)), and the
    low bits truncated toward zero: ``|msb(v)| <= |v| < |msb(v)| + step``; at most
    ``2**bits - 1`` levels. Same dtype as ``v`` (float32 or float64).
    """
    bits = _check_bits(bits, 1, "msb bits")
    v = _float(v)
    m = _max_abs(v, "msb_quantise")
    if m == 0:
        return np.zeros_like(v)
    _, e = math.frexp(m)
    shift = bits - 1 - e
    return np.ldexp(np.trunc(np.ldexp(v, shift)), -shift).astype(v.dtype, copy=False)


def predictive_sign_grad(x_hat, dy, bits: int, beta: float, x_bits: int | None = None) -> tuple[np.ndarray, float]:
    """E2-Train PSG (Wang, Jiang et al. 2019, Eq. 2 with the adaptive threshold) for a dense layer.

    ``x_hat`` [N, in] binary activations and ``dy`` [N, out]. For a conv layer pass
    ``cols`` and ``conv_dy_matrix(dy)`` and turn the [Ci*k*k, Co] result into
    [Co, Ci, k, k] with :func:`conv_weight_from_matrix` (= ``.T.reshape``). The predictor is
    ``p = x_msb^T @ msb(dy, bits)``; where ``|p| >= beta * max|p|`` and ``p != 0``
    the result is ``sign(p)``, elsewhere ``sign(x_hat^T @ dy)`` (full precision).
    Signs use :func:`sign` (sign(0) = +1), so with no entry predicted the result
    equals the plain bool weight gradient ``sign(x_hat^T @ dy)``.

    Returns ``(signs [in, out] float32, fraction of entries decided by the predictor)``.

    Deviations from the paper: ``x_msb = x_hat`` unless ``x_bits`` is given
    (binary activations are their own MSBs; the paper also truncates x); the
    threshold uses ``max|p|`` where the paper writes ``max p``; a zero predictor
    never decides (its sign says nothing); both products are computed in full
    here, whereas hardware computes the full one only for undecided entries.
    """
    x = _float(x_hat)
    g = _float(dy).astype(x.dtype, copy=False)
    if x.ndim != 2 or g.ndim != 2 or x.shape[0] != g.shape[0]:
        raise ValueError(f"PSG operands {x.shape} and {g.shape}: expected [N, in] and [N, out]")
    xq = x if x_bits is None else msb_quantise(x, x_bits)
    pred = xq.T @ msb_quantise(g, bits)
    full = x.T @ g
    mag = np.abs(pred)
    amax = mag.max() if mag.size else 0
    use = (mag >= beta * amax) & (pred != 0)
    out = np.where(use, sign(pred), sign(full)).astype(np.float32)
    return out, float(use.mean()) if use.size else 0.0
