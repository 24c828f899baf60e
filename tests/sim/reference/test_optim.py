"""Weight and parameter optimisers of the float reference (sim/reference/optim.py).

Expected numbers are worked out in the tests themselves (plain Python floats),
not by calling the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.reference.optim import make_param_optimizer, make_weight_optimizer
from sim.reference.storage import to_storage

_BASE = load_config("mlp")  # lr.initial = 0.001


def cfg(*overrides):
    return apply_overrides(_BASE, list(overrides))


def opt_with(c, shapes, seed=0, **state):
    """An optimiser of ``c`` whose state arrays are replaced by ``state`` (one array per layer)."""
    o = make_weight_optimizer(c, shapes, np.random.default_rng(seed))
    o.load_state_arrays({k: [np.asarray(a) for a in v] for k, v in state.items()})
    return o


# ---------------------------------------------------------------------------
# Latent-weight optimisers


def test_adam_one_and_two_steps_by_hand():
    c = cfg("optimizer.name=adam", "approx.storage=float32")
    o = opt_with(c, [(1, 3)], latent=[[[0.1, -0.2, 0.3]]])
    assert not o.latent_free
    lr = 0.01
    # Step 1: m = 0.1 g, v = 0.001 g^2; bias correction divides by 0.1 and 0.001, so the step is
    # lr * g / (|g| + eps) = lr * sign(g) up to eps.
    flips = o.step([np.array([[0.5, -1.0, 2.0]])], lr=lr, progress=0.0)
    assert flips == [0]
    np.testing.assert_allclose(o.state_arrays()["latent"][0][0], [0.09, -0.19, 0.29], rtol=1e-6)
    np.testing.assert_allclose(o.state_arrays()["m"][0][0], [0.05, -0.1, 0.2], rtol=1e-6)
    np.testing.assert_allclose(o.state_arrays()["v"][0][0], [0.00025, 0.001, 0.004], rtol=1e-6)
    # Step 2 with g = (-0.25, 0.5, 1): element 0 worked out:
    # m = 0.9*0.05 - 0.1*0.25 = 0.02, v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225,
    # m_hat = 0.02/0.19, v_hat = 0.00031225/0.001999, w = 0.09 - 0.01 * m_hat / sqrt(v_hat).
    o.step([np.array([[-0.25, 0.5, 1.0]])], lr=lr, progress=0.0)
    m2 = [0.9 * 0.05 + 0.1 * -0.25, 0.9 * -0.1 + 0.1 * 0.5, 0.9 * 0.2 + 0.1 * 1.0]
    v2 = [0.999 * 0.00025 + 0.001 * 0.0625, 0.999 * 0.001 + 0.001 * 0.25, 0.999 * 0.004 + 0.001 * 1.0]
    w1 = [0.09, -0.19, 0.29]
    w2 = [w - lr * (m / 0.19) / (math.sqrt(v / (1 - 0.999**2)) + 1e-8) for w, m, v in zip(w1, m2, v2, strict=True)]
    assert w2[0] == pytest.approx(0.0873366, abs=1e-7)
    assert w2[2] == pytest.approx(0.2806782, abs=1e-7)
    np.testing.assert_allclose(o.state_arrays()["latent"][0][0], w2, rtol=1e-6)
    np.testing.assert_allclose(o.state_arrays()["m"][0][0], m2, rtol=1e-6)


def test_adam_clips_latent_weights():
    c = cfg("optimizer.name=adam", "approx.storage=float32", "optimizer.clip=0.5")
    o = opt_with(c, [(1, 2)], latent=[[[0.49, -0.49]]])
    o.step([np.array([[-1.0, 1.0]])], lr=0.1, progress=0.0)
    np.testing.assert_array_equal(o.state_arrays()["latent"][0], [[0.5, -0.5]])


def test_sgdm_two_steps_by_hand():
    c = cfg("optimizer.name=sgdm", "approx.storage=float32", "optimizer.sgdm.momentum=0.9",
            "optimizer.sgdm.weight_decay=0.1")
    o = opt_with(c, [(1, 3)], latent=[[[0.5, -0.5, 0.05]]])
    # buf = g; w <- w - 0.1 (buf + 0.1 w)
    flips = o.step([np.array([[1.0, 2.0, 1.0]])], lr=0.1, progress=0.0)
    w1 = [0.5 - 0.1 * (1.0 + 0.05), -0.5 - 0.1 * (2.0 - 0.05), 0.05 - 0.1 * (1.0 + 0.005)]  # .395 -.695 -.0505
    np.testing.assert_allclose(o.state_arrays()["latent"][0][0], w1, rtol=1e-6)
    assert flips == [1]  # the third weight went from + to -
    # buf = 0.9 g1 + g2 = (0.9, 0.8, 0.9 - 1); w <- w - 0.1 (buf + 0.1 w)
    o.step([np.array([[0.0, -1.0, -1.0]])], lr=0.1, progress=0.0)
    buf = [0.9, 0.8, -0.1]
    w2 = [w - 0.1 * (b + 0.1 * w) for w, b in zip(w1, buf, strict=True)]
    np.testing.assert_allclose(w2, [0.30105, -0.76805, -0.039995], rtol=1e-9)
    np.testing.assert_allclose(o.state_arrays()["latent"][0][0], w2, rtol=1e-6)
    np.testing.assert_allclose(o.state_arrays()["momentum"][0][0], buf, rtol=1e-6)


def test_glorot_uniform_init_bounds():
    c = cfg("optimizer.name=adam", "approx.storage=float32")
    o = make_weight_optimizer(c, [(300, 100), (16, 8, 3, 3)], np.random.default_rng(1))
    dense, conv = o.state_arrays()["latent"]
    lim_dense = math.sqrt(6 / (300 + 100))
    lim_conv = math.sqrt(6 / (8 * 9 + 16 * 9))
    assert np.abs(dense).max() <= lim_dense and np.abs(dense).max() > 0.95 * lim_dense
    assert np.abs(conv).max() <= lim_conv and np.abs(conv).max() > 0.95 * lim_conv
    assert abs(dense.mean()) < 0.01
    bw = o.binary_weights()
    assert bw[0].dtype == np.float32 and set(np.unique(bw[0])) == {-1.0, 1.0}


# ---------------------------------------------------------------------------
# Bop


def test_bop_flips_where_ema_exceeds_tau_and_agrees():
    c = cfg("optimizer.name=bop", "approx.storage=float32", "optimizer.bop.gamma=0.5", "optimizer.bop.tau=0.1")
    w0 = [1, 1, 1, -1, -1, -1]
    o = opt_with(c, [(1, 6)], weights=[[w0]], m=[[[0.0, 0.4, -0.4, 0.3, -0.05, 0.2]]])
    assert o.latent_free
    g = np.array([[0.3, 0.0, -0.2, 0.3, -0.1, -0.6]])
    flips = o.step([g], lr=c.lr, progress=0.0)
    # m = 0.5 m + 0.5 g = (0.15, 0.2, -0.3, 0.3, -0.075, -0.2)
    # |m| > 0.1:          T     T     T     T     F       T
    # sign(m) == sign(w): T     T     F     F     T       T   -> flip 0, 1, 5
    np.testing.assert_allclose(o.state_arrays()["m"][0][0], [0.15, 0.2, -0.3, 0.3, -0.075, -0.2], rtol=1e-6)
    np.testing.assert_array_equal(o.binary_weights()[0][0], [-1, -1, 1, -1, -1, 1])
    assert flips == [3]


def test_bop_gamma_follows_lr_schedule():
    c = cfg("optimizer.name=bop", "approx.storage=float32", "optimizer.bop.gamma=0.5")
    o = opt_with(c, [(1, 1)], m=[[[0.0]]])
    o.step([np.array([[1.0]])], lr=c.lr / 2, progress=0.0)  # gamma 0.25
    assert o.state_arrays()["m"][0][0, 0] == pytest.approx(0.25)


# ---------------------------------------------------------------------------
# IIR filter (Quist)


def _sgd_and_iir(decay, lr0=0.2, wd=0.05, mu=0.8, shapes=((20, 30), (30, 5)), seed=3):
    # Mapping: alpha = lr0 * weight_decay, gamma = 1 - momentum, and the SGD learning rate is
    # lr0 * beta_i where beta_i is the filter's alpha-decay multiplier.
    common = ["approx.storage=float32", f"train.lr.initial={lr0}", "optimizer.clip=1e30"]
    c_sgd = cfg("optimizer.name=sgdm", f"optimizer.sgdm.momentum={mu}", f"optimizer.sgdm.weight_decay={wd}", *common)
    c_iir = cfg("optimizer.name=iir", f"optimizer.iir.alpha={lr0 * wd}", f"optimizer.iir.gamma={1 - mu}",
                f"optimizer.iir.alpha_decay={decay}", *common)
    iir = make_weight_optimizer(c_iir, list(shapes), np.random.default_rng(seed))
    sgd = make_weight_optimizer(c_sgd, list(shapes), np.random.default_rng(seed + 1))
    sgd.zero_init(iir.state_arrays()["init_sign"])
    return sgd, iir


def test_iir_init_random_sign_and_zero_state():
    _, iir = _sgd_and_iir("none", shapes=((100, 100),))
    st = iir.state_arrays()
    assert not st["m"][0].any() and not st["y"][0].any()
    w = iir.binary_weights()[0]
    np.testing.assert_array_equal(w, st["init_sign"][0])
    assert 0.45 < (w > 0).mean() < 0.55


@pytest.mark.parametrize("decay", ["cosine", "none"])
def test_sgd_with_weight_decay_and_momentum_equals_iir_filter(decay):
    lr0, wd, mu, steps = 0.2, 0.05, 0.8, 300
    sgd, iir = _sgd_and_iir(decay, lr0, wd, mu)
    np.testing.assert_array_equal(sgd.binary_weights()[0], iir.binary_weights()[0])
    rng = np.random.default_rng(7)
    total_flips = 0
    for t in range(steps):
        progress = t / steps
        beta = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1.0
        # A per-weight bias makes some weights drift and flip; the noise makes others oscillate.
        grads = [rng.normal(0.3 * math.sin(t / 20), 1.0, s).astype(np.float32) for s in sgd.shapes]
        f_sgd = sgd.step(grads, lr=lr0 * beta, progress=progress)
        f_iir = iir.step(grads, lr=123.0, progress=progress)  # iir ignores lr
        total_flips += sum(f_iir)
        for ws, wi, y, w in zip(sgd.binary_weights(), iir.binary_weights(), iir.state_arrays()["y"],
                                sgd.state_arrays()["latent"], strict=True):
            # The latent weight is the filter output rescaled: w = -y / (weight_decay * (1 - momentum)).
            scale = np.abs(w).max()
            np.testing.assert_allclose(w, -y / (wd * (1 - mu)), rtol=1e-4, atol=1e-5 * scale)
            # Same binary weights wherever the output is not within float rounding of 0.
            clear = np.abs(w) > 1e-5 * scale
            np.testing.assert_array_equal(ws[clear], wi[clear])
            assert (~clear).sum() <= 2
        assert abs(sum(f_sgd) - sum(f_iir)) <= 2
    assert total_flips > 100


def test_iir_matches_second_order_difference_equation():
    # Eq 18 with constant beta = 1: y_i = a g g_i - (a + g - 2) y_{i-1} - (a - 1)(g - 1) y_{i-2}
    a, gm = 0.05, 0.3
    c = cfg("optimizer.name=iir", "approx.storage=float32", f"optimizer.iir.alpha={a}", f"optimizer.iir.gamma={gm}",
            "optimizer.iir.alpha_decay=none")
    o = make_weight_optimizer(c, [(1, 4)], np.random.default_rng(0))
    xs = np.random.default_rng(1).normal(size=(50, 4))
    y1 = y2 = np.zeros(4)
    for x in xs:
        o.step([x[None, :].astype(np.float32)], lr=1.0, progress=0.0)
        y = a * gm * x.astype(np.float32) - (a + gm - 2) * y1 - (a - 1) * (gm - 1) * y2
        y1, y2 = y, y1
        np.testing.assert_allclose(o.state_arrays()["y"][0][0], y, rtol=1e-4, atol=1e-6)
        nz = y != 0
        np.testing.assert_array_equal(o.binary_weights()[0][0][nz], -np.sign(y[nz]))


def test_iir_alpha_decay_schedules():
    def beta(decay, p):
        c = cfg("optimizer.name=iir", f"optimizer.iir.alpha_decay={decay}", "train.epochs=50",
                "optimizer.iir.decay_every=10", "optimizer.iir.decay_factor=0.1")
        return make_weight_optimizer(c, [(1, 1)], np.random.default_rng(0)).beta(p)

    assert beta("none", 0.7) == 1.0
    assert beta("cosine", 0.0) == pytest.approx(1.0) and beta("cosine", 0.5) == pytest.approx(0.5)
    assert beta("cosine", 1.0) == pytest.approx(0.0, abs=1e-12)
    assert beta("linear", 0.25) == pytest.approx(0.75)
    # step: epoch = 50 p; x0.1 every 10 epochs
    assert beta("step", 0.19) == 1.0
    assert beta("step", 10 / 50) == pytest.approx(0.1)
    assert beta("step", 0.45) == pytest.approx(0.01)


# ---------------------------------------------------------------------------
# Switching family (Akesson)


def test_switch_deterministic_selects_above_sigma_times_max():
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=deterministic", "optimizer.switch.sigma=0.75")
    w = np.array([[1, -1, 1, -1], [1, 1, -1, 1]], np.int8)
    p = np.array([[0.5, 1.0, 0.625, 0.75], [-2.0, 0.0, 0.875, 0.25]])  # wanted W * g
    o = opt_with(c, [(2, 4)], weights=[w])
    flips = o.step([p * w], lr=c.lr, progress=0.0)
    # max p = 1; p >= 0.75 and p > 0 -> (0,1), (0,3), (1,2); the large negative -2 is not eligible.
    expect = w.copy()
    for i, j in [(0, 1), (0, 3), (1, 2)]:
        expect[i, j] = -expect[i, j]
    np.testing.assert_array_equal(o.binary_weights()[0], expect)
    assert flips == [3]
    # No positive W * g: nothing switches.
    w2 = o.state_arrays()["weights"][0]
    assert o.step([-0.1 * w2.astype(np.float32)], lr=c.lr, progress=0.0) == [0]


def test_switch_stochastic_probability_statistics():
    sigma, lam = 0.5, 0.4
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=stochastic", f"optimizer.switch.sigma={sigma}",
            f"optimizer.switch.lam={lam}")
    n = 20000
    # p = W * g in buckets; max p = 4, so normalised values q = p / 4 are 1, .75, .6, .5, .25, -.25.
    qs = [1.0, 0.75, 0.6, 0.5, 0.25, -0.25]
    rng = np.random.default_rng(5)
    w = np.where(rng.random((len(qs), n)) < 0.5, -1, 1).astype(np.int8)
    g = (4.0 * np.array(qs)[:, None] * w).astype(np.float32)
    for lr_scale in (1.0, 0.5):
        o = opt_with(c, [(len(qs), n)], seed=11, weights=[w])
        o.step([g], lr=c.lr * lr_scale, progress=0.0)
        flipped = (o.binary_weights()[0] != w).mean(axis=1)
        for q, frac in zip(qs, flipped, strict=True):
            # Reading of Algorithm 2: prob = lam (q - sigma) / (1 - sigma) on q = p / max p, clipped to [0, 1].
            prob = max(0.0, lam * lr_scale * (q - sigma) / (1 - sigma))
            if prob == 0.0:
                assert frac == 0.0
            else:
                assert abs(frac - prob) < 5 * math.sqrt(prob * (1 - prob) / n), (q, frac, prob)
    # The expected flip fractions: q=1 -> 0.4, q=.75 -> 0.2, q=.6 -> 0.08 (at lr0).
    assert lam * (0.75 - sigma) / (1 - sigma) == pytest.approx(0.2)


def test_switch_momentum_state():
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=momentum", "optimizer.switch.momentum=0.95",
            "approx.storage=float32")
    o = make_weight_optimizer(c, [(1, 2)], np.random.default_rng(0))
    o.step([np.array([[1.0, -2.0]])], lr=c.lr, progress=0.0)
    o.step([np.array([[1.0, 0.0]])], lr=c.lr, progress=0.0)
    # m = 0.05 g1 -> (0.05, -0.1); then 0.95 m + 0.05 g2 -> (0.0975, -0.095)
    np.testing.assert_allclose(o.state_arrays()["momentum"][0][0], [0.0975, -0.095], rtol=1e-6)


def test_switch_accumulate_saturates_at_cutoff():
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=accumulate", "optimizer.switch.acc_cutoff=3",
            "optimizer.switch.sigma=0.0", "optimizer.switch.lam=1.0")
    w = np.array([[1, 1, -1, -1]], np.int8)
    o = opt_with(c, [(1, 4)], weights=[w])
    g = np.array([[0.2, -5.0, 0.0, 1e-3]], np.float32)
    for _ in range(5):
        o.step([g], lr=c.lr, progress=0.0)
    acc = o.state_arrays()["acc"][0]
    assert acc.dtype == np.int16
    np.testing.assert_array_equal(acc, [[3, -3, 0, 3]])
    o.step([-g], lr=c.lr, progress=0.0)
    np.testing.assert_array_equal(o.state_arrays()["acc"][0], [[2, -2, 0, 2]])


def test_switch_accumulate_switches_on_counter():
    # sigma = 0, lam = 1: probability = (W * acc) / max(W * acc), so the weights at the max switch surely.
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=accumulate", "optimizer.switch.acc_cutoff=50",
            "optimizer.switch.sigma=0.0", "optimizer.switch.lam=1.0")
    w = np.array([[1, -1, -1, 1]], np.int8)
    o = opt_with(c, [(1, 4)], weights=[w], acc=[[[0, 0, 0, 0]]])
    flips = o.step([np.array([[1.0, -1.0, 1.0, -1.0]])], lr=c.lr, progress=0.0)
    # acc = (1, -1, 1, -1); W * acc = (1, 1, -1, -1): the first two switch with probability 1.
    np.testing.assert_array_equal(o.binary_weights()[0], [[-1, 1, -1, 1]])
    assert flips == [2]


def test_switch_per_image_counts_only_large_gradients_towards_a_switch():
    """Network VIII: sigma' replaces sigma in Algorithm 1 (p = W g, keep p >= sigma' max p), so an image counts
    sign(g) only where its gradient points towards a switch (W g > 0) and is large among those."""
    c = cfg("optimizer.name=switch", "optimizer.switch.mode=per_image", "optimizer.switch.acc_cutoff=2",
            "optimizer.switch.sigma_prime=0.5", "optimizer.switch.sigma=0.99", "optimizer.switch.lam=1e-9")
    w = np.array([[1, 1, -1, -1]], np.int8)
    images = [
        np.array([[1.0, -0.6, 0.4, -0.1]]),  # p = (1, -.6, -.4, .1): +1 at 0 only (-0.6 points away from a switch)
        np.array([[-0.2, -1.0, 0.5, 0.0]]),  # p <= 0 everywhere: nothing counts
        np.array([[0.9, -0.9, -0.2, -0.3]]),  # p = (.9, -.9, .2, .3), keep >= .45: +1 at 0
        np.array([[0.1, 0.8, -0.6, 0.05]]),  # p = (.1, .8, .6, -.05), keep >= .4: +1 at 1, -1 at 2
        np.array([[0.5, 0.0, 0.0, 0.0]]),  # +1 at 0: saturates at 2
    ]
    o = opt_with(c, [(1, 4)], weights=[w], acc=[[[0, 0, 0, 0]]])
    o.step(None, lr=c.lr, progress=0.0, per_image=[lambda: iter(images)])
    np.testing.assert_array_equal(o.binary_weights()[0], w)  # lam ~ 0: nothing switched
    np.testing.assert_array_equal(o.state_arrays()["acc"][0], [[2, 1, -1, 0]])
    # The counter persists across steps.
    o.step(None, lr=c.lr, progress=0.0, per_image=[lambda: [np.array([[-1.0, 0.1, -0.7, 0.0]])]])
    np.testing.assert_array_equal(o.state_arrays()["acc"][0], [[2, 1, -2, 0]])


# ---------------------------------------------------------------------------
# Storage, determinism, undo, parameter optimisers


@pytest.mark.parametrize("name,extra", [
    ("adam", []), ("sgdm", []), ("bop", []), ("iir", []), ("switch", ["optimizer.switch.mode=momentum"]),
])
@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_state_is_rounded_to_storage(name, extra, storage):
    c = cfg(f"optimizer.name={name}", f"approx.storage={storage}", "optimizer.bop.gamma=0.3", *extra)
    shapes = [(40, 30), (30, 10)]
    o = make_weight_optimizer(c, shapes, np.random.default_rng(2))
    rng = np.random.default_rng(3)
    for t in range(3):
        o.step([rng.normal(0, 0.1, s).astype(np.float32) for s in shapes], lr=c.lr, progress=t / 3)
    for key, arrays in o.state_arrays().items():
        for a in arrays:
            if a.dtype == np.float32:
                assert a.any() or key == "tie_sign", key
                np.testing.assert_array_equal(a, to_storage(a, storage), err_msg=key)


@pytest.mark.parametrize("mode", ["stochastic", "accumulate"])
def test_determinism_with_equal_seeds(mode):
    c = cfg("optimizer.name=switch", f"optimizer.switch.mode={mode}", "optimizer.switch.sigma=0.2",
            "optimizer.switch.lam=0.5")
    shapes = [(50, 40)]

    def run(seed):
        o = make_weight_optimizer(c, shapes, np.random.default_rng(seed))
        grng = np.random.default_rng(100)
        flips = [o.step([grng.normal(size=shapes[0])], lr=c.lr, progress=0.0) for _ in range(5)]
        return o.binary_weights()[0], flips

    (w_a, f_a), (w_b, f_b), (w_c, _) = run(1), run(1), run(2)
    np.testing.assert_array_equal(w_a, w_b)
    assert f_a == f_b and sum(sum(f) for f in f_a) > 0
    assert (w_a != w_c).any()


def test_undo_restores_weights_and_keeps_state():
    c = cfg("optimizer.name=bop", "optimizer.bop.gamma=1.0", "optimizer.bop.tau=0.0", "approx.storage=float32")
    shapes = [(3, 4), (4, 2)]
    o = make_weight_optimizer(c, shapes, np.random.default_rng(0))
    before = o.binary_weights()
    snap = o.snapshot()
    flips = o.step([w.copy() for w in before], lr=c.lr, progress=0.0)  # g = w: every weight flips
    assert flips == [12, 8]
    m_after = o.state_arrays()["m"]
    o.restore(snap, layers=[1])
    np.testing.assert_array_equal(o.binary_weights()[0], -before[0])
    np.testing.assert_array_equal(o.binary_weights()[1], before[1])
    np.testing.assert_array_equal(o.state_arrays()["m"][1], m_after[1])  # state kept
    o.restore(snap, include_state=True)
    np.testing.assert_array_equal(o.binary_weights()[0], before[0])
    assert not o.state_arrays()["m"][0].any() and o.steps == 0


def test_param_optimizer_adam_and_sgdm():
    c = cfg("approx.storage=float32", "optimizer.sgdm.momentum=0.5")
    p = [np.array([1.0, -1.0, 0.0], np.float32)]
    adam = make_param_optimizer(c, [(3,)], "adam")
    adam.step(p, [np.array([0.2, -0.4, 0.0])], lr=0.1)
    np.testing.assert_allclose(p[0], [0.9, -0.9, 0.0], rtol=1e-6)  # first Adam step = lr * sign(g)
    q = [np.array([1.0, -1.0], np.float32)]
    sgd = make_param_optimizer(c, [(2,)], "sgdm")
    sgd.step(q, [np.array([1.0, 2.0])], lr=0.1)  # buf = g
    sgd.step(q, [np.array([1.0, 0.0])], lr=0.1)  # buf = 0.5 g1 + g2 = (1.5, 1)
    np.testing.assert_allclose(q[0], [1.0 - 0.1 - 0.15, -1.0 - 0.2 - 0.1], rtol=1e-6)
    with pytest.raises(ValueError, match="bop"):
        make_param_optimizer(c, [(2,)], "bop")


def test_bad_gradient_shape_is_reported():
    c = cfg("optimizer.name=adam")
    o = make_weight_optimizer(c, [(3, 4)], np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"grads\[0\]: shape \(4, 3\)"):
        o.step([np.zeros((4, 3))], lr=0.1, progress=0.0)
    with pytest.raises(ValueError, match="one per weight layer"):
        o.step([], lr=0.1, progress=0.0)
