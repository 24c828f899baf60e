"""Tests of sim/reference/ops.py: gradients by finite differences, quantisers against the paper's formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.reference import ops

# ---------------------------------------------------------------------------
# Helpers


def numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar function ``f`` at ``x`` (float64)."""
    x = x.astype(np.float64).copy()
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        fp = f(x)
        flat[i] = old - h
        fm = f(x)
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * h)
    return g


def assert_close(a, b, rtol=1e-5, atol=1e-7):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# Binarisation


def test_sign_and_ste_mask():
    x = np.array([-2.0, -1.0, -0.0, 0.0, 1e-30, 1.0, 1.5], dtype=np.float32)
    s = ops.sign(x)
    assert s.dtype == np.float32
    assert s.tolist() == [-1, -1, 1, 1, 1, 1, 1]
    assert ops.ste_mask(x).tolist() == [False, True, True, True, True, True, False]


# ---------------------------------------------------------------------------
# Batch norm: gradients by finite differences


@pytest.mark.parametrize("kind", ["l2", "l1"])
@pytest.mark.parametrize("shape", [(7, 3), (3, 2, 3, 3)])
def test_bn_backward_matches_finite_differences(kind, shape):
    rng = np.random.default_rng(1)
    y = rng.normal(size=shape) * 3 + 1
    beta = rng.normal(size=shape[1])
    r = rng.normal(size=shape)  # loss = sum(x * r), so dL/dx = r
    eps = 1e-3

    def loss_y(yy):
        return float(np.sum(ops.bn_forward(yy, beta, kind, eps)[0] * r))

    def loss_b(bb):
        return float(np.sum(ops.bn_forward(y, bb, kind, eps)[0] * r))

    _, cache = ops.bn_forward(y, beta, kind, eps)
    dy, dbeta = ops.bn_backward(r, cache, kind)
    assert dy.dtype == np.float64 and dy.shape == shape and dbeta.shape == (shape[1],)
    assert_close(dy, numeric_grad(loss_y, y), rtol=1e-5, atol=1e-6)
    assert_close(dbeta, numeric_grad(loss_b, beta), rtol=1e-6, atol=1e-6)


def test_bn_forward_values_and_float32():
    rng = np.random.default_rng(2)
    y = rng.integers(-20, 21, size=(16, 4, 3, 3)).astype(np.float32)
    beta = rng.normal(size=4).astype(np.float32)
    eps = 1e-5
    yc = y.transpose(1, 0, 2, 3).reshape(4, -1).astype(np.float64)
    mu = yc.mean(axis=1)
    var = yc.var(axis=1)
    s = np.abs(yc - mu[:, None]).mean(axis=1)
    for kind, denom, scale in (("l2", np.sqrt(var + eps), var), ("l1", s + eps, s), ("l1_bnn", s + eps, s)):
        x, cache = ops.bn_forward(y, beta, kind, eps)
        assert x.dtype == np.float32
        want = (y - mu[None, :, None, None]) / denom[None, :, None, None] + beta[None, :, None, None]
        assert_close(x, want, rtol=1e-5, atol=1e-5)
        assert_close(cache["mu"], mu, rtol=1e-6, atol=1e-6)
        assert_close(cache["scale"], scale, rtol=1e-5, atol=1e-6)


def test_l1_exact_gradient_differs_from_algorithm2():
    """The exact l1 gradient and Alg 2 agree on dbeta and the v - mean(v) part, not on the rest."""
    rng = np.random.default_rng(3)
    y = rng.normal(size=(32, 5)) * 4
    beta = rng.normal(size=5)
    dx = rng.normal(size=(32, 5))
    _, c1 = ops.bn_forward(y, beta, "l1")
    _, cb = ops.bn_forward(y, beta, "l1_bnn")
    d1, b1 = ops.bn_backward(dx, c1, "l1")
    db, bb = ops.bn_backward(dx, cb, "l1_bnn")
    assert_close(b1, bb)
    assert not np.allclose(d1, db)
    # The exact gradient sums to zero per channel (BN output is invariant to shifting y);
    # Algorithm 2's does not: its x_hat = sgn(x) includes beta and is not centred.
    assert_close(d1.sum(axis=0), 0, atol=1e-9)
    assert np.all(np.abs(db.sum(axis=0)) > 1e-6)


# ---------------------------------------------------------------------------
# BNN-specific l1 batch norm: Algorithm 2 line by line


def algorithm2_bn_backward(dx: np.ndarray, x: np.ndarray, y: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2 lines 9-12 for a [B, M] layer, with loops; eps added to the l1 norm as in the forward."""
    bsz, channels = y.shape
    dy = np.zeros_like(dx)
    dbeta = np.zeros(channels)
    for m in range(channels):
        ycol = [float(y[i, m]) for i in range(bsz)]
        xcol = [float(x[i, m]) for i in range(bsz)]
        mu = sum(ycol) / bsz
        l1 = sum(abs(t - mu) for t in ycol) / bsz + eps  # ||y - mu(y)||_1 / B
        alpha = sum(abs(t) for t in xcol) / bsz  # line 7: ||x||_1 / B
        xhat = [1.0 if t >= 0 else -1.0 for t in xcol]
        v = [float(dx[i, m]) / l1 for i in range(bsz)]  # line 10
        mean_v = sum(v) / bsz
        mean_vx = sum(v[i] * xhat[i] * alpha for i in range(bsz)) / bsz
        for i in range(bsz):  # line 11
            dy[i, m] = v[i] - mean_v - mean_vx * xhat[i]
        dbeta[m] = sum(float(dx[i, m]) for i in range(bsz))  # line 12
    return dy, dbeta


@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_l1_bnn_backward_is_algorithm2(eps):
    rng = np.random.default_rng(4)
    y = rng.integers(-30, 31, size=(20, 6)).astype(np.float32)  # BNN products are integers
    beta = (rng.normal(size=6) * 0.5).astype(np.float32)
    dx = rng.normal(size=(20, 6)).astype(np.float32)
    x, cache = ops.bn_forward(y, beta, "l1_bnn", eps)
    dy, dbeta = ops.bn_backward(dx, cache, "l1_bnn")
    want_dy, want_db = algorithm2_bn_backward(dx, x, y, eps)
    assert dy.dtype == np.float32
    assert_close(dy, want_dy, rtol=1e-4, atol=1e-5)
    assert_close(dbeta, want_db, rtol=1e-5, atol=1e-5)


def test_l1_bnn_conv_uses_batch_and_spatial_positions():
    """For [B, C, H, W] the Algorithm 2 statistics run over B*H*W values per channel."""
    rng = np.random.default_rng(5)
    y = rng.integers(-9, 10, size=(4, 3, 2, 5)).astype(np.float32)
    beta = rng.normal(size=3).astype(np.float32)
    dx = rng.normal(size=y.shape).astype(np.float32)
    x, cache = ops.bn_forward(y, beta, "l1_bnn")
    dy, dbeta = ops.bn_backward(dx, cache, "l1_bnn")
    to2d = lambda a: a.transpose(0, 2, 3, 1).reshape(-1, 3)  # noqa: E731
    want_dy, want_db = algorithm2_bn_backward(to2d(dx), to2d(x), to2d(y), 1e-5)
    assert_close(to2d(dy), want_dy, rtol=1e-4, atol=1e-5)
    assert_close(dbeta, want_db, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(50, 8), (10, 8, 4, 4)])
def test_l1_bnn_cache_holds_no_full_precision_activations(shape):
    rng = np.random.default_rng(6)
    y = rng.normal(size=shape).astype(np.float32) * 5
    beta = rng.normal(size=8).astype(np.float32)
    x, cache = ops.bn_forward(y, beta, "l1_bnn")
    assert set(cache) == {"x_hat", "alpha", "s", "eps", "mu", "scale", "const"}  # const: [C] bool
    for key, val in cache.items():
        if isinstance(val, np.ndarray) and val.size == x.size:
            assert key == "x_hat" and val.dtype in (np.int8, np.bool_), key
        elif isinstance(val, np.ndarray):
            assert val.shape == (8,), key
        else:
            assert isinstance(val, float), key
    assert np.array_equal(cache["x_hat"], np.where(x >= 0, 1, -1))
    assert_close(cache["alpha"], np.abs(x).reshape(shape[0], 8, -1).mean(axis=(0, 2)), rtol=1e-5)
    # l2 and l1 do keep a full-precision normalised activation (what Alg 2 removes).
    assert ops.bn_forward(y, beta, "l1")[1]["xn"].dtype == np.float32


def test_bn_constant_channel_with_zero_eps():
    y = np.zeros((5, 2), dtype=np.float32)
    y[:, 1] = np.arange(5)
    beta = np.array([0.25, -0.5], dtype=np.float32)
    for kind in ops.BN_KINDS:
        x, cache = ops.bn_forward(y, beta, kind, eps=0.0)
        assert np.all(np.isfinite(x)) and np.all(x[:, 0] == 0.25)
        dy, _ = ops.bn_backward(np.ones_like(y), cache, kind)
        assert np.all(np.isfinite(dy))


@pytest.mark.parametrize("kind", ops.BN_KINDS)
@pytest.mark.parametrize("shape", [(12, 3), (4, 3, 2, 2)])
def test_bn_eval_with_running_stats(kind, shape):
    rng = np.random.default_rng(7)
    y = rng.normal(size=shape).astype(np.float32) * 2 + 3
    beta = rng.normal(size=3).astype(np.float32)
    x, cache = ops.bn_forward(y, beta, kind)
    # Running statistics equal to the batch statistics reproduce the training output.
    assert_close(ops.bn_forward_eval(y, beta, kind, cache["mu"], cache["scale"]), x, rtol=1e-5, atol=1e-5)
    # Other statistics: the plain formula, per sample (independent of the rest of the batch).
    rm = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    rs = np.array([4.0, 1.0, 0.25], dtype=np.float32)
    bs = (1, 3) + (1,) * (len(shape) - 2)
    denom = np.sqrt(rs + 1e-5) if kind == "l2" else rs + 1e-5
    want = (y - rm.reshape(bs)) / denom.reshape(bs) + beta.reshape(bs)
    got = ops.bn_forward_eval(y, beta, kind, rm, rs)
    assert got.dtype == np.float32
    assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert_close(ops.bn_forward_eval(y[:1], beta, kind, rm, rs), want[:1], rtol=1e-6, atol=1e-6)


def test_bn_rejects_bad_input():
    with pytest.raises(ValueError, match="kind"):
        ops.bn_forward(np.zeros((2, 3)), np.zeros(3), "l3")
    with pytest.raises(ValueError, match="beta"):
        ops.bn_forward(np.zeros((2, 3)), np.zeros(4), "l2")


# ---------------------------------------------------------------------------
# Losses


@pytest.mark.parametrize("loss", [ops.softmax_cross_entropy, ops.squared_hinge])
def test_loss_gradients(loss):
    rng = np.random.default_rng(8)
    z = rng.normal(size=(6, 5)) * 1.5
    labels = rng.integers(0, 5, size=6)
    value, grad, correct = loss(z, labels)
    assert grad.shape == z.shape
    assert_close(grad, numeric_grad(lambda zz: loss(zz, labels)[0], z), rtol=1e-6, atol=1e-8)
    assert correct == int(np.sum(z.argmax(axis=1) == labels))
    assert isinstance(value, float) and value > 0


def test_loss_values():
    z = np.array([[2.0, 0.0, -1.0], [0.0, 0.5, 0.0]], dtype=np.float32)
    labels = np.array([0, 2])
    ce, g, correct = ops.softmax_cross_entropy(z, labels)
    p = np.exp(z.astype(np.float64)) / np.exp(z.astype(np.float64)).sum(axis=1, keepdims=True)
    assert ce == pytest.approx(-(math.log(p[0, 0]) + math.log(p[1, 2])) / 2, rel=1e-6)
    assert g.dtype == np.float32 and correct == 1
    sh, g, correct = ops.squared_hinge(z, labels)
    # row 0: t = (+1,-1,-1): margins (0, 1, 0); row 1: t = (-1,-1,+1): margins (1, 1.5, 1)
    assert sh == pytest.approx((1 + 1 + 2.25 + 1) / 2)
    assert correct == 1
    # Large logits do not overflow.
    big, gbig, _ = ops.softmax_cross_entropy(np.array([[1e4, -1e4]], dtype=np.float32), [1])
    assert big == pytest.approx(2e4) and np.all(np.isfinite(gbig))


# ---------------------------------------------------------------------------
# Convolution and pooling


def naive_conv(x, w, pad):
    b, ci, h, wd = x.shape
    co, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = h + 2 * pad - k + 1, wd + 2 * pad - k + 1
    y = np.zeros((b, co, ho, wo))
    for n in range(b):
        for o in range(co):
            for r in range(ho):
                for c in range(wo):
                    y[n, o, r, c] = np.sum(xp[n, :, r : r + k, c : c + k] * w[o])
    return y


@pytest.mark.parametrize("padding,k", [("valid", 3), ("same", 3), ("valid", 2), ("same", 1)])
def test_conv2d_forward_and_backward(padding, k):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 3, 5, 4))
    w = rng.normal(size=(4, 3, k, k))
    pad = (k - 1) // 2 if padding == "same" else 0
    y, cols = ops.conv2d_forward(x, w, padding)
    assert_close(y, naive_conv(x, w, pad), rtol=1e-10, atol=1e-10)
    assert cols.shape == (y.shape[0] * y.shape[2] * y.shape[3], 3 * k * k)
    # cols: rows (b, h, w), columns (c, i, j) as w.reshape(Co, -1); a conv layer is a dense layer on cols.
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = y.shape[2], y.shape[3]
    rows = [xp[n, :, r : r + k, c : c + k].reshape(-1) for n in range(2) for r in range(ho) for c in range(wo)]
    assert np.array_equal(cols, np.array(rows))
    wm = ops.conv_weight_matrix(w)
    assert np.array_equal(wm, w.reshape(4, -1).T)
    assert_close(ops.conv_dy_matrix(y), cols @ wm, rtol=1e-10, atol=1e-10)
    assert np.array_equal(ops.conv_weight_from_matrix(wm, w.shape), w)
    r = rng.normal(size=y.shape)
    dx, dw = ops.conv2d_backward(r, w, cols, x.shape, padding)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert_close(dx, numeric_grad(lambda xx: float(np.sum(ops.conv2d_forward(xx, w, padding)[0] * r)), x), rtol=1e-6)
    assert_close(dw, numeric_grad(lambda ww: float(np.sum(ops.conv2d_forward(x, ww, padding)[0] * r)), w), rtol=1e-6)
    assert_close(ops.conv2d_backward_input(r, w, x.shape, padding), dx, rtol=1e-12, atol=1e-12)
    assert_close(ops.conv2d_backward_weight(r, cols, w.shape), dw, rtol=1e-12, atol=1e-12)


def test_conv2d_float32_and_padding_errors():
    x = np.ones((1, 2, 4, 4), dtype=np.float32)
    w = np.ones((3, 2, 3, 3), dtype=np.float32)
    y, cols = ops.conv2d_forward(x, w, "same")
    assert y.dtype == np.float32 and cols.dtype == np.float32
    # Zero padding: a corner output sums only 2*2*2 real inputs, the centre 2*3*3.
    assert y[0, 0, 0, 0] == 8 and y[0, 0, 1, 1] == 18
    with pytest.raises(ValueError, match="padding"):
        ops.conv2d_forward(x, w, "full")
    with pytest.raises(ValueError, match="odd"):
        ops.conv2d_forward(x, np.ones((3, 2, 2, 2), dtype=np.float32), "same")


@pytest.mark.parametrize("shape,p", [((2, 3, 6, 4), 2), ((1, 2, 7, 5), 2), ((2, 1, 7, 8), 3)])
def test_maxpool_forward_and_backward(shape, p):
    rng = np.random.default_rng(10)
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64) * 0.01  # distinct values: no ties
    out, idx = ops.maxpool_forward(x, p)
    ho, wo = shape[2] // p, shape[3] // p
    assert out.shape == shape[:2] + (ho, wo)
    for r in range(ho):
        for c in range(wo):
            assert_close(out[:, :, r, c], x[:, :, r * p : (r + 1) * p, c * p : (c + 1) * p].max(axis=(2, 3)))
    d = rng.normal(size=out.shape)
    dx = ops.maxpool_backward(d, idx, x.shape, p)
    assert_close(dx, numeric_grad(lambda xx: float(np.sum(ops.maxpool_forward(xx, p)[0] * d)), x, h=1e-5))
    assert np.all(dx[:, :, ho * p :, :] == 0) and np.all(dx[:, :, :, wo * p :] == 0)


def test_maxpool_ties_go_to_first():
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    out, idx = ops.maxpool_forward(x, 2)
    dx = ops.maxpool_backward(np.full((1, 1, 1, 1), 3.0, dtype=np.float32), idx, x.shape, 2)
    assert out.item() == 1 and dx.reshape(-1).tolist() == [3, 0, 0, 0]


# ---------------------------------------------------------------------------
# po2_k: against a transcription of the paper's definition


def paper_po2(values: list[float], k: int) -> list[float]:
    """po2_k(v) = sgn(v) * 2^(exp(v) - b), exp(v) = max(-2^(k-2), [log2|v| + b]),
    b = 2^(k-2) - 1 - [log2 ||v||_inf], [.] = round to nearest."""
    m = max(abs(t) for t in values)
    if m == 0:
        return [0.0] * len(values)
    b = 2 ** (k - 2) - 1 - round(math.log2(m))
    out = []
    for t in values:
        if t == 0:
            out.append(0.0)  # sgn(0) = 0
            continue
        e = max(-(2 ** (k - 2)), round(math.log2(abs(t)) + b))
        out.append(math.copysign(2.0 ** (e - b), t))
    return out


def random_tensor(rng, n: int) -> np.ndarray:
    scale = 10.0 ** rng.uniform(-6, 3)
    v = rng.normal(size=n) * scale * np.exp(rng.normal(size=n) * 2)  # wide dynamic range
    v[rng.random(n) < 0.1] = 0
    return v.astype(np.float32)


def below_range(v: np.ndarray, k: int) -> np.float32:
    """A nonzero value more than 2^(k-1) octaves below max|v|: under the exponent range, so it clamps.

    For k = 8 that is a float32 subnormal when max|v| is small; still exactly representable.
    """
    m = float(np.abs(v).max())
    return np.float32(-max(m * 2.0 ** -(2 ** (k - 1) + 1), 2.0**-149))


@pytest.mark.parametrize("k", range(2, 9))
def test_po2_matches_paper_formula(k):
    rng = np.random.default_rng(100 + k)
    for trial in range(40):
        v = random_tensor(rng, 60)
        if trial % 5 == 0:
            v[rng.integers(60)] = below_range(v, k)
        got = ops.po2_quantise(v, k)
        assert got.dtype == np.float32 and got.shape == v.shape
        want = np.array(paper_po2([float(t) for t in v], k), dtype=np.float32)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k", range(2, 9))
def test_po2_codes(k):
    rng = np.random.default_rng(200 + k)
    half = 2 ** (k - 2)
    for _ in range(20):
        v = random_tensor(rng, 50)
        v[rng.integers(50)] = below_range(v, k)
        sgn, exp, bias, is_zero = ops.po2_encode(v, k)
        assert sgn.dtype == np.int8 and exp.dtype == np.int16 and isinstance(bias, int)
        # k-1 exponent bits; the largest magnitude gets the top code 2^(k-2) - 1.
        assert exp.min() >= -half and exp.max() <= half - 1
        assert exp[np.argmax(np.abs(v))] == half - 1
        # Clamp: the tiny nonzero value maps to the smallest power, not to zero.
        tiny = np.argmin(np.where(v == 0, np.inf, np.abs(v)))
        assert exp[tiny] == -half and not is_zero[tiny]
        # Sign, zeros, round trip.
        nz = v != 0
        assert np.array_equal(is_zero, ~nz)
        assert np.array_equal(sgn[nz], np.sign(v[nz]).astype(np.int8))
        q = ops.po2_decode(sgn, exp, bias, is_zero)
        np.testing.assert_array_equal(q, ops.po2_quantise(v, k))
        assert np.array_equal(np.sign(q), np.sign(v))
        # Quantising a po2 tensor again changes nothing (same codes, same bias).
        s2, e2, b2, z2 = ops.po2_encode(q, k)
        assert b2 == bias and np.array_equal(e2, exp) and np.array_equal(s2, sgn) and np.array_equal(z2, is_zero)
        # Within the range, po2 is within a factor sqrt(2) of the value.
        inrange = nz & (exp > -half)
        ratio = np.abs(q[inrange].astype(np.float64) / v[inrange])
        assert np.all(ratio <= math.sqrt(2) + 1e-6) and np.all(ratio >= 1 / math.sqrt(2) - 1e-6)


def test_po2_zero_tensors_and_bad_input():
    for shape in [(0,), (3, 4)]:
        v = np.zeros(shape, dtype=np.float32)
        sgn, exp, bias, is_zero = ops.po2_encode(v, 5)
        assert bias == 0 and is_zero.all()
        assert np.array_equal(ops.po2_quantise(v, 5), v)
    assert ops.po2_quantise(np.array([-0.0, 3.0], dtype=np.float32), 5).tolist() == [0.0, 4.0]
    with pytest.raises(ValueError, match="non-finite"):
        ops.po2_quantise(np.array([1.0, np.nan]), 5)
    with pytest.raises(ValueError, match="bits"):
        ops.po2_quantise(np.ones(3), 1)


def test_po2_rounds_log2_to_nearest():
    # log2(1.41) < 0.5 rounds down to 1, log2(1.42) > 0.5 rounds up to 2 (sqrt 2 = 1.41421...).
    v = np.array([8.0, 1.41, 1.42, -3.0], dtype=np.float32)
    assert ops.po2_quantise(v, 5).tolist() == [8.0, 1.0, 2.0, -4.0]
    # k = 2: exponent codes -1, 0 only -> the maximum's power and half of it.
    assert ops.po2_quantise(np.array([8.0, 5.0, 0.01, -0.01], dtype=np.float32), 2).tolist() == [8, 4, 4, -4]


# ---------------------------------------------------------------------------
# int-k block floating point, float16, bfloat16


@pytest.mark.parametrize("k", range(2, 9))
def test_block_floating_point_properties(k):
    rng = np.random.default_rng(300 + k)
    for _ in range(30):
        v = random_tensor(rng, 400)
        q = ops.quantise_dy(v, "int", k)
        assert q.dtype == np.float32 and q.shape == v.shape
        mant, exp = ops.bfp_encode(v, k)
        step = 2.0**exp
        np.testing.assert_array_equal(ops.bfp_decode(mant, exp), q)
        assert np.array_equal(q.astype(np.float64), mant * step)
        assert mant.min() >= -(2 ** (k - 1)) and mant.max() <= 2 ** (k - 1) - 1
        assert len(np.unique(q)) <= 2**k
        err = np.abs(q.astype(np.float64) - v)
        assert err.max() <= step / 2  # round to nearest, no element clipped by more than half a step
        i = np.argmax(np.abs(v))
        assert err[i] <= step / 2
        # The step is the smallest power of two that keeps the maximum within half a step.
        assert np.abs(v).max() > (2 ** (k - 1) - 0.5) * step / 2
        assert np.all(q[v == 0] == 0)


def test_block_floating_point_examples():
    # k = 5: mantissas -16..15. max 15.5 * 2^0 sits on the top tie -> saturates to 15.
    v = np.array([15.5, 1.5, 2.5, -15.0, 0.25], dtype=np.float32)
    assert ops.quantise_dy(v, "int", 5).tolist() == [15.0, 2.0, 2.0, -15.0, 0.0]
    assert ops.bfp_encode(v, 5)[1] == 0
    # The same tie on the negative side reaches the two's-complement code -16 without saturating.
    assert ops.quantise_dy(np.array([-15.5, 3.0], dtype=np.float32), "int", 5).tolist() == [-16.0, 3.0]
    assert ops.quantise_dy(np.array([15.6, 1.0], dtype=np.float32), "int", 5).tolist() == [16.0, 0.0]
    assert np.array_equal(ops.quantise_dy(np.zeros(4), "int", 5), np.zeros(4))


def test_float16_and_bfloat16_rounding():
    one = 1.0
    # float16 has 10 fraction bits: 1 + 2^-11 is a tie -> 1 (even); 1 + 3*2^-11 -> 1 + 2^-9 (even).
    v = np.array([one + 2**-11, one + 3 * 2**-11, one + 2**-11 + 2**-20, 1e-8, 7e4], dtype=np.float32)
    q = ops.quantise_dy(v, "float16", 5)
    assert q.dtype == np.float32
    assert q[:3].tolist() == [1.0, 1 + 2**-9, 1 + 2**-10]
    assert q[3] == np.float32(np.float16(1e-8)) and np.isinf(q[4])
    # bfloat16 has 7 fraction bits: ties at 2^-8 go to even.
    v = np.array([one + 2**-8, one + 3 * 2**-8, -(one + 2**-8 + 2**-20), 3.0, np.float32(0.1)], dtype=np.float32)
    q = ops.quantise_dy(v, "bfloat16", 5)
    assert q[:4].tolist() == [1.0, 1 + 2**-6, -(1 + 2**-7), 3.0]
    assert q[4] == np.float32(0.10009765625)  # 0.1 -> 0x3DCD
    rng = np.random.default_rng(11)
    r = rng.normal(size=1000).astype(np.float32)
    q = ops.quantise_dy(r, "bfloat16", 5)
    assert np.all(q.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(q - r) <= np.abs(r) * 2**-8)
    assert np.array_equal(ops.quantise_dy(r, "float32", 5), r)
    with pytest.raises(ValueError, match="dy format"):
        ops.quantise_dy(r, "int8", 5)


def test_quantise_dy_po2_dispatch():
    rng = np.random.default_rng(12)
    r = rng.normal(size=(10, 7)).astype(np.float32)
    np.testing.assert_array_equal(ops.quantise_dy(r, "po2", 5), ops.po2_quantise(r, 5))


# ---------------------------------------------------------------------------
# E2-Train predictive sign gradient


def test_msb_quantise_truncates():
    rng = np.random.default_rng(13)
    v = (rng.normal(size=500) * 0.3).astype(np.float32)
    for bits in (1, 2, 4, 10):
        q = ops.msb_quantise(v, bits)
        _, e = math.frexp(float(np.abs(v).max()))
        step = 2.0 ** (e - (bits - 1))
        assert np.all(np.abs(q) <= np.abs(v)) and np.all(np.abs(v - q) < step)
        assert np.all(q * v >= 0)  # toward zero: never flips a sign
        assert len(np.unique(q)) <= 2**bits - 1
        assert np.all(np.mod(q.astype(np.float64), step) == 0)


def test_psg_boundary_cases():
    rng = np.random.default_rng(14)
    x = np.where(rng.random((64, 20)) < 0.5, -1, 1).astype(np.float32)
    dy = (rng.normal(size=(64, 9)) * np.exp(rng.normal(size=(64, 1)))).astype(np.float32)
    exact = ops.sign(x.T.astype(np.float64) @ dy.astype(np.float64))
    # beta > 1: no entry reaches the threshold, every sign is the full-precision one.
    s, frac = ops.predictive_sign_grad(x, dy, 4, 1.01)
    assert frac == 0.0 and np.array_equal(s, exact)
    # beta = 1: only the entries at max|pred| are predicted.
    pred = x.T @ ops.msb_quantise(dy, 4)
    s, frac = ops.predictive_sign_grad(x, dy, 4, 1.0)
    top = np.abs(pred) == np.abs(pred).max()
    assert frac == pytest.approx(top.mean())
    assert np.array_equal(s[~top], exact[~top]) and np.array_equal(s[top], ops.sign(pred[top]))
    # beta = 0: every nonzero prediction decides; with many MSBs it agrees with the exact sign.
    s, frac = ops.predictive_sign_grad(x, dy, 4, 0.0)
    assert frac == pytest.approx(np.mean(pred != 0))
    s, frac = ops.predictive_sign_grad(x, dy, 16, 0.0)
    full = x.T.astype(np.float64) @ dy
    clear = np.abs(full) > 1e-3 * np.abs(full).max()
    assert np.array_equal(s[clear], exact[clear]) and frac > 0.99
    assert s.dtype == np.float32 and s.shape == (20, 9)
    # Zero dy: the predictor is all zero, so nothing is predicted; sign(0) = +1.
    s, frac = ops.predictive_sign_grad(x, np.zeros_like(dy), 4, 0.05)
    assert frac == 0.0 and np.all(s == 1)


def test_psg_mostly_predicted_at_paper_setting():
    """With beta = 0.05 (the paper's value) most entries come from the predictor and rarely differ."""
    rng = np.random.default_rng(15)
    x = np.where(rng.random((100, 64)) < 0.5, -1, 1).astype(np.float32)
    dy = ops.po2_quantise(rng.normal(size=(100, 32)).astype(np.float32), 5)
    s, frac = ops.predictive_sign_grad(x, dy, 8, 0.05)
    exact = ops.sign(x.T @ dy)
    assert frac > 0.5
    assert np.mean(s != exact) < 0.05


@pytest.mark.parametrize("kind", ["l1", "l1_bnn"])
@pytest.mark.parametrize("shape", [(37, 6), (5, 6, 3, 3)])
def test_l1_constant_channel_outputs_beta_and_passes_no_gradient(kind, shape):
    """A channel whose batch values are all equal (s = 0) gives x = beta exactly, s = 0, and dy = 0 (not
    dx / eps); the other channels are computed as if it were absent; dbeta is the plain sum."""
    rng = np.random.default_rng(12)
    y = (rng.normal(size=shape) * 9).astype(np.float32)
    y[:, 1] = np.float32(0.1) * 3  # a value whose batch mean is not exact in float32
    y[:, 4] = -7.0
    beta = rng.normal(size=6).astype(np.float32)
    dx = rng.normal(size=shape).astype(np.float32)
    x, cache = ops.bn_forward(y, beta, kind)
    assert cache["const"].tolist() == [False, True, False, False, True, False]
    for c in (1, 4):
        assert np.all(x[:, c] == beta[c]) and cache["scale"][c] == 0
    dy, dbeta = ops.bn_backward(dx, cache, kind)
    assert np.all(np.isfinite(dy)) and not dy[:, [1, 4]].any()
    assert_close(dbeta, dx.reshape(shape[0], 6, -1).sum(axis=(0, 2)), rtol=1e-5)
    keep = [0, 2, 3, 5]
    x2, cache2 = ops.bn_forward(y[:, keep], beta[keep], kind)
    dy2, _ = ops.bn_backward(dx[:, keep], cache2, kind)
    assert_close(x[:, keep], x2, rtol=1e-5, atol=1e-6)  # equal up to the order of float summation
    assert_close(dy[:, keep], dy2, rtol=1e-4, atol=1e-6)
