"""Hardware optimisers: integer semantics, saturation, state widths, float counterparts."""

import numpy as np

from sim.config import apply_overrides, load_config
from sim.hw import optim as O
from sim.hw.arith import ArithParams
from sim.reference.optim import switch_probability


def _u(rng, shape):
    return rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32)


def test_switch_table_matches_float_probability():
    C = 63
    for sigma, lam in [(0.0, 1.0), (0.5, 0.1), (0.25, 0.6)]:
        t = O.switch_table(C, sigma, lam)
        assert t.shape == (C + 1,) and t[0] == 0 and t.max() <= 1 << 16
        # float Algorithm 2 with rho = C (p = C present): same probabilities to within the quantisation
        p = np.arange(C + 1, dtype=float)
        pf = switch_probability(p, round(sigma * C) / C, lam)
        assert np.abs(t / 2**16 - pf).max() <= 1.5 / 2**16 + 1e-12


def test_switch_update_saturates_and_switches():
    C = 5
    w = np.array([1, 1, -1, -1], dtype=np.int8)
    acc = np.array([5, -5, 4, 0], dtype=np.int16)
    g = np.array([1, -1, -1, 1], dtype=np.int8)
    table = O.switch_table(C, 0.0, 1.0)
    u = np.zeros(4, dtype=np.uint32)  # u >> 16 = 0 < T[p] for every p > 0
    nw, nacc, sw = O.switch_update(w, acc, g, u, table, C)
    assert list(nacc) == [5, -5, 3, 1]
    # p = w acc: [5, -5, -3, -1] -> only the first switches
    assert list(sw) == [True, False, False, False] and list(nw) == [-1, 1, -1, -1]
    u = np.full(4, 0xFFFFFFFF, dtype=np.uint32)  # T[C] = 2^16 > 0xFFFF: a saturated accumulator always switches
    nw, _, sw = O.switch_update(w, acc, g, u, table, C, reset=True)
    assert list(sw) == [True, False, False, False]
    nw, nacc, _ = O.switch_update(w, acc, g, np.zeros(4, np.uint32), table, C, reset=True)
    assert nacc[0] == 0


def test_switch_gate_slows_accumulation_and_wide_cutoff():
    rng = np.random.default_rng(4)
    n = 100_000
    w = np.ones(n, dtype=np.int8)
    acc = np.zeros(n, dtype=np.int16)
    table = O.switch_table(63, 0.5, 0.5)
    _, acc2, _ = O.switch_update(w, acc, -np.ones(n, np.int8), _u(rng, n), table, 63, gate=O.switch_gate(0.25))
    assert abs((acc2 == -1).mean() - 0.25) < 0.01 and set(np.unique(acc2)) <= {-1, 0}
    assert O.switch_gate(1.0) == 1 << 16 and O.switch_gate(1e-9) == 1
    # hw.switch_rate scales the gate: a quarter of the rate at lr0, an eighth at lr0 / 2; never past 2^16
    assert O.switch_gate(1.0, 0.25) == O.switch_gate(0.25) == 1 << 14 and O.switch_gate(0.5, 0.25) == 1 << 13
    assert O.switch_gate(4.0, 0.5) == 1 << 16 and O.switch_gate(1e-9, 0.25) == 1
    C = 32767  # the largest cut-off: no int16 overflow at saturation
    acc = np.full(4, C, dtype=np.int16)
    _, acc3, _ = O.switch_update(-np.ones(4, np.int8), acc, np.ones(4, np.int8), np.zeros(4, np.uint32),
                                 O.switch_table(C, 0.5, 0.5), C)
    assert (acc3 == C).all()


def test_switch_probability_statistics():
    rng = np.random.default_rng(0)
    C, n = 63, 200_000
    table = O.switch_table(C, 0.5, 0.4)
    w = np.ones(n, dtype=np.int8)
    acc = np.full(n, 50, dtype=np.int16)
    _, _, sw = O.switch_update(w, acc, np.zeros(n, np.int8), _u(rng, n), table, C)
    expect = 0.4 * (50 - 32) / (63 - 32)
    assert abs(sw.mean() - expect) < 0.005


def test_bop_ema_and_flip():
    rng = np.random.default_rng(1)
    n = 1000
    w = np.ones(n, dtype=np.int8)
    m = np.zeros(n, dtype=np.int32)
    g = np.ones(n, dtype=np.int8)  # gradient agrees with w: pressure to flip
    steps = 0
    while w.min() > 0:
        w, m, _ = O.bop_update(w, m, g, _u(rng, n), shift=3, frac=8, tau_q=128)
        steps += 1
        assert steps < 50
    assert (m <= 256).all()
    # unbiased stochastic rounding: mean m tracks the float EMA 1 - (7/8)^t
    assert steps >= 5


def test_iir_filter_float_counterpart():
    rng = np.random.default_rng(2)
    n = 4000
    w = np.ones(n, dtype=np.int8)
    m = np.zeros(n, dtype=np.int32)
    G = np.zeros(n, dtype=np.int32)
    mf = gf = 0.0
    for t in range(60):
        g = np.full(n, 1 if t < 30 else -1, dtype=np.int8)
        w, m, G, _ = O.iir_update(w, m, G, g, _u(rng, n), 2, 3, 6, 12)
        mf += (g[0] - mf) / 4
        gf += (mf - gf) / 8
        # Eqs 12-13 of seed 002 with gamma = 1/4, alpha = 1/8: stochastic rounding is unbiased
        assert abs(m.mean() / 64 - mf) < 0.02 and abs(G.mean() / 4096 - gf) < 0.02
    assert (w == np.where(G > 0, -1, 1)).all()


def test_sgd_latent_stochastic_rounding_mean():
    rng = np.random.default_rng(3)
    n = 20000
    c = np.zeros(n, dtype=np.int32)
    m = np.zeros(n, dtype=np.int32)
    g = np.ones(n, dtype=np.int8)
    for _ in range(16):
        w, c, m = O.sgd_update(c, m, g, _u(rng, n), lr_sh=10, latent_frac=11, mom_shift=0, mom_frac=4)
    # 16 steps of lr 2^-10 on g = +1: latent -16/1024 on average = -32 LSB of Q0.11
    assert abs(c.mean() + 32) < 0.5
    assert (w == -1).all()
    c = np.full(4, 2047, dtype=np.int32)
    _, c2, _ = O.sgd_update(c, m[:4], -g[:4], _u(rng, 4), lr_sh=0, latent_frac=11, mom_shift=0, mom_frac=4)
    assert (c2 == 2047).all()  # saturates at the top of [-1, 1)


def _beta_steps(grads, scales, steps=None):
    p = ArithParams()
    beta = np.zeros(len(grads[0]), dtype=np.int64)
    m = np.zeros_like(beta)
    a = np.zeros_like(beta)
    e = 0
    for g, sc in zip(grads, scales, strict=True):
        beta, m, a, e = O.beta_update(beta, m, a, e, np.asarray(g), sc, 10, p, 3, 7, 24)
    return beta, m, a, e


def test_beta_update_mean_based_and_scale_free():
    n = 60
    grads = [np.array([5, -5, 0, 3 if t % 2 else -1]) for t in range(n)]
    beta, m, a, e = _beta_steps(grads, [0] * n)
    # consistent gradient: |m / a| -> 1, steps of lr = 2^-10 (64 LSB of Q.16) against the gradient
    assert beta[0] < 0 < beta[1] and beta[2] == 0
    assert abs(beta[0] + 64 * n) < 64 * n * 0.35 and beta[0] == -beta[1]
    assert beta[3] < 0  # mean +1 (3, -1 alternating): follows the mean
    # the same gradients at another scale (and a changing one) give the same betas: scale-free
    b2, _, _, _ = _beta_steps([g * 4 for g in grads], [-2] * n)
    assert np.array_equal(b2, beta)
    b3, _, _, _ = _beta_steps(grads, [7] * n)
    assert np.array_equal(b3, beta)
    assert int(np.abs(m).max()).bit_length() <= 22 and int(a.max()).bit_length() <= 22


def test_beta_update_follows_mean_not_median():
    # mostly small positive, occasionally large negative: mean < 0, median > 0
    grads = [np.array([1]) if t % 5 else np.array([-20]) for t in range(400)]
    beta, _, _, _ = _beta_steps(grads, [0] * 400)
    assert beta[0] > 0  # beta -= lr * mean direction (mean dbeta < 0 -> beta grows)


def test_beta_update_saturates():
    p = ArithParams()
    b, _, _, _ = O.beta_update(np.array([p.beta_lo]), np.zeros(1, np.int64), np.zeros(1, np.int64), 0,
                               np.array([1]), 0, 0, p, 3, 7, 24)
    assert b[0] == p.beta_lo


def test_lr_and_ratio_shifts():
    assert O.lr_shift(0.001) == 10 and O.lr_shift(0.0005) == 11 and O.lr_shift(1.0) == 0
    assert O.ratio_shift(1.0) == 0 and O.ratio_shift(0.5) == 1 and O.ratio_shift(1e-9) == 16


def test_state_bits_per_optimizer():
    cfg = load_config("mlp")
    bits = {o: sum(O.state_bits(apply_overrides(cfg, [f"hw.optimizer={o}"]).hw).values()) for o in
            ("switch", "bop", "iir", "sgd")}
    assert bits["switch"] == 1 + (cfg.hw.switch_cutoff.bit_length() + 1)
    assert bits["bop"] == 1 + cfg.hw.bop_frac_bits + 2


def test_switch_threshold_anneals_with_the_schedule():
    # anneal 0 keeps sigma; at the initial rate every anneal gives sigma; lower rates raise it towards 1
    assert O.switch_sigma_at(0.5, 0.0, 1e-3) == 0.5
    for a in (0.5, 1.0, 2.0):
        assert O.switch_sigma_at(0.5, a, 1.0) == 0.5
        s = [O.switch_sigma_at(0.5, a, 2.0**-k) for k in range(12)]
        assert all(x < y for x, y in zip(s, s[1:], strict=False)) and s[-1] < 1.0
    assert O.switch_sigma_at(0.5, 1.0, 0.5) == 0.75 and O.switch_sigma_at(0.5, 1.0, 2.0) == 0.5
    C = 63
    for r in (1.0, 0.5, 0.125, 2.0**-10):
        t = O.switch_table_at(C, 0.5, 0.5, 1.0, r)
        assert (t == O.switch_table(C, O.switch_sigma_at(0.5, 1.0, r), 0.5)).all()
        assert t[C] == O.switch_table(C, 0.5, 0.5)[C]  # lambda at the cut-off is not scaled
    # the threshold row moves up: fewer accumulator values can switch at a lower rate
    zeros = [int((O.switch_table_at(C, 0.5, 0.5, 1.0, 2.0**-k) == 0).sum()) for k in range(8)]
    assert zeros == sorted(zeros) and zeros[0] == 33 and zeros[-1] == C  # T[p] = 0 for p <= sigma_c


def test_model_uses_the_annealed_table_and_the_driver_writes_it(monkeypatch):
    cfg = apply_overrides(load_config("mlp"), {"model.input_shape": [1, 4, 4],
                                               "model.layers": [{"type": "dense", "units": 10}],
                                               "train.batch_size": 4})
    from sim.hw.model import HwModel

    seen = []
    real = O.switch_update

    def spy(w, acc, g, u, table, *a, **k):
        seen.append(np.asarray(table).copy())
        return real(w, acc, g, u, table, *a, **k)

    monkeypatch.setattr(O, "switch_update", spy)
    m = HwModel(cfg)
    rng = np.random.default_rng(0)
    x = np.where(rng.random((4, 16)) < 0.5, 1, -1).astype(np.int8)
    m.train_step(x, np.arange(4), lr=cfg.lr / 4)
    h = cfg.hw
    assert (seen[-1] == O.switch_table_at(h.switch_cutoff, h.switch_sigma, h.switch_lambda, h.switch_anneal,
                                          0.25)).all()
    assert not (seen[-1] == O.switch_table(h.switch_cutoff, h.switch_sigma, h.switch_lambda)).all()
