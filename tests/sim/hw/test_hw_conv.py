"""Conv layers and max pooling in the bit-exact model (docs/arithmetic.md 3.8, 5.5): the vectorised functions against
direct loop evaluations of the contract, worst-case widths, the whole step, the float reference, and learning."""

from fractions import Fraction

import numpy as np
import pytest

from sim.config import ConfigError, apply_overrides, config_from_dict
from sim.hw import arith as A
from sim.hw.engine import HwEngine
from sim.hw.model import HwModel, StateError, StepTrace, validate_state
from sim.hw.rng import RngBank
from sim.hw.widths import layer_bounds

P = A.ArithParams()


def _conv_cfg(layers=None, batch=8, shape=(1, 10, 10), classes=4, **over):
    layers = layers or [{"type": "conv", "channels": 6, "padding": "same"}, {"type": "maxpool"},
                        {"type": "conv", "channels": 8}, {"type": "maxpool"}, {"type": "dense", "units": 4}]
    d = {"name": "hw_conv", "model": {"input_shape": list(shape), "num_classes": classes, "layers": layers},
         "train": {"batch_size": batch, "epochs": 1}}
    cfg = config_from_dict(d)
    return apply_overrides(cfg, [f"{k}={v}" for k, v in over.items()]) if over else cfg


def _pad(k, padding):
    return (k - 1) // 2 if padding == "same" else 0


# --- direct loop evaluations of the contract (Python ints, no vectorisation) -----------------------------------


def _window_terms(x_shape, co, k, padding):
    """Every term of the convolution: ``(b, o, h, v, c, i, j, hh, vv)`` where output ``(b, o, h, v)``'s window
    reads input ``(b, c, hh, vv) = (b, c, h + i - pad, v + j - pad)`` with weight ``(o, c, i, j)``; padding
    positions are no term."""
    b_, ci, H, W = x_shape
    pad = _pad(k, padding)
    for b, o, h, v in np.ndindex(b_, co, H + 2 * pad - k + 1, W + 2 * pad - k + 1):
        for c, i, j in np.ndindex(ci, k, k):
            hh, vv = h + i - pad, v + j - pad
            if 0 <= hh < H and 0 <= vv < W:
                yield b, o, h, v, c, i, j, hh, vv


def loop_conv(x, w, padding):
    """``Y[b, o, h, v] = sum x[b, c, hh, vv] w[o, c, i, j]`` over the window's terms."""
    co, _, k, _ = w.shape
    pad = _pad(k, padding)
    y = np.zeros((x.shape[0], co, x.shape[2] + 2 * pad - k + 1, x.shape[3] + 2 * pad - k + 1), dtype=object)
    for b, o, h, v, c, i, j, hh, vv in _window_terms(x.shape, co, k, padding):
        y[b, o, h, v] += int(x[b, c, hh, vv]) * int(w[o, c, i, j])
    return y


def loop_dx(d, w, padding, hw):
    """The adjoint of :func:`loop_conv`: every output position scatters ``d w`` onto the inputs its window read."""
    co, ci, k, _ = w.shape
    out = np.zeros((d.shape[0], ci, *hw), dtype=object)
    for b, o, h, v, c, i, j, hh, vv in _window_terms((d.shape[0], ci, *hw), co, k, padding):
        out[b, c, hh, vv] += int(d[b, o, h, v]) * int(w[o, c, i, j])
    return out


def loop_dw(x, d, k, padding):
    """``dW[o, c, i, j] = sum x[b, c, hh, vv] d[b, o, h, v]`` over the batch and the positions."""
    co = d.shape[1]
    out = np.zeros((co, x.shape[1], k, k), dtype=object)
    for b, o, h, v, c, i, j, hh, vv in _window_terms(x.shape, co, k, padding):
        out[o, c, i, j] += int(x[b, c, hh, vv]) * int(d[b, o, h, v])
    return out


def loop_argmax(y, p):
    """Index ``i p + j`` of each window's first largest value, scanning rows top to bottom, left to right."""
    b_, c_, H, W = y.shape
    out = np.zeros((b_, c_, H // p, W // p), dtype=np.int64)
    for b in range(b_):
        for c in range(c_):
            for h in range(H // p):
                for v in range(W // p):
                    best, arg = None, 0
                    for r in range(p * p):
                        val = y[b, c, h * p + r // p, v * p + r % p]
                        if best is None or val > best:  # strictly greater: a tie keeps the earlier index
                            best, arg = val, r
                    out[b, c, h, v] = arg
    return out


def _rand_pm1(rng, shape):
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=shape)


def _codes(rng, shape, p=P, zero_frac=0.2):
    field = rng.integers(1, 1 << (p.k - 1), size=shape).astype(np.uint8)
    field[rng.random(shape) < zero_frac] = 0
    return A.Po2Codes(rng.random(shape) < 0.5, field, 0, p.e_min)


# --- components against the loops ---------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("x_max", [1, 128])
def test_conv_forward_against_loops(padding, x_max):
    rng = np.random.default_rng(1 + x_max)
    x = _rand_pm1(rng, (3, 2, 6, 5)) if x_max == 1 else rng.integers(-128, 128, size=(3, 2, 6, 5))
    w = _rand_pm1(rng, (4, 2, 3, 3))
    y = A.conv_xnor_popcount(x, w, padding, x_max)
    assert y.dtype == np.int64 and np.array_equal(y, loop_conv(x, w, padding))
    assert y.shape == ((3, 4, 4, 3) if padding == "valid" else (3, 4, 6, 5))


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_conv_dx_is_the_transposed_convolution(padding):
    rng = np.random.default_rng(2)
    w = _rand_pm1(rng, (3, 2, 3, 3))
    hw = (6, 5)
    out_hw = hw if padding == "same" else (4, 3)
    codes = _codes(rng, (2, 3, *out_hw))
    dx, unit = A.po2_backward_dx_conv(codes, w, padding, P)
    assert unit == codes.unit_exp
    assert np.array_equal(dx, loop_dx(codes.int_values(), w, padding, hw))
    # the adjoint identity <conv(x, w), d> = <x, dX> holds for any x
    x = rng.integers(-5, 6, size=(2, 2, *hw))
    assert int((A.conv_xnor_popcount(x, w, padding, 8) * codes.int_values()).sum()) == int((x * dx).sum())


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("x_max", [1, 128])
def test_conv_dw_is_the_correlation_over_batch_and_positions(padding, x_max):
    rng = np.random.default_rng(3)
    x = _rand_pm1(rng, (3, 2, 5, 6)) if x_max == 1 else rng.integers(-128, 128, size=(3, 2, 5, 6))
    out_hw = (5, 6) if padding == "same" else (3, 4)
    codes = _codes(rng, (3, 4, *out_hw))
    dw = A.po2_backward_dw_conv(x, codes, 3, padding, P, x_max)
    assert dw.shape == (4, 2, 3, 3) and np.array_equal(dw, loop_dw(x, codes.int_values(), 3, padding))
    # hw.dw_window: the same correlation of the ternary codes, whose window is set per channel over the batch
    # and the positions
    t = A.dw_window_ternary(codes, 2)
    f = codes.field.astype(np.int64)
    top = f.max(axis=(0, 2, 3))
    for o in range(4):
        keep = (f[:, o] > 0) & (f[:, o] > top[o] - 2)
        assert np.array_equal(t[:, o], np.where(keep, np.where(codes.neg[:, o], -1, 1), 0))
    dwt = A.po2_backward_dw_window_conv(x, codes, 2, 3, padding, P, x_max)
    assert np.array_equal(dwt, loop_dw(x, t, 3, padding))


def test_maxpool_first_maximum_and_routing():
    rng = np.random.default_rng(4)
    y = rng.integers(-2, 3, size=(2, 3, 7, 6))  # few values: many ties; 7 rows: the last one is dropped
    idx = A.maxpool_argmax(y, 2)
    assert idx.shape == (2, 3, 3, 3) and np.array_equal(idx, loop_argmax(y, 2))
    # an explicit tie: all four equal -> index 0; equal maxima at 1 and 3 -> 1
    t = np.array([[[[5, 5], [5, 5]]], [[[0, 7], [1, 7]]]])
    assert A.maxpool_argmax(t, 2).reshape(-1).tolist() == [0, 1]
    sel = A.maxpool_select(y, idx, 2)
    assert np.array_equal(sel, y[:, :, :6, :].reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)))
    d = rng.integers(-9, 10, size=idx.shape)
    back = A.maxpool_route(d, idx, y.shape, 2)
    want = np.zeros(y.shape, dtype=np.int64)
    for b, c, h, v in np.ndindex(*idx.shape):
        r = int(idx[b, c, h, v])
        want[b, c, 2 * h + r // 2, 2 * v + r % 2] = d[b, c, h, v]
    assert np.array_equal(back, want) and not back[:, :, 6, :].any()


def test_bn_over_the_batch_and_the_positions():
    rng = np.random.default_rng(5)
    y = rng.integers(-9, 10, size=(3, 4, 5, 5))
    beta = np.array([P.beta_lo, -(1 << P.beta_frac), 3 << (P.beta_frac - 2), 0])
    f = A.bn_forward(y, beta, P, 9)
    n = 3 * 25
    for c in range(4):
        vals = [int(v) for v in y[:, c].reshape(-1)]
        s = sum(vals)
        assert int(f.sum_y[c]) == s and int(f.S[c]) == sum(abs(n * v - s) for v in vals)
        # every element's sign and mask is that of x = (y - mu) / s + beta in exact rationals
        mu, sc = Fraction(s, n), Fraction(max(int(f.S[c]), 1), n * n)
        for b, h, v in np.ndindex(3, 5, 5):
            x = (int(y[b, c, h, v]) - mu) / sc + Fraction(int(beta[c]), 1 << P.beta_frac)
            assert f.x_hat[b, c, h, v] == (1 if x >= 0 else -1) and bool(f.mask[b, c, h, v]) == (abs(x) <= 1)
    assert f.n == n and f.x_hat.shape == y.shape
    # backward: Q_b = 2^Fa (n dx_b - P1) - alpha_q P2 x_hat_b over the n values of each channel
    dx = rng.integers(-50, 51, size=y.shape)
    q, p1 = A.bn_backward(dx, f.x_hat, f.alpha_q, P)
    for c in range(4):
        d = [int(v) for v in dx[:, c].reshape(-1)]
        xh = [int(v) for v in f.x_hat[:, c].reshape(-1)]
        s1, s2 = sum(d), sum(a * b for a, b in zip(d, xh, strict=True))
        assert int(p1[c]) == s1
        want = [((n * a - s1) << P.alpha_frac) - int(f.alpha_q[c]) * s2 * b for a, b in zip(d, xh, strict=True)]
        assert q[:, c].transpose(0, 1, 2).reshape(-1).tolist() == want
    # running statistics average over the n values: mu_b = round(sum_y 2^Fr / n)
    mu_r, _ = A.running_update(np.zeros(4, np.int64), np.zeros(4, np.int64), f, P)
    half = 1 << (P.running_shift - 1)
    assert mu_r.tolist() == [(int(A.div_round(int(v) << P.running_frac, n)) + half) >> P.running_shift
                             for v in f.sum_y]


def test_round_log2_ratio_with_a_folded_factor():
    rng = np.random.default_rng(6)
    for _ in range(30):
        mult = int(rng.integers(1, 1 << 17))
        num = rng.integers(1, 1 << int(rng.integers(2, 50)), size=(40, 3))
        dens = [int(rng.integers(1, 1 << int(rng.integers(1, 60)))) for _ in range(3)]
        got = A.round_log2_ratio(num, np.array(dens, dtype=object), mult=mult)
        for (r, c), e in np.ndenumerate(got):
            ratio = Fraction(int(num[r, c]) * mult, dens[c])
            # e = round(log2 ratio) <=> 2^(e - 1/2) < ratio < 2^(e + 1/2) <=> 2^(2e-1) < ratio^2 < 2^(2e+1)
            assert Fraction(2) ** (2 * int(e) - 1) < ratio**2 < Fraction(2) ** (2 * int(e) + 1)


def test_conv_po2_codes_equal_the_product_form():
    """A conv layer's po2 codes (operand |Q|, n in the thresholds) equal the dense form's (operand |Q| n)."""
    rng = np.random.default_rng(7)
    q = rng.integers(-(1 << 30), 1 << 30, size=(4, 5, 3, 3))
    q[0, 1] = 0
    s_eff = np.array([int(rng.integers(1, 1 << 40)) for _ in range(5)], dtype=object)
    conv = A.po2_quantise(q, s_eff, -3, P)
    rows = q.transpose(0, 2, 3, 1).reshape(-1, 5)
    dense = A.po2_quantise(rows, s_eff, -3, P)
    assert conv.bias == dense.bias
    assert np.array_equal(conv.field.transpose(0, 2, 3, 1).reshape(-1, 5), dense.field)
    assert np.array_equal(conv.neg.transpose(0, 2, 3, 1).reshape(-1, 5), dense.neg)


# --- worst-case widths ---------------------------------------------------------------------------------------------


def _fits(v, bits: int, signed: bool = True) -> bool:
    m = int(np.max(np.abs(np.asarray(v, dtype=object))))
    return (m.bit_length() + (1 if signed else 0)) <= bits


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_conv_worst_cases_reach_and_fit_the_derived_widths(padding):
    cfg = _conv_cfg([{"type": "conv", "channels": 4, "padding": padding}, {"type": "maxpool"},
                     {"type": "conv", "channels": 5, "padding": padding}, {"type": "dense", "units": 4}],
                    batch=4, shape=(2, 8, 8), **{"hw.input": "int8"})
    b0, b1, b2 = layer_bounds(cfg)
    s0, _, s1, _ = cfg.layer_shapes()
    top = (1 << (P.k - 1)) - 1
    # Y of the 8-bit first layer: every input -128, every weight +1 (the centre window has no padding)
    x = np.full((4, *s0.in_shape), -128)
    y = A.conv_xnor_popcount(x, np.ones(s0.weight_shape, np.int8), padding, 128)
    assert int(np.abs(y).max()) == b0.y and _fits(y, b0.widths()["y"])
    # dX of layer 1: every code at the top exponent, every weight +1: the most covered input reaches the bound
    codes = A.Po2Codes(np.zeros((4, *s1.out_shape), bool), np.full((4, *s1.out_shape), top, np.uint8), 0, P.e_min)
    dX, _ = A.po2_backward_dx_conv(codes, np.ones(s1.weight_shape, np.int8), padding, P)
    assert int(dX.max()) == b1.dX and _fits(dX, b1.widths()["dX"])
    # dW of layer 0 (8-bit input): every input -128 and every code at the top: the centre tap reaches the bound
    codes0 = A.Po2Codes(np.zeros((4, *s0.out_shape), bool), np.full((4, *s0.out_shape), top, np.uint8), 0, P.e_min)
    dW = A.po2_backward_dw_conv(x, codes0, 3, padding, P, 128)
    assert int(np.abs(dW).max()) == b0.dW and _fits(dW, b0.widths()["dW"])
    # BN forward of layer 0 at the extremes: half the values at +bound, half at -bound
    yw = np.full((4, 4, *s0.out_shape[1:]), b0.y)
    yw[:2] = -b0.y
    f = A.bn_forward(yw, np.array([P.beta_lo, P.beta_hi, 0, P.beta_lo]), P, b0.y)
    wd = b0.widths()
    assert int(f.S.max()) <= b0.S and _fits(f.sum_y, wd["sum_y"]) and _fits(f.C, wd["C"])
    assert _fits(f.theta, wd["theta"]) and _fits(f.alpha_q, wd["alpha_q"], signed=False)
    # BN backward of layer 0 with the largest dx from above, one value of each channel against all others
    dx = np.full(yw.shape, b0.dx)
    dx[0, :, 0, 0] = -b0.dx
    xh = np.ones(yw.shape, np.int8)
    xh[0, :, 0, 0] = -1
    q, p1 = A.bn_backward(dx, xh, np.full(4, b0.alpha_q), P)
    assert _fits(q, wd["Q"]) and _fits(p1, wd["P"]) and int(np.abs(q).max()) <= b0.Q
    assert _fits(np.abs(q), wd["po2_num"], signed=False)  # conv: the operand is |Q|
    A.po2_quantise(q, np.ones(4, dtype=object), 0, P)  # the model's exponent path takes the worst operand


def test_conv_widths_checked_by_the_model():
    """n = B H W makes a conv layer's sums wide: the bit-exact model refuses a configuration whose registers exceed
    hw.max_acc_bits, naming the register and the layer. The configuration itself still loads (float-only runs of
    conv presets at wide approx.dy_bits), and hw.check_widths = false lifts the check as for dense layers."""
    big = [{"type": "conv", "channels": 64, "padding": "same"}, {"type": "conv", "channels": 64, "padding": "same"},
           {"type": "dense", "units": 4}]
    cfg = _conv_cfg(big, batch=256, shape=(1, 56, 56), **{"approx.dy_bits": 6})
    with pytest.raises(ConfigError, match=r"BN backward value Q of weight layer 0 .* batch 802816"):
        HwModel(cfg)
    HwModel(apply_overrides(cfg, ["hw.check_widths=false"]))
    HwModel(apply_overrides(cfg, ["approx.dy_bits=5"]))


# --- the whole step ------------------------------------------------------------------------------------------------


def _batch(cfg, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *cfg.model.input_shape), dtype=np.uint8)
    return HwEngine(cfg).prepare_inputs(x), rng.integers(0, cfg.model.num_classes, size=n)


@pytest.mark.parametrize("window", [0, 2])
def test_conv_step_composes_the_components(window):
    """The model's step is the contract's functions in order: conv, BN over positions, pooling at the first
    maximum, po2, dX routed back through the argmax and masked, dW as the correlation."""
    cfg = _conv_cfg(**{"hw.input": "int8", "hw.dw_window": window})
    m = HwModel(cfg)
    x, labels = _batch(cfg, 8)
    w0 = [w.copy() for w in m.w]
    tr = m.train_step(x, labels, lr=1e-3)
    p = m.p
    s = cfg.weight_layers()
    x0 = x.reshape(8, *s[0].in_shape)
    y0 = A.conv_xnor_popcount(x0, w0[0], "same", 128)
    assert np.array_equal(y0, tr.y[0])
    f0 = tr.bn[0]
    idx0 = A.maxpool_argmax(y0, 2)
    assert np.array_equal(idx0, tr.pool_idx[0])
    x1 = A.maxpool_select(f0.x_hat, idx0, 2)
    assert np.array_equal(A.conv_xnor_popcount(x1, w0[1], "valid"), tr.y[1])
    # backward from layer 1's codes down to layer 0's dx, Q and codes
    codes1 = tr.codes[1]
    dX, scale = A.po2_backward_dx_conv(codes1, w0[1], "valid", p)
    dx0 = A.maxpool_route(dX * A.maxpool_select(f0.mask, idx0, 2), idx0, y0.shape, 2)
    q0, _ = A.bn_backward(dx0, f0.x_hat, f0.alpha_q, p, f0.zero)
    assert np.array_equal(q0, tr.q[2])
    c0 = A.po2_quantise(q0, f0.S_eff, scale, p)
    _check_first_layer_dw(tr, x0, c0, window, p)
    assert tr.dw_sign[2].shape == (6, 1, 3, 3)


def _check_first_layer_dw(tr, x0, c0, window, p):
    """Layer 0's codes in the trace are ``c0`` and its sgn(dW) the correlation of its input with them."""
    assert np.array_equal(c0.field, tr.codes[2].field) and c0.bias == tr.codes[2].bias
    if window:
        dw0 = A.po2_backward_dw_window_conv(x0, c0, window, 3, "same", p, 128)
    else:
        dw0 = A.po2_backward_dw_conv(x0, c0, 3, "same", p, 128)
    assert np.array_equal(np.sign(dw0), tr.dw_sign[2])


def _pool_first_layers():
    """_conv_cfg's default network with both maxpools pooling the conv's Y before its BN (``before_bn``)."""
    return [{"type": "conv", "channels": 6, "padding": "same"}, {"type": "maxpool", "before_bn": True},
            {"type": "conv", "channels": 8}, {"type": "maxpool", "before_bn": True}, {"type": "dense", "units": 4}]


@pytest.mark.parametrize("window", [0, 2])
def test_pool_before_bn_step_composes_the_components(window):
    """maxpool before_bn (conv -> maxpool -> BN -> sign, docs/arithmetic.md 3.9): BN runs over the pooled Y (the
    first largest Y of each window), its x_hat and mask are the next layer's input and mask, the po2 codes of the
    pooled dY go back to each window's first largest Y (route_codes) before dW and dX, and the dX reaching the
    layer below is only masked (the layer below routes its own codes)."""
    cfg = _conv_cfg(_pool_first_layers(), **{"hw.input": "int8", "hw.dw_window": window})
    m = HwModel(cfg)
    assert [b.tolist() for b in m.beta] == [[0] * 6, [0] * 8, [0] * 4]  # no pooled initial bias
    x, labels = _batch(cfg, 8)
    w0 = [w.copy() for w in m.w]
    tr = m.train_step(x, labels, lr=1e-3)
    p = m.p
    x0 = x.reshape(8, 1, 10, 10)
    y0 = A.conv_xnor_popcount(x0, w0[0], "same", 128)
    assert np.array_equal(y0, tr.y[0])
    idx0 = A.maxpool_argmax(y0, 2)
    assert np.array_equal(idx0, tr.pool_idx[0])
    f0 = A.bn_forward(A.maxpool_select(y0, idx0, 2), m.beta[0] * 0, p, m.bounds[0].y)
    assert np.array_equal(f0.x_hat, tr.bn[0].x_hat) and np.array_equal(f0.S, tr.bn[0].S)
    assert m.bounds[0].n == 8 * 25  # the BN widths count the pooled positions
    y1 = A.conv_xnor_popcount(f0.x_hat, w0[1], "valid")
    assert np.array_equal(y1, tr.y[1])
    f1 = tr.bn[1]
    assert f1.x_hat.shape == (8, 8, 1, 1)
    # layer 1's codes are its pooled codes routed to its windows' first maxima
    idx1 = A.maxpool_argmax(y1, 2)
    assert tr.codes[1].field.shape == y1.shape and not tr.codes[1].field[:, :, 2, :].any()
    assert np.array_equal(A.maxpool_select(tr.codes[1].field, idx1, 2) > 0, tr.q[1] != 0)
    dX, scale = A.po2_backward_dx_conv(tr.codes[1], w0[1], "valid", p)
    q0, _ = A.bn_backward(dX * f0.mask, f0.x_hat, f0.alpha_q, p, f0.zero)
    assert np.array_equal(q0, tr.q[2])
    _check_first_layer_dw(tr, x0, A.route_codes(A.po2_quantise(q0, f0.S_eff, scale, p), idx0, y0.shape, 2), window, p)


def test_conv_inference_pools_the_largest_sign():
    """Inference (running statistics): the pooled sign is the window's largest sign (= the sign at its first
    largest Y, the threshold being monotone), and the logits are the dense output layer's eval form."""
    cfg = _conv_cfg(**{"hw.input": "binary"})
    m = HwModel(cfg)
    for i in range(3):  # move the running statistics and the biases away from their initial values
        m.train_step(*_batch(cfg, 8, seed=i), lr=1e-2)
    x, _ = _batch(cfg, 8, seed=9)
    cur = x.reshape(8, 1, 10, 10)
    for j, pad in enumerate(("same", "valid")):
        y = A.conv_xnor_popcount(cur, m.w[j], pad)
        signs = A.bn_forward_eval(y, m.beta[j], m.mu_r[j], m.s_r[j], m.p, m.bounds[j].y)
        b, c, h, w = signs.shape
        cur = signs[:, :, : h // 2 * 2, : w // 2 * 2].reshape(b, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    y = A.xnor_popcount(cur.reshape(8, -1), m.w[2])
    want = A.output_logits_eval(y, m.beta[2], m.mu_r[2], m.s_r[2], m.p)
    assert np.array_equal(m.forward_eval(x), want)


def test_conv_random_numbers_follow_the_matrix_view():
    """A conv layer's generators serve the matrix [Ci k k, Co] (rows = window positions (c, i, j)), as a dense
    layer's (in, out): the initial weight [o, c, i, j] is the top bit of number [(c k + i) k + j, o]."""
    cfg = _conv_cfg()
    m = HwModel(cfg)
    bank = RngBank([(s.fan_in, s.out_channels) for s in cfg.weight_layers()], cfg.hw.rng_seed, cfg.hw.rng_block)
    u0 = bank.sweep()
    for w, u, s in zip(m.w, u0, cfg.weight_layers(), strict=True):
        want = np.where(u < np.uint32(1 << 31), 1, -1)
        if s.spec.type == "conv":
            co, ci, k, _ = s.weight_shape
            for o, c, i, j in np.ndindex(co, ci, k, k):
                assert w[o, c, i, j] == want[(c * k + i) * k + j, o]
        else:
            assert np.array_equal(w, want)


@pytest.mark.parametrize("opt", ["switch", "bop", "iir", "sgd"])
def test_conv_optimisers_deterministic_and_restorable(opt):
    cfg = _conv_cfg(**{"hw.optimizer": opt})

    def run(eng, steps, start=0):
        for i in range(start, steps):
            x, y = _batch(cfg, 8, seed=i)
            eng.train_step(x, y, lr=1e-3 * 0.5 ** (i // 2), progress=i / 4)
        return eng

    full = run(HwEngine(cfg), 4).state_dict()
    part = run(HwEngine(cfg), 2).state_dict()
    resumed = HwEngine(cfg)
    resumed.load_state_dict(part)
    again = run(resumed, 4, start=2).state_dict()
    for k in full:
        assert np.array_equal(full[k], again[k]), k
    assert full["w0"].shape == (6, 1, 3, 3) and full["w1"].shape == (8, 6, 3, 3) and full["w2"].shape == (8, 4)
    for key in full:
        if key[:-1] in ("acc", "m", "g", "latent"):
            assert full[key].shape == full["w" + key[-1]].shape
    assert full["beta1"].shape == (8,)
    state = {"switch": "acc", "bop": "m", "iir": "m", "sgd": "latent"}[opt]
    for j in (0, 1):  # the optimiser moved on both conv layers
        assert not np.array_equal(part[f"{state}{j}"], full[f"{state}{j}"])
    bad = dict(full, w1=np.ascontiguousarray(full["w1"].transpose(1, 0, 2, 3)))
    with pytest.raises(StateError, match=r"w1 has shape \(6, 8, 3, 3\)"):
        validate_state(cfg, bad)


@pytest.mark.parametrize("before_bn", [False, True])
def test_conv_sign_gradient_agrees_with_the_float_reference(before_bn):
    """Same weights and batch: the float reference's conv net (pooling the BN output before the sign, or with
    ``before_bn`` the conv's Y before its BN) and the bit-exact model agree on the logits and on almost every entry
    of sgn(dW) (they differ where alpha's rounding or the missing lowest po2 exponent moves a sum across 0,
    docs/arithmetic.md 5.2)."""
    from sim.reference.model import BNNModel

    cfg = _conv_cfg(_pool_first_layers() if before_bn else None, batch=16, shape=(1, 12, 12),
                    **{"model.input_format": "binary", "train.loss": "squared_hinge", "approx.bn_eps": 0,
                       "approx.storage": "float32"})
    hw = HwModel(cfg)
    ref = BNNModel(cfg, np.random.default_rng(0))
    x, y = _batch(cfg, 16, seed=3)
    wb = [w.astype(np.float32) for w in hw.w]
    out = ref.forward(x.astype(np.float32), train=True, wb=wb)
    tr = hw.train_step(x, y, lr=1e-3)
    assert np.abs(tr.logits_q / 2**hw.p.logit_frac - out.logits).max() <= 2.0 / 2**hw.p.logit_frac
    _, dlog, _ = ref.loss(out.logits, y)
    grads, _ = ref.backward(dlog, out.saved, wb)
    same = [int(np.count_nonzero(np.sign(g) == s)) for g, s in zip(grads, tr.dw_sign[::-1], strict=True)]
    agree = [k / g.size for k, g in zip(same, grads, strict=True)]
    # the conv layers (54 and 432 weights) and all weights together; the dense layer has only 128
    assert min(agree[:2]) > 0.97 and sum(same) / sum(g.size for g in grads) > 0.97, agree


def test_small_mnist_conv_net_learns():
    """Ten steps of the bit-exact model (switch optimiser, cut-off 8 so that weights move within a few steps) on a
    small conv net for the vendored MNIST lower the loss on 500 other training images below that of the same run
    with frozen weights (cut-off 32767: only the BN biases and running statistics learn). Measured: 2.34 (173 of
    500 right) against 3.28 (64 right); with the preset's cut-off 63 no weight flips in 20 steps."""
    from sim.datasets import load_dataset

    data = load_dataset("mnist").take(train_limit=1000)
    res = []
    for cutoff in (8, 32767):
        cfg = _conv_cfg([{"type": "conv", "channels": 8, "padding": "same"}, {"type": "maxpool"},
                         {"type": "conv", "channels": 16}, {"type": "maxpool"}, {"type": "dense", "units": 10}],
                        batch=25, shape=(1, 28, 28), classes=10, **{"hw.input": "binary", "hw.switch_cutoff": cutoff})
        eng = HwEngine(cfg)
        xs = eng.prepare_inputs(data.x_train)
        flips = sum(eng.train_step(xs[i * 25:(i + 1) * 25], data.y_train[i * 25:(i + 1) * 25], lr=1e-3,
                                   progress=0.0).flips
                    for i in range(10))
        res.append((*eng.evaluate(xs[500:], data.y_train[500:]), flips))
    (loss, correct, flips), (loss0, correct0, flips0) = res
    assert flips > 0 and flips0 == 0
    assert loss < 0.85 * loss0 and correct > correct0 + 40, res


def test_conv_memory_report_counts_positions_and_pooling():
    from sim.hw.memory import memory_report

    B = 2048  # (the report rounds to 0.01 KiB)
    cfg = _conv_cfg(batch=B, **{"hw.input": "binary"})  # 1x10x10 -> 6x10x10 -> pool 6x5x5 -> 8x3x3 -> pool 8x1x1
    r = memory_report(cfg)
    kib = {k.split(" (")[0]: v * 8 * 1024 for k, v in r["buffers"].items()}
    assert kib["retained inputs X_hat"] == pytest.approx(B * (100 + 150 + 8), rel=1e-3)
    assert kib["straight-through masks"] == pytest.approx(B * (150 + 8), rel=1e-3)
    assert kib["signs before pooling"] == pytest.approx(B * (600 + 72), rel=1e-3)
    assert kib["max-pool window indices"] == pytest.approx(B * (150 + 8) * 2, rel=1e-3)
    assert r["n_weights"] == 6 * 9 + 8 * 6 * 9 + 8 * 4


def test_pool_before_bn_memory_keeps_pooled_values_only():
    """With maxpool before_bn a pooled conv layer keeps no signs before the pooling, and its Y and dY codes are the
    pooled ones (the conv output streams through the pooling)."""
    from sim.hw.memory import memory_report

    B = 2048
    cfg = _conv_cfg(_pool_first_layers(), batch=B, **{"hw.input": "binary"})
    r = memory_report(cfg)
    kib = {k.split(" (")[0]: v * 8 * 1024 for k, v in r["buffers"].items()}
    assert "signs before pooling" not in kib
    assert kib["max-pool window indices"] == pytest.approx(B * (150 + 8) * 2, rel=1e-3)
    assert kib["dY po2 codes + exponent scratch"] == pytest.approx(B * 150 * (cfg.approx.dy_bits + 2), rel=1e-3)
    old = memory_report(_conv_cfg(batch=B, **{"hw.input": "binary"}))
    assert r["buffers_kib"] < old["buffers_kib"]


def test_pooled_layers_start_with_half_the_pooled_signs_positive():
    """A BN layer max-pooled before the sign starts with beta = pooled_bn_beta(p) in both models (the other layers
    at 0), which makes about half of the first step's pooled signs +1; with beta = 0 it would be 1 - 2^-4 of
    them (docs/arithmetic.md 3.9)."""
    from sim.reference.model import BNNModel
    from sim.reference.ops import pooled_bn_beta

    assert pooled_bn_beta(1) == 0.0
    assert pooled_bn_beta(2) == pytest.approx(-1.2510, abs=1e-4)  # -Phi^-1(2^-1/4) sqrt(pi/2)
    assert pooled_bn_beta(2, "l2") == pytest.approx(-0.9981, abs=1e-4)
    cfg = _conv_cfg(batch=16, shape=(1, 12, 12), **{"hw.input": "binary"})
    m, r = HwModel(cfg), BNNModel(cfg)
    q = round(pooled_bn_beta(2) * (1 << P.beta_frac))
    assert [b.tolist() for b in m.beta] == [[q] * 6, [q] * 8, [0] * 4]
    for bh, bf in zip(m.beta, r.beta, strict=True):
        np.testing.assert_allclose(bf, bh / (1 << P.beta_frac), atol=2e-3)  # float16 storage
    x = np.random.default_rng(3).choice(np.array([-1, 1], dtype=np.int8), size=(16, 144))
    frac = []
    for beta0 in (None, 0):
        if beta0 is not None:
            m.beta[0][:] = beta0
        saved, _ = m.forward_train(x, StepTrace())
        fwd, idx = saved[0][1], saved[0][3]
        frac.append(float((A.maxpool_select(fwd.x_hat, idx, 2) > 0).mean()))
    assert 0.35 < frac[0] < 0.65 and frac[1] > 0.85, frac


def test_cnn_mnist_preset_fits_the_xc7z020_on_chip():
    """configs/cnn_mnist.toml: activations, weights and optimiser state within the xc7z020's 140 BRAM36 by the
    memory model (485 KiB, at least 108 BRAM36, the max pools before BN); B = 36 would not fit."""
    from pathlib import Path

    from sim.config import load_config
    from sim.hw.memory import memory_report

    path = Path(__file__).resolve().parents[3] / "configs" / "cnn_mnist.toml"
    cfg = load_config(str(path))
    HwModel(cfg)  # the widths of the whole step are checked when the model is built
    r = memory_report(cfg)
    assert r["fits"] and r["bram36_lower_bound"] <= 140, r["bram36_lower_bound"]
    assert r["n_weights"] == 212_112 and r["total_kib"] == pytest.approx(484.53, abs=0.01)
    assert r["bram36_lower_bound"] == 108
    assert not memory_report(apply_overrides(cfg, ["train.batch_size=36"]))["fits"]
