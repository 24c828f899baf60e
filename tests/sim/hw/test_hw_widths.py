"""Derived widths: worst-case inputs never overflow them, and overflowing configurations are rejected."""

import numpy as np
import pytest

from sim.config import ConfigError, apply_overrides, load_config
from sim.hw import arith as A
from sim.hw.widths import check_widths, derive_widths, layer_bounds, signed_bits


def _fits(v, bits: int, signed: bool = True) -> bool:
    m = int(np.max(np.abs(np.asarray(v, dtype=object))))
    return (m.bit_length() + (1 if signed else 0)) <= bits


@pytest.fixture(scope="module")
def cfg():
    # the contract's widths table (docs/arithmetic.md) is for the 8-bit first-layer input, the widest case
    return apply_overrides(load_config("mlp"), ["hw.input=int8"])


def test_mlp_widths_documented(cfg):
    w = derive_widths(cfg)
    assert len(w) == 5
    # docs/arithmetic.md, "Widths for the paper's MLP"
    assert [x["y"] for x in w] == [18, 10, 10, 10, 10]
    assert [x["dX"] for x in w[1:]] == [24, 24, 24, 19]
    assert w[0]["dW"] == 29 and w[1]["dW"] == 22
    assert max(x["po2_num"] for x in w) == 49
    check_widths(cfg)


def test_worst_case_forward_within_widths(cfg):
    p = A.ArithParams.from_config(cfg)
    b0 = layer_bounds(cfg)[0]
    wd = b0.widths()
    B = cfg.train.batch_size
    x = np.full((B, 784), -128, dtype=np.int16)
    x[: B // 2] = 127
    w = np.ones((784, 4), dtype=np.int8)
    y = A.xnor_popcount(x, w, 128)
    assert _fits(y, wd["y"]) and _fits(y.sum(0), wd["sum_y"])
    beta = np.array([p.beta_lo, p.beta_hi, 0, p.beta_lo])
    f = A.bn_forward(y, beta, p, b0.y)
    assert _fits(f.S, wd["S"], signed=False) and _fits(f.alpha_q, wd["alpha_q"], signed=False)
    assert _fits(f.C, wd["C"]) and _fits(f.theta, wd["theta"])
    assert int(f.S.max()) <= b0.S


def test_worst_case_backward_within_widths(cfg):
    p = A.ArithParams.from_config(cfg)
    bounds = layer_bounds(cfg)
    B = cfg.train.batch_size
    # dX: every code at the top exponent, every weight aligned with its sign
    codes = A.Po2Codes(np.zeros((B, 256), bool), np.full((B, 256), (1 << (p.k - 1)) - 1, np.uint8), 0, p.e_min)
    w = np.ones((256, 256), dtype=np.int8)
    dX, _ = A.po2_backward_dx(codes, w, p)
    assert int(dX.max()) == bounds[1].dX and _fits(dX, bounds[1].widths()["dX"])
    xin = np.full((B, 784), -128, dtype=np.int16)
    dW = A.po2_backward_dw(xin, codes, p, 128)
    assert int(np.abs(dW).max()) == bounds[0].dW and _fits(dW, bounds[0].widths()["dW"])
    # BN backward of layer 1 with the worst dx from above: alternate signs maximise |B dx - P1|
    dx = np.full((B, 8), bounds[1].dx, dtype=np.int64)
    dx[0] = -bounds[1].dx
    x_hat = np.ones((B, 8), dtype=np.int8)
    x_hat[0] = -1
    alpha = np.full(8, bounds[1].alpha_q)
    q, p1 = A.bn_backward(dx, x_hat, alpha, p)
    wd = bounds[1].widths()
    assert _fits(q, wd["Q"]) and _fits(p1, wd["P"]) and _fits(np.abs(q) * B, wd["po2_num"], signed=False)
    assert int(np.abs(q).max()) <= bounds[1].Q


def test_random_training_values_within_bounds(cfg):
    from sim.hw.model import HwModel

    small = apply_overrides(cfg, ["train.batch_size=16"])
    m = HwModel(small)
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, size=(16, 784)).astype(np.int16)
    labels = rng.integers(0, 10, size=16)
    tr = m.train_step(x, labels, lr=1e-3)
    for j, b in enumerate(m.bounds):
        assert np.abs(tr.y[j]).max() <= b.y
        assert int(tr.bn[j].S.max()) <= b.S
    for q, b in zip(tr.q, reversed(m.bounds), strict=True):
        assert np.abs(q).max() <= b.Q


def test_overflowing_configuration_rejected_at_load(cfg):
    with pytest.raises(ConfigError, match=r"hw\.max_acc_bits = 62"):
        apply_overrides(cfg, ["approx.dy_bits=8"])
    with pytest.raises(ConfigError, match=r"po2 leading-one operand .* needs 65 bits"):
        apply_overrides(cfg, ["approx.dy_bits=6"])
    with pytest.raises(ConfigError, match=r"BN input gradient dx .* needs 72 bits"):
        apply_overrides(cfg, ["approx.dy_bits=7"])
    with pytest.raises(ConfigError, match="max_acc_bits = 40"):
        apply_overrides(cfg, ["hw.max_acc_bits=40"])
    ok = apply_overrides(cfg, ["approx.dy_bits=8", "hw.check_widths=false"])
    assert ok.approx.dy_bits == 8
    assert signed_bits(1) == 2


@pytest.mark.parametrize(
    "override, field",
    [
        ("hw.optimizer=adam", "hw.optimizer"),
        ("hw.switch_cutoff=0", "hw.switch_cutoff"),
        ("hw.beta_frac_bits=40", "hw.beta_frac_bits"),
        ("hw.switch_lambda=0", "hw.switch_lambda"),
        ("hw.input=float", "hw.input"),
    ],
)
def test_invalid_hw_fields_named(cfg, override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        apply_overrides(cfg, [override])


def test_presets_still_load():
    for name in ("mlp", "cnv", "binarynet"):
        load_config(name)
