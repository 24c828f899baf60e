"""The float reference BNN (sim/reference/model.py) and its engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.config import apply_overrides, load_config
from sim.reference import ops
from sim.reference.engine import ReferenceEngine
from sim.reference.model import BNNModel

DENSE = [{"type": "dense", "units": 12}, {"type": "dense", "units": 12}, {"type": "dense", "units": 10}]
CONV = [
    {"type": "conv", "channels": 4, "kernel": 3, "padding": "valid"},
    {"type": "conv", "channels": 6, "kernel": 3, "padding": "same"},
    {"type": "maxpool", "pool": 2},
    {"type": "dense", "units": 16},
    {"type": "dense", "units": 10},
]


def make_cfg(layers, input_shape=(1, 8, 8), **over):
    d = {"model.input_shape": list(input_shape), "model.layers": layers}
    d.update(over)
    return apply_overrides(load_config("mlp"), d)


def batch(cfg, n=20, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, *cfg.model.input_shape)).astype(np.float32)
    y = rng.integers(0, cfg.model.num_classes, size=n)
    return x, y


@pytest.mark.parametrize("layers", [DENSE, CONV], ids=["dense", "conv"])
@pytest.mark.parametrize("scheme", ["standard", "proposed"])
def test_forward_backward_shapes(layers, scheme):
    cfg = make_cfg(layers, **{"approx.scheme": scheme})
    m = BNNModel(cfg)
    x, y = batch(cfg)
    fw = m.forward(x, train=True)
    assert fw.logits.shape == (20, 10)
    loss, dlogits, _ = m.loss(fw.logits, y)
    grads, dbetas = m.backward(dlogits, fw.saved)
    assert [g.shape for g in grads] == [s.weight_shape for s in cfg.weight_layers()]
    assert [b.shape for b in dbetas] == [(s.out_channels,) for s in cfg.weight_layers()]
    assert all(np.all(np.isfinite(g)) for g in grads) and math.isfinite(loss)
    if scheme == "proposed":  # bool dW: every entry is +-1/sqrt(fan_in)
        for g, s in zip(grads, cfg.weight_layers(), strict=True):
            np.testing.assert_allclose(np.abs(g), 1 / math.sqrt(s.fan_in), rtol=1e-6)
    loss2, correct, flips = m.train_step(x, y, lr=1e-3, progress=0.0)
    assert math.isfinite(loss2) and 0 <= correct <= 20 and flips >= 0
    ev_loss, ev_correct = m.evaluate(x, y)
    assert math.isfinite(ev_loss) and 0 <= ev_correct <= 20


def _arrays(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _arrays(v, f"{path}.{k}")
    elif isinstance(tree, np.ndarray):
        yield path, tree


def test_l1_bnn_retains_no_float_activations():
    cfg = make_cfg(CONV, **{"approx.scheme": "proposed"})
    assert cfg.approx.bn == "l1_bnn"
    m = BNNModel(cfg)
    x, _ = batch(cfg)
    saved = m.forward(x, train=True).saved
    for rec in saved:
        for path, a in _arrays(rec):
            if rec.get("first") and path == ".x_in":
                continue  # the real network input of the first layer (standard BNN practice)
            if a.dtype.kind == "f":
                assert a.ndim <= 1, f"layer {rec['index']}{path}: float array {a.shape} retained"
            else:
                assert a.dtype.itemsize == 1, f"layer {rec['index']}{path}: {a.dtype} is wider than a byte"
    # Binary inputs and masks really are binary.
    later = [r for r in saved if r["type"] != "maxpool" and not r["first"]]
    assert all(set(np.unique(r["x_in"])) <= {-1, 0, 1} for r in later)
    assert all(r["mask"].dtype == bool for r in later)
    # The l2 path of Algorithm 1 keeps full-precision activations.
    m2 = BNNModel(make_cfg(CONV, **{"approx.scheme": "standard"}))
    saved2 = m2.forward(x, train=True).saved
    assert any(
        a.dtype.kind == "f" and a.ndim > 1 for r in saved2 if r["type"] != "maxpool" for _, a in _arrays(r["bn"])
    )


@pytest.mark.parametrize("bn", ["l2", "l1"])
@pytest.mark.parametrize("loss", ["cross_entropy", "squared_hinge"])
def test_one_layer_gradient_matches_finite_differences(bn, loss):
    """Float input -> dense -> BN -> loss: dW equals the numerical derivative w.r.t. W taken as a real value.

    The model runs in float32; the finite differences use the same forward pass written out in
    float64 (the ops keep float64), so that round-off does not swamp the differences.
    """
    cfg = make_cfg(
        [{"type": "dense", "units": 10}],
        input_shape=(1, 3, 3),
        **{"approx.scheme": "standard", "approx.bn": bn, "train.loss": loss},
    )
    m = BNNModel(cfg)
    beta = np.linspace(-0.5, 0.5, 10, dtype=np.float32)
    m.beta[0][:] = beta
    x, y = batch(cfg, n=16, seed=3)
    w = np.random.default_rng(4).normal(size=(9, 10)).astype(np.float32)
    lossf = ops.squared_hinge if loss == "squared_hinge" else ops.softmax_cross_entropy
    x64, b64 = x.reshape(16, -1).astype(np.float64), beta.astype(np.float64)

    def f(wr, br=b64):
        z, _ = ops.bn_forward(x64 @ wr, br, bn, cfg.approx.bn_eps)
        return lossf(z, y)[0]

    fw = m.forward(x, train=True, wb=[w])
    np.testing.assert_allclose(fw.logits, ops.bn_forward(x64 @ w.astype(np.float64), b64, bn)[0], atol=1e-4)
    _, dlogits, _ = m.loss(fw.logits, y)
    grads, dbetas = m.backward(dlogits, fw.saved, wb=[w])
    h = 1e-5
    w64 = w.astype(np.float64)
    num = np.zeros_like(w64)
    for idx in np.ndindex(*w.shape):
        e = np.zeros_like(w64)
        e[idx] = h
        num[idx] = (f(w64 + e) - f(w64 - e)) / (2 * h)
    np.testing.assert_allclose(grads[0], num, atol=1e-3 * np.abs(num).max(), rtol=1e-3)
    # The BN bias gradient too.
    nb = np.array([(f(w64, b64 + h * np.eye(10)[j]) - f(w64, b64 - h * np.eye(10)[j])) / (2 * h) for j in range(10)])
    np.testing.assert_allclose(dbetas[0], nb, atol=1e-3 * np.abs(nb).max(), rtol=1e-3)


def test_bool_dw_is_sign_over_sqrt_fan_in():
    cfg_f = make_cfg(DENSE, **{"approx.scheme": "standard"})
    cfg_b = make_cfg(DENSE, **{"approx.scheme": "standard", "approx.dw": "bool"})
    x, y = batch(cfg_f)
    gs = []
    for cfg in (cfg_f, cfg_b):
        m = BNNModel(cfg, np.random.default_rng(7))
        fw = m.forward(x)
        gs.append(m.backward(m.loss(fw.logits, y)[1], fw.saved)[0])
    for gf, gb, s in zip(gs[0], gs[1], cfg_f.weight_layers(), strict=True):
        np.testing.assert_array_equal(gb, ops.sign(gf) / np.float32(math.sqrt(s.fan_in)))


def test_dy_is_quantised_before_the_products():
    """With po2 dY the weight gradient is X_hat^T po2(dY): check the last layer directly."""
    cfg = make_cfg(DENSE, **{"approx.scheme": "standard", "approx.dy": "po2", "approx.dy_bits": 3})
    m = BNNModel(cfg)
    x, y = batch(cfg)
    fw = m.forward(x)
    _, dlogits, _ = m.loss(fw.logits, y)
    grads, _ = m.backward(dlogits, fw.saved)
    last = fw.saved[-1]
    dy, _ = ops.bn_backward(dlogits, last["bn"], "l2")
    expect = last["x_in"].astype(np.float32).T @ ops.quantise_dy(dy, "po2", 3)
    np.testing.assert_allclose(grads[-1], expect, rtol=1e-5, atol=1e-7)


def test_psg_and_per_image_switch_paths_run():
    cfg = make_cfg(CONV, **{"approx.scheme": "proposed", "e2train.psg": True})
    m = BNNModel(cfg)
    x, y = batch(cfg)
    m.train_step(x, y, lr=1e-3, progress=0.0)
    assert 0.0 <= m.last_psg_fraction <= 1.0
    cfg2 = make_cfg(
        CONV, **{"approx.scheme": "proposed", "optimizer.name": "switch", "optimizer.switch.mode": "per_image"}
    )
    m2 = BNNModel(cfg2)
    _, _, flips = m2.train_step(x, y, lr=1e-3, progress=0.0)
    assert flips >= 0


def test_binary_input_format_and_state_dict():
    cfg = make_cfg(DENSE, **{"model.input_format": "binary", "approx.scheme": "proposed"})
    eng = ReferenceEngine(cfg)
    xu = np.random.default_rng(0).integers(0, 256, size=(20, 1, 8, 8), dtype=np.uint8)
    xp = eng.prepare_inputs(xu)
    assert set(np.unique(xp)) <= {-1.0, 1.0}
    saved = eng.model.forward(xp).saved
    assert saved[0]["x_in"].dtype == np.int8
    sd = eng.state_dict()
    assert sd["w0"].dtype == np.int8 and set(np.unique(sd["w0"])) <= {-1, 1}
    assert sd["beta0"].shape == (12,) and "running_mu2" in sd and "opt_latent0" in sd


@pytest.mark.parametrize("scheme", ["standard", "proposed"])
def test_short_mnist_training_is_well_above_chance(scheme):
    from sim.train_loop import run_training

    over = {
        "approx.scheme": scheme,
        "model.layers": [
            {"type": "dense", "units": 128},
            {"type": "dense", "units": 128},
            {"type": "dense", "units": 10},
        ],
        "data.train_limit": 8000,
        "data.test_limit": 1000,
        "train.epochs": 2,
        "train.lr.schedule": "constant",
    }
    if scheme == "proposed":
        over["optimizer.adam.eps"] = 1e-3  # float16 Adam state, see benchmarks/reference_accuracy.py
    cfg = apply_overrides(load_config("mlp"), over)
    hist = run_training(cfg, ReferenceEngine(cfg), progress=False, log=None)
    assert hist.total_steps == 160
    assert hist.best > 0.80, hist.test_acc


# --- degenerate batches: a channel whose batch values are all equal passes no gradient ------------------------


def _preset_batch(n=20, seed=7):
    """A pm1-like batch for the preset MLP (784 inputs), values multiples of 1/4 (exact float sums)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-4, 5, size=(n, 784)).astype(np.float32) / 4, rng.integers(0, 10, size=n)


def test_all_identical_samples_train_without_diverging():
    """The preset (proposed scheme, float16 storage) on 20 copies of one image: every channel is constant, so
    no gradient passes (no weight moves); the loss stays finite and the output biases learn. Before the rule
    the l1 scale 0 was divided by eps = 1e-5, the gradient overflowed float16 and training stopped with NaN."""
    cfg = load_config("mlp")
    m = BNNModel(cfg)
    x, _ = _preset_batch(1)
    x, y = np.repeat(x, 20, axis=0), np.full(20, 3)
    w0 = m.binary_weights()
    losses = [m.train_step(x, y, lr=1e-3)[0] for _ in range(3)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert all(np.array_equal(a, b) for a, b in zip(m.binary_weights(), w0, strict=True))
    assert m.beta[-1].any() and all(np.isfinite(b).all() for b in m.beta)


def test_one_constant_channel_does_not_set_the_layer_range(monkeypatch):
    """Layer 0's channel c is constant over the batch (inputs differ only in pixel pairs that cancel in c):
    its dY is 0 and its 1-bit dW column 0; the po2 range of the layer follows the other channels (before the
    rule c's dY was about 1e5 times theirs, so most of them fell to the lowest code)."""
    cfg = load_config("mlp")
    m = BNNModel(cfg)
    w0 = m.binary_weights()[0]
    c = 17
    rng = np.random.default_rng(8)
    x = np.tile(rng.integers(-4, 5, size=784).astype(np.float32) / 4, (20, 1))
    perm = rng.permutation(784)
    for i, j in zip(perm[0::2], perm[1::2], strict=True):
        a = rng.choice([-0.25, 0.25], 20).astype(np.float32)
        x[:, i] += a
        x[:, j] -= a * w0[i, c] * w0[j, c]
    y = rng.integers(0, 10, size=20)
    seen = []
    real = ops.quantise_dy
    monkeypatch.setattr(ops, "quantise_dy", lambda dy, kind, bits=5: seen.append(dy) or real(dy, kind, bits))
    fw = m.forward(x, train=True)
    assert np.flatnonzero(fw.saved[0]["bn"]["const"]).tolist() == [c]
    _, dlogits, _ = m.loss(fw.logits, y)
    grads, _ = m.backward(dlogits, fw.saved)
    dy0 = seen[-1]  # layer 0 is quantised last
    assert not dy0[:, c].any() and not grads[0][:, c].any()
    assert np.all(np.abs(np.delete(grads[0], c, axis=1)) > 0)
    q = np.abs(ops.quantise_dy(dy0, "po2", 5))
    lowest = q[q > 0].min()
    assert np.mean(q[q > 0] == lowest) < 0.25
    for _ in range(3):
        assert math.isfinite(m.train_step(x, y, lr=1e-3)[0])


# --- Akesson's undo function (optimizer.switch.undo) ---------------------------------------------------------


def _switch_pair():
    over = {"optimizer.name": "switch", "optimizer.switch.mode": "deterministic"}
    return BNNModel(make_cfg(DENSE, **over)), BNNModel(make_cfg(DENSE, **over, **{"optimizer.switch.undo": True}))


def test_switch_undo_reverts_exactly_the_layers_whose_update_raised_the_loss():
    """Same seed and batch with and without undo: the undone layers get back exactly their weights from before
    the step, the others keep the same update as without undo; BN biases and running statistics are those of
    the run without undo (the re-evaluation touches neither); the kept update does not raise the batch loss."""
    plain, undo = _switch_pair()
    x, y = batch(plain.cfg, seed=0)
    before = undo.binary_weights()
    loss_p, _, flips_p = plain.train_step(x, y, lr=1e-3)
    loss_u, _, flips_u = undo.train_step(x, y, lr=1e-3)
    assert loss_p == loss_u and plain.last_undone == []
    assert undo.last_undone and len(undo.last_undone) < len(before)
    for k, (w_u, w_p, w0) in enumerate(zip(undo.binary_weights(), plain.binary_weights(), before, strict=True)):
        np.testing.assert_array_equal(w_u, w0 if k in undo.last_undone else w_p)
    assert flips_u == sum(int(np.count_nonzero(a != b))
                          for a, b in zip(undo.binary_weights(), before, strict=True)) < flips_p
    for a, b in zip([*plain.beta, *plain.running_mu, *plain.running_scale],
                    [*undo.beta, *undo.running_mu, *undo.running_scale], strict=True):
        np.testing.assert_array_equal(a, b)
    assert undo._batch_loss(x, y, undo.binary_weights()) <= loss_u


def test_switch_undo_changes_the_run():
    plain, undo = _switch_pair()
    for i in range(4):
        x, y = batch(plain.cfg, seed=i)
        plain.train_step(x, y, lr=1e-3)
        undo.train_step(x, y, lr=1e-3)
    assert any(not np.array_equal(a, b) for a, b in zip(plain.binary_weights(), undo.binary_weights(), strict=True))


def test_pool_before_bn_gradient_matches_finite_differences(monkeypatch):
    """conv -> maxpool (before_bn) -> BN -> sign -> dense -> BN: with the sign taken as the identity (and the
    straight-through mask open) the network is differentiable almost everywhere, and the backward pass (BN over the
    pooled Y, the gradient routed to each window's first maximum before the conv's dW) equals the numerical
    derivative of the loss w.r.t. the conv weights taken as real values."""
    import sim.reference.model as model_mod

    layers = [{"type": "conv", "channels": 3, "kernel": 3, "padding": "valid"},
              {"type": "maxpool", "pool": 2, "before_bn": True}, {"type": "dense", "units": 4}]
    cfg = make_cfg(layers, input_shape=(1, 6, 6), **{"approx.scheme": "standard", "approx.storage": "float32",
                                                        "model.num_classes": 4})
    monkeypatch.setattr(model_mod.ops, "sign", lambda x: np.asarray(x, dtype=np.float32))
    monkeypatch.setattr(model_mod.ops, "ste_mask", lambda x: np.ones(np.shape(x), dtype=bool))
    monkeypatch.setattr(BNNModel, "_retain_input", lambda self, a, first: np.asarray(a, dtype=np.float32))
    m = BNNModel(cfg)
    assert m.pool_first == {0: 2} and [b.tolist() for b in m.beta] == [[0.0] * 3, [0.0] * 4]  # no pooled bias
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 1, 6, 6)).astype(np.float32)
    y = np.arange(6) % 4
    wb = [rng.normal(size=(3, 1, 3, 3)).astype(np.float32), rng.normal(size=(12, 4)).astype(np.float32)]
    fw = m.forward(x, train=True, wb=wb)
    assert fw.saved[0]["bn"]["xn"].shape == (6, 3, 2, 2)  # BN over the pooled Y
    _, dlogits, _ = m.loss(fw.logits, y)
    grads, _ = m.backward(dlogits, fw.saved, wb)

    def f(w0):
        return m.loss(m.forward(x, train=True, wb=[w0, wb[1]]).logits, y)[0]

    h = 2e-3
    num = np.zeros(wb[0].shape)
    for idx in np.ndindex(*wb[0].shape):
        e = np.zeros(wb[0].shape, dtype=np.float32)
        e[idx] = h
        num[idx] = (f(wb[0] + e) - f(wb[0] - e)) / (2 * h)
    np.testing.assert_allclose(grads[0], num, atol=2e-2 * np.abs(num).max(), rtol=2e-2)
