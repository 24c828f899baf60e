"""The whole hardware training step: determinism, checkpoint/restore, engine protocol, float agreement."""

import numpy as np
import pytest

from sim.config import ConfigError, apply_overrides, config_from_dict, load_config
from sim.hw.engine import HwEngine
from sim.hw.model import HwModel
from sim.train_loop import TrainEngine, run_training

SMALL = {
    "name": "hw_small",
    "model": {
        "input_shape": [1, 8, 8],
        "num_classes": 4,
        "layers": [{"type": "dense", "units": 32}, {"type": "dense", "units": 16}, {"type": "dense", "units": 4}],
    },
    "train": {"batch_size": 20, "epochs": 1},
}


def _cfg(**over):
    cfg = config_from_dict(SMALL)
    return apply_overrides(cfg, over) if over else cfg


def _data(n=20, seed=0, cfg=None):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 1, 8, 8), dtype=np.uint8)
    y = rng.integers(0, 4, size=n)
    return x, y


def _run(cfg, steps, seed=0):
    eng = HwEngine(cfg)
    for i in range(steps):
        x, y = _data(seed=seed + i)
        eng.train_step(eng.prepare_inputs(x), y, lr=1e-3 * (0.5 ** (i // 3)), progress=i / steps)
    return eng


@pytest.mark.parametrize("opt", ["switch", "bop", "iir", "sgd"])
def test_determinism_bit_for_bit(opt):
    a = _run(_cfg(**{"hw.optimizer": opt}), 6).state_dict()
    b = _run(_cfg(**{"hw.optimizer": opt}), 6).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    c = _run(_cfg(**{"hw.optimizer": opt, "hw.rng_seed": 2}), 6).state_dict()
    assert any(not np.array_equal(a[k], c[k]) for k in a if k.startswith("w"))


@pytest.mark.parametrize("opt", ["switch", "sgd"])
def test_checkpoint_restore_continues_identically(opt):
    cfg = _cfg(**{"hw.optimizer": opt})
    full = _run(cfg, 6)
    part = _run(cfg, 3)
    st = part.state_dict()
    resumed = HwEngine(cfg)
    resumed.load_state_dict(st)
    for i in range(3, 6):
        x, y = _data(seed=i)
        resumed.train_step(resumed.prepare_inputs(x), y, lr=1e-3 * (0.5 ** (i // 3)), progress=i / 6)
    a, b = full.state_dict(), resumed.state_dict()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_state_dict_contents():
    eng = _run(_cfg(), 2)
    st = eng.state_dict()
    for j in range(3):
        w = st[f"w{j}"]
        assert w.dtype == np.int8 and set(np.unique(w)) <= {-1, 1}
        assert st[f"acc{j}"].shape == w.shape
        assert np.abs(st[f"acc{j}"]).max() <= eng.cfg.hw.switch_cutoff
    assert st["rng"].dtype == np.uint32 and int(st["steps"]) == 2


def test_engine_protocol_and_run_training():
    d = dict(SMALL, model={"input_shape": [1, 28, 28], "num_classes": 10,
                           "layers": [{"type": "dense", "units": 16}, {"type": "dense", "units": 10}]},
             data={"train_limit": 200, "test_limit": 100}, train={"batch_size": 20, "epochs": 1, "max_steps": 4})
    cfg = config_from_dict(d)
    eng = HwEngine(cfg)
    assert isinstance(eng, TrainEngine)
    hist = run_training(cfg, eng, progress=False, log=None)
    assert hist.total_steps == 4 and 0.0 <= hist.test_acc[-1] <= 1.0
    assert hist.meta["engine"] == "hw"


def test_trace_matches_component_functions():
    from sim.hw import arith as A

    cfg = _cfg()
    m = HwModel(cfg)
    x, y = _data()
    xin = HwEngine(cfg).prepare_inputs(x)
    w0 = [w.copy() for w in m.w]
    beta0 = [b.copy() for b in m.beta]
    tr = m.train_step(xin, y, lr=1e-3)
    # layer 0 forward from the component functions
    y0 = A.xnor_popcount(xin, w0[0], 128)
    assert np.array_equal(y0, tr.y[0])
    f0 = A.bn_forward(y0, beta0[0], m.p, m.bounds[0].y)
    assert np.array_equal(f0.x_hat, tr.bn[0].x_hat)
    # the top layer's backward from the loss gradient
    q, p1 = A.bn_backward(tr.grad_q, tr.bn[-1].x_hat, tr.bn[-1].alpha_q, m.p)
    assert np.array_equal(q, tr.q[0])
    codes = A.po2_quantise(q, tr.bn[-1].S_eff, A.loss_grad_scale(m.p), m.p, times_batch=False)
    assert np.array_equal(codes.field, tr.codes[0].field) and codes.bias == tr.codes[0].bias


def test_binary_input_and_undo():
    cfg = _cfg(**{"hw.input": "binary", "hw.switch_undo": True})
    eng = _run(cfg, 3)
    assert eng.model.x_max[0] == 1
    x, _ = _data()
    assert set(np.unique(eng.prepare_inputs(x))) <= {-1, 1}


def test_hw_model_rejects_unsupported_topologies():
    conv = {"type": "conv", "channels": 4}
    for layers, match in (
        ([{"type": "maxpool"}, {"type": "dense", "units": 4}], r"model\.layers\[0\]: .* pools only the output"),
        ([conv, {"type": "maxpool"}, {"type": "maxpool", "pool": 1}, {"type": "dense", "units": 4}],
         r"model\.layers\[2\]: .* pools only"),
    ):
        with pytest.raises(ConfigError, match=match):
            HwModel(config_from_dict(dict(SMALL, model=dict(SMALL["model"], layers=layers))))
    d = dict(SMALL, model=dict(SMALL["model"], layers=[{"type": "dense", "units": 8, "bn": False},
                                                      {"type": "dense", "units": 4}]))
    with pytest.raises(ConfigError, match="bn = false"):
        HwModel(config_from_dict(d))


def test_hw_tracks_float_reference_on_first_step():
    """Same weights and batch: the hardware's forward signs and dW signs agree with the float reference."""
    from sim.hw import arith as A
    from sim.reference.model import BNNModel

    cfg = apply_overrides(_cfg(), ["model.input_format=int8", "train.loss=squared_hinge", "approx.bn_eps=0",
                                  "approx.storage=float32"])
    hw = HwModel(cfg)
    ref = BNNModel(cfg, np.random.default_rng(0))
    x, y = _data(n=20)
    xin = HwEngine(cfg).prepare_inputs(x)
    wb = [w.astype(np.float32) for w in hw.w]
    out = ref.forward(xin.astype(np.float32), train=True, wb=wb)
    tr = hw.train_step(xin, y, lr=1e-3)
    logits_f = out.logits
    assert np.abs(tr.logits_q / 2**hw.p.logit_frac - logits_f).max() <= 2.0 / 2**hw.p.logit_frac
    _, dlog, _ = ref.loss(logits_f, y)
    grads, _ = ref.backward(dlog, out.saved, wb)
    agree = [np.mean(np.sign(g) == s) for g, s in zip(grads, tr.dw_sign[::-1], strict=True)]
    assert min(agree) > 0.97, agree
    assert A.ArithParams.from_config(cfg).k == cfg.approx.dy_bits


@pytest.mark.slow
def test_default_switch_learns_mnist():
    """The preset MLP (binarised input, as the accelerator takes it) in hardware arithmetic: 100 steps on the
    vendored MNIST reach > 74 % accuracy on 1,000 test images.

    The threshold is measured, at 38db12c with this test's settings over train.seed 0-9: 0.758-0.794 (mean
    0.781, sd 0.011; seed 0, the preset's, 0.785). 0.74 is the mean - 3.7 sd, below every seed, so another
    seed-like change (a new rounding, a reordered batch) does not fail it; the same run with weights that never
    flip (hw.switch_cutoff=32767: only the BN biases learn) reaches 0.09-0.10. The former 0.80 dates from the
    preset's 8-bit input (0.81-0.83 on seeds 0-2); since 5241533 the preset binarises the input, about 3 points
    lower after 100 steps."""
    cfg = apply_overrides(load_config("mlp"), ["train.epochs=1", "train.max_steps=100", "data.test_limit=1000"])
    assert cfg.hw.input_kind(cfg) == "binary"  # the measurement above is of the binarised input
    hist = run_training(cfg, HwEngine(cfg), progress=False, log=None)
    assert hist.test_acc[-1] > 0.74


# --- degenerate batches: a channel whose batch values are all equal (S = 0) passes no gradient ---------------


def _pairs_batch(w0: np.ndarray, c: int, n: int, seed: int) -> np.ndarray:
    """+-1 inputs [n, N] on which layer 0's channel ``c`` is constant and the other channels vary: the inputs
    differ from a base image only in disjoint pixel pairs (i, j) with ``x_j = -x_i w_ic w_jc``, so that
    ``x_i w_ic + x_j w_jc = 0`` for channel ``c`` whatever ``x_i`` is."""
    rng = np.random.default_rng(seed)
    N = w0.shape[0]
    x = np.tile(rng.choice([-1, 1], N), (n, 1)).astype(np.int64)
    perm = rng.permutation(N)
    for i, j in zip(perm[0::2], perm[1::2], strict=True):
        xi = rng.choice([-1, 1], n)
        x[:, i], x[:, j] = xi, -xi * w0[i, c] * w0[j, c]
    return x


def test_all_identical_samples_pass_no_gradient():
    """A batch of one image repeated: every channel of every layer has S = 0, so Q = 0 everywhere, every po2
    field is the zero code, sgn(dW) = 0 and no weight or accumulator moves; the output layer's dbeta (the
    loss gradient's sum) still updates beta."""
    cfg = _cfg(**{"hw.input": "binary"})
    m = HwModel(cfg)
    x = np.tile(np.random.default_rng(3).choice([-1, 1], 64), (20, 1))
    y = np.full(20, 2)
    w0, acc0, beta0 = [w.copy() for w in m.w], [a.copy() for a in m.opt["acc"]], [b.copy() for b in m.beta]
    for _ in range(2):
        tr = m.train_step(x, y, lr=1e-3)
        assert all(f.zero.all() for f in tr.bn)
        assert not any(q.any() for q in tr.q) and not any(c.field.any() for c in tr.codes)
        assert not any(s.any() for s in tr.dw_sign) and tr.flips == 0
    assert all(np.array_equal(a, b) for a, b in zip(m.w, w0, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(m.opt["acc"], acc0, strict=True))
    assert not np.array_equal(m.beta[-1], beta0[-1])


def test_one_constant_channel_does_not_set_the_layer_range():
    """Layer 0's channel c is constant over the batch, the others vary: c's Q and codes are 0, and the layer's
    po2 range is set by the other channels (before the rule, S' = 1 made c's |dy| about B^2 s times too large,
    so the bias followed c and nearly every other code fell to the lowest exponent)."""
    cfg = _cfg(**{"hw.input": "binary"})
    m = HwModel(cfg)
    c = 5
    x = _pairs_batch(m.w[0], c, 20, seed=4)
    y = np.random.default_rng(5).integers(0, 4, 20)
    tr = m.train_step(x, y, lr=1e-3)
    f0, q0, codes0 = tr.bn[0], tr.q[-1], tr.codes[-1]
    assert f0.zero.tolist() == [k == c for k in range(32)]
    assert not q0[:, c].any() and not codes0.field[:, c].any() and not tr.dw_sign[-1][:, c].any()
    nz = codes0.field[codes0.field > 0]
    assert nz.size > 0.5 * q0.size and np.mean(nz == 1) < 0.25  # field 1 = the lowest exponent
    assert codes0.field.max() == 2 ** (m.p.k - 1) - 1  # the top code belongs to a varying channel


@pytest.mark.parametrize("window", [1, 4, 15])
def test_windowed_weight_gradient_in_the_model(window):
    """hw.dw_window = d: every layer's sgn(dW) is the sign of X^T t, t the codes within d planes of their column's
    largest counted +-1 (the layers' inputs: x_hat of the layer below, the +-1 pixels for layer 0)."""
    from sim.hw import arith as A

    cfg = _cfg(**{"hw.input": "binary", "hw.dw_window": window})
    m = HwModel(cfg)
    x, y = _data()
    xin = HwEngine(cfg).prepare_inputs(x)
    tr = m.train_step(xin, y, lr=1e-3)
    inputs = [xin] + [2 * bn.x_hat.astype(np.int64) - 1 if bn.x_hat.min() >= 0 else bn.x_hat for bn in tr.bn[:-1]]
    L = len(inputs)
    for j in range(L):
        codes = tr.codes[L - 1 - j]
        t = A.dw_window_ternary(codes, window)
        assert np.array_equal(tr.dw_sign[L - 1 - j], np.sign(inputs[j].T.astype(np.int64) @ t)), j
    full = HwModel(_cfg(**{"hw.input": "binary"})).train_step(xin, y, lr=1e-3)
    # same forward and codes; the signs differ somewhere (else the option would be idle)
    assert all(np.array_equal(a.field, b.field) for a, b in zip(full.codes, tr.codes, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(full.dw_sign, tr.dw_sign, strict=True))


def test_the_windowed_gradients_bounds():
    with pytest.raises(ConfigError, match="hw.dw_window = -1 is out of range"):
        _cfg(**{"hw.dw_window": -1})
