"""Integer datapath functions against exact rationals and their float counterparts (sim.reference.ops)."""

import math
from fractions import Fraction

import numpy as np
import pytest

from sim.hw import arith as A
from sim.reference import ops

P = A.ArithParams()
SQRT2 = math.sqrt(2.0)


def _rand_pm1(rng, shape):
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=shape)


# ---------------------------------------------------------------------------
# XNOR-popcount


def test_xnor_popcount_is_popcount():
    rng = np.random.default_rng(0)
    x = _rand_pm1(rng, (8, 70))
    w = _rand_pm1(rng, (70, 5))
    y = A.xnor_popcount(x, w)
    xb, wb = x > 0, w > 0
    for b in range(8):
        for m in range(5):
            pop = int(np.count_nonzero(~(xb[b] ^ wb[:, m])))  # XNOR then popcount
            assert y[b, m] == 2 * pop - 70


def test_int8_input_and_worst_case():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, size=(16, 784)).astype(np.int16)
    w = _rand_pm1(rng, (784, 9))
    assert np.array_equal(A.xnor_popcount(x, w, 128), x.astype(np.int64) @ w.astype(np.int64))
    xw = np.full((2, 784), -128, dtype=np.int16)
    ww = np.ones((784, 3), dtype=np.int8)
    assert (A.xnor_popcount(xw, ww, 128) == -128 * 784).all()


def test_exact_matmul_paths_agree():
    rng = np.random.default_rng(2)
    a = rng.integers(-(1 << 14), 1 << 14, size=(30, 40))
    b = rng.integers(-1, 2, size=(40, 7))
    ref = a @ b
    for bound in (1 << 20, 1 << 40, 1 << 60):  # float32 (values fit), float64, int64
        if bound < (1 << 24) and np.abs(a).sum(axis=1).max() >= (1 << 24):
            continue
        assert np.array_equal(A.exact_matmul(a, b, bound), ref)
    with pytest.raises(OverflowError):
        A.exact_matmul(a, b, 1 << 63)


# ---------------------------------------------------------------------------
# round(log2) by leading one + mantissa compare


def _exact_round_log2(num: int, den: int) -> int:
    r = Fraction(num, den)
    e = math.floor(math.log2(num) - math.log2(den)) - 2
    while Fraction(2) ** (e + 1) <= r:
        e += 1
    # r in [2^e, 2^(e+1)): rounds up iff r >= sqrt2 2^e  <=>  r^2 >= 2^(2e+1)
    return e + 1 if r * r >= Fraction(2) ** (2 * e + 1) else e


def test_round_log2_ratio_random_and_near_boundaries():
    rng = np.random.default_rng(3)
    dens = [1, 2, 3, 100, 7919, 10**6 + 3, (1 << 30) - 1]
    cols = []
    for d in dens:
        vals = list(rng.integers(1, 1 << 40, size=40))
        for j in range(-5, 30):  # integers right at sqrt2 * 2^j * d
            t = SQRT2 * 2.0**j * d
            if 1 <= t < 2**52:
                vals += [int(math.floor(t)), int(math.ceil(t)), max(1, int(math.floor(t)) - 1)]
        cols.append(vals[:100] + [1] * (100 - len(vals[:100])))
    num = np.array(cols, dtype=np.int64).T  # [100, len(dens)]
    got = A.round_log2_ratio(num, np.array(dens, dtype=object))
    for c, d in enumerate(dens):
        for i in range(num.shape[0]):
            assert got[i, c] == _exact_round_log2(int(num[i, c]), d), (int(num[i, c]), d)


def test_sqrt2_thresholds_and_constant_multiplier_form():
    # T_hi = ceil(sqrt2 M), T_lo = ceil(M / sqrt2); the doc's constant-multiplier form gives the same.
    W = 20
    c = math.isqrt(2 << (2 * (2 * W + 2)))  # floor(sqrt2 2^(2W+2))
    for m in [1, 2, 3, (1 << (W - 1)), (1 << W) - 1, 724, 1000003 % (1 << W)]:
        hi, lo = A.sqrt2_thresholds(m)
        assert hi == math.isqrt(2 * m * m) + 1 and (hi - 1) ** 2 < 2 * m * m < hi**2
        assert 2 * (lo - 1) ** 2 < m * m < 2 * lo**2
        assert hi == -((-(m * c)) >> (2 * W + 2))  # ceil(m c / 2^(2W+2))


def test_bit_length_exact_near_powers():
    v = np.array([0, 1, 2, 3, (1 << 53) - 1, 1 << 53, (1 << 54) - 1, (1 << 62) - 1], dtype=np.int64)
    assert [int(x) for x in A.bit_length(v)] == [int(x).bit_length() for x in v]


# ---------------------------------------------------------------------------
# BN forward


def _bn_case(seed, B=100, N=256, M=48, beta_range=1 << 17):
    rng = np.random.default_rng(seed)
    x = _rand_pm1(rng, (B, N))
    w = _rand_pm1(rng, (N, M))
    y = A.xnor_popcount(x, w)
    beta = rng.integers(-beta_range, beta_range, size=M)
    return y, beta


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bn_forward_exact_against_rationals(seed):
    y, beta = _bn_case(seed, B=20, N=64, M=6)
    f = A.bn_forward(y, beta, P, 64)
    n = y.shape[0]
    for m in range(y.shape[1]):
        mu = Fraction(int(y[:, m].sum()), n)
        s = sum(abs(Fraction(int(v)) - mu) for v in y[:, m]) / n
        assert f.S[m] == s * n * n
        b = Fraction(int(beta[m]), 1 << P.beta_frac)
        xs = [(Fraction(int(v)) - mu) / s + b if s else b for v in y[:, m]]
        assert [int(v) for v in f.x_hat[:, m]] == [1 if v >= 0 else -1 for v in xs]
        assert [bool(v) for v in f.mask[:, m]] == [abs(v) <= 1 for v in xs]
        alpha = sum(abs(v) for v in xs) / n
        assert abs(Fraction(int(f.alpha_q[m]), 1 << P.alpha_frac) - alpha) <= Fraction(1, 2 << P.alpha_frac)


@pytest.mark.parametrize("seed", [3, 4])
def test_bn_forward_against_float_reference(seed):
    y, beta = _bn_case(seed)
    f = A.bn_forward(y, beta, P, 256)
    xf, cache = ops.bn_forward(y.astype(np.float64), beta / 2.0**P.beta_frac, "l1_bnn", eps=0.0)
    # statistics: mean exact, s exact (float rounding only), alpha within half an LSB
    assert np.allclose(f.sum_y / y.shape[0], cache["mu"], rtol=0, atol=1e-12)
    assert np.allclose(f.S / y.shape[0] ** 2, cache["s"], rtol=1e-12)
    assert np.abs(f.alpha_q.astype(float) - cache["alpha"] * 2**P.alpha_frac).max() <= 0.5 + 1e-6
    # signs and masks agree except where float x is within rounding of 0 / +-1
    far = np.abs(xf) > 1e-9
    assert np.array_equal(f.x_hat[far], cache["x_hat"][far])
    far1 = np.abs(np.abs(xf) - 1) > 1e-9
    assert np.array_equal(f.mask[far1], ops.ste_mask(xf)[far1])


def test_bn_forward_constant_channel_gives_beta():
    y = np.full((10, 2), 7, dtype=np.int64)
    beta = np.array([-5, 5])
    f = A.bn_forward(y, beta, P, 64)
    assert list(f.S) == [0, 0]
    assert (f.x_hat[:, 0] == -1).all() and (f.x_hat[:, 1] == 1).all()
    assert f.mask.all()  # |x| = |beta| tiny


def test_bn_forward_eval_against_float():
    rng = np.random.default_rng(5)
    y = rng.integers(-256, 257, size=(200, 32))
    mu_r = rng.integers(-(20 << 8), 20 << 8, size=32)
    s_r = rng.integers(1, 30 << 8, size=32)
    beta = rng.integers(-(1 << 17), 1 << 17, size=32)
    xh = A.bn_forward_eval(y, beta, mu_r, s_r, P, 256)
    xf = ops.bn_forward_eval(y.astype(np.float64), beta / 2.0**16, "l1", mu_r / 256.0, s_r / 256.0, eps=0.0)
    far = np.abs(xf) > 1e-9
    assert np.array_equal(xh[far], np.where(xf >= 0, 1, -1)[far])


def test_output_logits_within_one_lsb():
    y, beta = _bn_case(6, M=10)
    f = A.bn_forward(y, beta, P, 256)
    xq = A.output_logits(y, f, P)
    xf, _ = ops.bn_forward(y.astype(np.float64), beta / 2.0**P.beta_frac, "l1_bnn", eps=0.0)
    assert np.abs(xq - xf * 2**P.logit_frac).max() <= 1.0


def test_loss_grad_matches_float_squared_hinge():
    rng = np.random.default_rng(7)
    xq = rng.integers(-3 << 8, 3 << 8, size=(50, 10))
    labels = rng.integers(0, 10, size=50)
    p = A.ArithParams(loss="squared_hinge")
    g, loss, correct = A.loss_grad(xq, labels, p)
    lf, gf, cf = ops.squared_hinge(xq / 256.0, labels)
    assert correct == cf
    assert math.isclose(loss, lf, rel_tol=1e-12)
    assert np.allclose(g * 2.0 ** A.loss_grad_scale(p) / 50, gf, rtol=0, atol=1e-12)


def test_exp2_table_and_softmax_against_float():
    t = A.exp2_table(8, 16)
    assert t[0] == 1 << 16 and t[128] == round(math.sqrt(2) * 2**16) and t.max() < 1 << 17
    assert A.LOG2E_Q16 == round(math.log2(math.e) * 2**16)
    rng = np.random.default_rng(8)
    xq = rng.integers(-30 << 8, 30 << 8, size=(200, 10))
    pq = A.softmax_q(xq, P)
    z = xq / 256.0
    pf = np.exp(z - z.max(axis=1, keepdims=True))
    pf /= pf.sum(axis=1, keepdims=True)
    # t is floored to Q.8 (relative error < 2^(1/256) - 1 ~ 0.27 %) plus table / reciprocal rounding
    assert np.abs(pq / 2**16 - pf).max() < 1.5e-3
    assert (pq >= 0).all() and (np.abs(pq.sum(axis=1) - 2**16) <= 10).all()


def test_loss_grad_matches_float_cross_entropy():
    rng = np.random.default_rng(9)
    xq = rng.integers(-10 << 8, 10 << 8, size=(64, 10))
    labels = rng.integers(0, 10, size=64)
    g, loss, correct = A.loss_grad(xq, labels, P)
    lf, gf, cf = ops.softmax_cross_entropy(xq / 256.0, labels)
    assert correct == cf and math.isclose(loss, lf, rel_tol=1e-9)
    assert np.abs(g * 2.0 ** A.loss_grad_scale(P) / 64 - gf).max() < 1.5e-3 / 64


# ---------------------------------------------------------------------------
# BN backward + po2


def _backward_case(seed, M=40):
    y, beta = _bn_case(seed, M=M)
    f = A.bn_forward(y, beta, P, 256)
    rng = np.random.default_rng(seed + 100)
    dx = rng.integers(-(1 << 20), 1 << 20, size=y.shape) * f.mask
    return y, beta, f, dx


@pytest.mark.parametrize("const", [[3], [0, 7, 39], list(range(40))], ids=["one", "three", "whole_layer"])
def test_zero_scale_channels_pass_no_gradient_in_both_models(const):
    """Channels whose batch values are all equal: the integer model flags S = 0 and gives Q = 0 (zero po2 codes,
    so the layer's bias comes from the other channels); the float reference flags the same channels and gives
    dy = 0 there; dbeta is unchanged; both agree on the exponents of the rest. A whole constant layer has no
    nonzero code at all (bias 0)."""
    y, beta = _bn_case(5, M=40)
    y[:, const] = np.arange(len(const)) * 3 - 20  # constant over the batch
    f = A.bn_forward(y, beta, P, 256)
    assert np.flatnonzero(f.zero).tolist() == const
    rng = np.random.default_rng(11)
    dx = rng.integers(-(1 << 20), 1 << 20, size=y.shape) * f.mask
    q, p1 = A.bn_backward(dx, f.x_hat, f.alpha_q, P, f.zero)
    assert not q[:, const].any() and np.array_equal(p1, dx.sum(axis=0))
    codes = A.po2_quantise(q, f.S_eff, 0, P)
    assert not codes.field[:, const].any()
    _, cache = ops.bn_forward(y.astype(np.float64), beta / 2.0**P.beta_frac, "l1_bnn")
    assert np.array_equal(cache["const"], f.zero)
    cache = dict(cache, alpha=f.alpha_q.astype(np.float64) / 2**P.alpha_frac)
    dyf, dbf = ops.bn_backward(dx.astype(np.float64), cache, "l1_bnn")
    assert not dyf[:, const].any() and np.array_equal(p1, dbf.astype(np.int64))
    if len(const) == 40:
        assert codes.bias == 0 and not codes.field.any()
        return
    sgn, ef, bias_f, zf = ops.po2_encode(dyf, P.k)
    assert codes.bias == bias_f
    rest = ~zf & (ef >= P.e_min)
    rest[:, const] = False
    assert (codes.exponents(P)[rest] == ef[rest]).mean() > 0.99  # eps = 1e-5 in the float divisor only


def test_bn_backward_zero_flags_are_checked():
    y, beta = _bn_case(0, M=6)
    f = A.bn_forward(y, beta, P, 256)
    with pytest.raises(ValueError, match=r"zero has shape \(5,\); expected \(6,\)"):
        A.bn_backward(np.zeros_like(y), f.x_hat, f.alpha_q, P, np.zeros(5, bool))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bn_backward_po2_against_float(seed):
    y, beta, f, dx = _backward_case(seed)
    q, p1 = A.bn_backward(dx, f.x_hat, f.alpha_q, P)
    codes = A.po2_quantise(q, f.S_eff, 0, P)
    # float counterpart with the same (quantised) alpha, so only float rounding separates them
    _, cache = ops.bn_forward(y.astype(np.float64), beta / 2.0**P.beta_frac, "l1_bnn", eps=0.0)
    cache = dict(cache, alpha=f.alpha_q.astype(np.float64) / 2**P.alpha_frac, eps=0.0)
    dyf, dbf = ops.bn_backward(dx.astype(np.float64), cache, "l1_bnn")
    assert np.array_equal(p1, dbf.astype(np.int64))  # dbeta exact
    exact = q * y.shape[0] / (2.0**P.alpha_frac * f.S_eff.astype(np.float64))
    assert np.allclose(exact, dyf, rtol=1e-9, atol=1e-9 * np.abs(dyf).max())
    # po2 exponents: equal except near a rounding boundary (|log2|dy| - (n + 1/2)| tiny) and
    # where the float exponent is below the hardware's e_min (documented clamp difference)
    sgn, ef, bias_f, zf = ops.po2_encode(dyf, P.k)
    eh = codes.exponents(P)
    assert codes.bias == bias_f
    l2 = np.log2(np.abs(dyf) + 1e-300)
    near = np.abs(l2 - np.floor(l2) - 0.5) < 1e-9
    ok = ~zf & ~near & (ef >= P.e_min)
    assert np.array_equal(eh[ok], ef[ok].astype(np.int64))
    assert np.array_equal(codes.neg[~zf], sgn[~zf] < 0)
    assert ((codes.field == 0) == (q == 0)).all()
    clamp = ~zf & (ef < P.e_min)
    assert (eh[clamp] == P.e_min).all()


def test_po2_zero_and_all_zero_layer():
    q = np.zeros((4, 3), dtype=np.int64)
    c = A.po2_quantise(q, np.array([1, 2, 3], dtype=object), 0, P)
    assert (c.field == 0).all() and c.bias == 0 and (c.int_values() == 0).all()
    q[1, 2] = -5
    c = A.po2_quantise(q, np.array([1, 2, 3], dtype=object), 0, P)
    assert c.field[1, 2] == P.span + 1 and c.neg[1, 2] and (c.field.sum() == P.span + 1)


def test_po2_max_gets_top_code_and_scale_invariance():
    y, beta, f, dx = _backward_case(9)
    q, _ = A.bn_backward(dx, f.x_hat, f.alpha_q, P)
    c0 = A.po2_quantise(q, f.S_eff, 0, P)
    c5 = A.po2_quantise(q, f.S_eff, 5, P)
    assert c0.field.max() == (1 << (P.k - 1)) - 1
    assert np.array_equal(c0.field, c5.field) and c5.unit_exp == c0.unit_exp + 5


def _by_exponent_planes(codes, w, k):
    """dX computed as the hardware groups it: per exponent plane, a signed count, then one shift-add."""
    out = np.zeros((codes.field.shape[0], w.shape[0]), dtype=np.int64)
    s = np.where(codes.neg, -1, 1)
    for f in range(1, 1 << (k - 1)):
        plane = np.where(codes.field == f, s, 0)  # -1/0/+1 indicators of this exponent
        out += (plane @ w.T.astype(np.int64)) << (f - 1)
    return out


def test_po2_dx_dw_equal_exponent_plane_sums():
    y, beta, f, dx = _backward_case(11, M=24)
    q, _ = A.bn_backward(dx, f.x_hat, f.alpha_q, P)
    codes = A.po2_quantise(q, f.S_eff, 0, P)
    rng = np.random.default_rng(12)
    w = _rand_pm1(rng, (33, 24))
    dX, unit = A.po2_backward_dx(codes, w, P)
    assert unit == codes.unit_exp
    assert np.array_equal(dX, _by_exponent_planes(codes, w, P.k))
    x = _rand_pm1(rng, (y.shape[0], 33))
    dW = A.po2_backward_dw(x, codes, P)
    assert np.array_equal(dW, x.T.astype(np.int64) @ codes.int_values())
    # against float: dX = dY_po2 W^T with the decoded po2 values
    vals = A.po2_values(codes)
    assert np.allclose(np.ldexp(dX.astype(np.float64), unit), vals @ w.T.astype(np.float64), rtol=0, atol=0)


def test_windowed_ternary_codes_by_column():
    """dw_window_ternary: per column, the codes within `window` planes of the column's largest field count as their
    sign, everything else 0 (brute force per element); X^T t of po2_backward_dw_window is exact."""
    rng = np.random.default_rng(5)
    B, M = 37, 11
    field = rng.integers(0, 16, size=(B, M)).astype(np.uint8)
    field[:, 3] = 0  # a column without gradient
    field[:, 4] = np.where(rng.random(B) < 0.5, 0, 2)  # a column of small codes only
    neg = rng.random((B, M)) < 0.5
    codes = A.Po2Codes(neg=neg, field=field, bias=0, unit_exp=0)
    x = _rand_pm1(rng, (B, 23))
    for window in (1, 2, 4, 15, 40):
        t = A.dw_window_ternary(codes, window)
        for b in range(B):
            for j in range(M):
                top = int(field[:, j].max())
                f = int(field[b, j])
                want = 0 if f == 0 or f <= top - window else (-1 if neg[b, j] else 1)
                assert t[b, j] == want, (window, b, j)
        assert not t[:, 3].any() and np.array_equal(np.abs(t[:, 4]), (field[:, 4] > 0).astype(np.int64))
        assert np.array_equal(A.po2_backward_dw_window(x, codes, window), x.T.astype(np.int64) @ t)
    # 15 planes (k = 5) or more: every nonzero code counts as its sign
    assert np.array_equal(A.dw_window_ternary(codes, 15), np.where(field > 0, np.where(neg, -1, 1), 0))
    with pytest.raises(ValueError, match="dw_window = 0"):
        A.dw_window_ternary(codes, 0)
