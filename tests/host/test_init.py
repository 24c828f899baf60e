"""``xnortrain train --init FILE``: a float-reference checkpoint or an ONNX BNN converted into the hardware's formats
(host/init_state.py), on the bit-exact model and the simulated board; ``--data`` (host/adapt.py)."""

from __future__ import annotations

import numpy as np
import pytest
from small_mlp import SMALL

from host.cli import main
from host.common import UserError
from host.init_state import hw_state, read_source, source_from_onnx
from sim.config import apply_overrides, load_config
from sim.hw.engine import HwEngine
from sim.reference.engine import ReferenceEngine
from sim.train_loop import load_training_data, run_training

LAYERS = 'model.layers=[{type="dense",units=32},{type="dense",units=16},{type="dense",units=10}]'
FLOAT = ["model.input_format=binary", "train.batch_size=20", LAYERS, "hw.lanes_in=32", "hw.lanes_out=8",
         "hw.lanes_b=2", "data.train_limit=1000", "data.test_limit=2000", "train.epochs=1"]


def _classes_float(engine, x):
    return engine.model.forward(engine.prepare_inputs(x), train=False).logits.argmax(axis=1)


def _classes_hw(engine, x):
    return engine.model.forward_eval(engine.prepare_inputs(x)).argmax(axis=1)


_RUNS: dict = {}


#: the float runs: the two schemes with binary input; real-valued (pm1) input for the 8-bit first layer
_KINDS = {"proposed": ["approx.scheme=proposed"], "standard": ["approx.scheme=standard"],
          "pm1": ["approx.scheme=proposed", "model.input_format=float", "hw.input=int8"]}


def _float_run(scheme: str, tmp_path_factory):
    """(cfg, engine, checkpoint path, data): one epoch (50 steps) of the float reference."""
    if scheme not in _RUNS:
        cfg = apply_overrides(load_config("mlp"), [*FLOAT, *_KINDS[scheme]])
        data = load_training_data(cfg)
        eng = ReferenceEngine(cfg)
        path = tmp_path_factory.mktemp("init") / f"{scheme}.ckpt.npz"
        run_training(cfg, eng, data, progress=False, log=None, state_file=path, handle_signals=False)
        _RUNS[scheme] = cfg, eng, path, data
    return _RUNS[scheme]


@pytest.fixture(scope="module")
def float_run(tmp_path_factory):
    return _float_run("proposed", tmp_path_factory)


@pytest.mark.parametrize("scheme", list(_KINDS))
def test_float_checkpoint_converts_to_the_same_classes(scheme, tmp_path_factory):
    """The bit-exact model right after the conversion classifies as the float model does (rounding of the running
    statistics to Q.8 and beta to Q.16 aside: at least 99.5 % of the images, accuracy within 0.5 points). The
    proposed scheme's l1 BN divides by the running mean |y - mu| + eps, the standard scheme's by
    sqrt(running variance + eps); real-valued input x = pixel / 127.5 - 1 is folded into the first layer's
    statistics for the 8-bit first layer (hw.input = int8)."""
    cfg, eng, path, data = _float_run(scheme, tmp_path_factory)
    assert cfg.approx.bn == ("l2" if scheme == "standard" else "l1_bnn")
    hw = HwEngine(cfg)
    hw.load_state_dict(hw_state(cfg, read_source(str(path))))
    x, y = data.x_test, data.y_test
    want, got = _classes_float(eng, x), _classes_hw(hw, x)
    assert (want == y).mean() > 0.2  # trained (chance: 0.1)
    assert (want == got).mean() >= 0.995, f"{(want != got).sum()} of {len(x)} classes differ"
    assert abs((want == y).mean() - (got == y).mean()) <= 0.005


def test_export_round_trips_exactly(float_run, tmp_path):
    """A hardware state exported to QONNX and read back with --init is the same weights and BN integers."""
    from host.export import export_qonnx

    cfg, _, _, data = float_run
    hw = HwEngine(cfg)
    for step in range(15):
        idx = np.arange(step * 20, step * 20 + 20)
        hw.train_step(hw.prepare_inputs(data.x_train[idx]), data.y_train[idx], lr=cfg.lr, progress=0.0)
    state = hw.state_dict()
    path = tmp_path / "m.onnx"
    path.write_bytes(export_qonnx(cfg, state).model.SerializeToString())
    back = hw_state(cfg, read_source(str(path)))
    for j in range(3):
        for key in ("w", "beta", "mu_r", "s_r"):
            np.testing.assert_array_equal(back[f"{key}{j}"], state[f"{key}{j}"], err_msg=f"{key}{j}")


def test_onnx_batchnorm_graph_with_negative_scales(float_run, tmp_path):
    """A float BNN as PyTorch/Brevitas write it (MatMul, bias Add, BatchNormalization with gamma, some gammas
    negative, sign activations): the converted accelerator classifies as the graph's float evaluation."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    cfg, _, _, data = float_run
    rng = np.random.default_rng(1)
    shapes = [(784, 32), (32, 16), (16, 10)]
    ws = [rng.standard_normal(s) for s in shapes]
    bns = []
    x = np.where(data.x_test.reshape(len(data.x_test), -1) >= 128, 1.0, -1.0)
    nodes, inits, cur = [], [], "x"
    h = x
    for j, w in enumerate(ws):
        y = h @ np.where(w >= 0, 1.0, -1.0)
        bias = rng.standard_normal(w.shape[1])
        mu, var = (y + bias).mean(0) + rng.standard_normal(w.shape[1]), (y + bias).var(0) + 1.0
        gamma = rng.choice([-1.0, 1.0], w.shape[1]) * rng.uniform(0.5, 2.0, w.shape[1])
        beta = rng.standard_normal(w.shape[1]) * 0.3
        bns.append((bias, gamma, beta, mu, var))
        z = gamma * (y + bias - mu) / np.sqrt(var + 1e-5) + beta
        h = np.where(z >= 0, 1.0, -1.0)
        for name, v in ((f"w{j}", w), (f"b{j}", bias), (f"g{j}", gamma), (f"be{j}", beta), (f"m{j}", mu),
                        (f"v{j}", var)):
            inits.append(numpy_helper.from_array(v.astype(np.float32), name))
        nodes += [helper.make_node("MatMul", [cur, f"w{j}"], [f"y{j}"]),
                  helper.make_node("Add", [f"y{j}", f"b{j}"], [f"yb{j}"]),
                  helper.make_node("BatchNormalization", [f"yb{j}", f"g{j}", f"be{j}", f"m{j}", f"v{j}"], [f"z{j}"],
                                   epsilon=1e-5)]
        if j < 2:
            nodes.append(helper.make_node("Sign", [f"z{j}"], [f"s{j}"]))
            cur = f"s{j}"
    want = z.argmax(axis=1)
    graph = helper.make_graph(nodes, "bnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 784])],
                              [helper.make_tensor_value_info("z2", TensorProto.FLOAT, [1, 10])], initializer=inits)
    path = tmp_path / "bnn.onnx"
    onnx.save(helper.make_model(graph), path)
    src = source_from_onnx(str(path))
    assert src.input_kind == "given"
    hw = HwEngine(cfg)
    hw.load_state_dict(hw_state(cfg, src))
    got = _classes_hw(hw, data.x_test)
    assert (want == got).mean() >= 0.99, f"{(want != got).sum()} of {len(want)} classes differ"


def test_topology_mismatch_names_the_layer(float_run):
    cfg, _, path, _ = float_run
    src = read_source(str(path))
    other = apply_overrides(cfg, ['model.layers=[{type="dense",units=32},{type="dense",units=24},'
                                  '{type="dense",units=10}]'])
    with pytest.raises(UserError, match=r"model.layers\[1\] is dense 32 -> 16 there, 32 -> 24 here"):
        hw_state(other, src)
    deeper = apply_overrides(cfg, [LAYERS.replace("units=16}", 'units=16},{type="dense",units=16}')])
    with pytest.raises(UserError, match=r"model.layers\[2\] is dense 16 -> 10 there, 16 -> 16 here"):
        hw_state(deeper, src)
    with pytest.raises(UserError, match="takes \\+-1 input, this configuration 8-bit pixels"):
        hw_state(apply_overrides(cfg, ["hw.input=int8"]), src)


@pytest.mark.parametrize("optimizer", ["sgd", "iir"])
def test_every_optimiser_starts_from_its_initial_state(float_run, optimizer):
    """sgd's latent weights take the new weights' signs (w = +1 iff latent >= 0); the rest starts at zero."""
    cfg, _, path, _ = float_run
    cfg = apply_overrides(cfg, [f"hw.optimizer={optimizer}"])
    state = hw_state(cfg, read_source(str(path)))
    HwEngine(cfg).load_state_dict(state)  # validate_state: the weight / state coupling holds


def test_cli_init_and_data(float_run, tmp_path, capsys):
    from host.adapt import save_data_file, shifted_dataset

    cfg, _, path, data = float_run
    toml = tmp_path / "c.toml"
    toml.write_text(cfg.to_toml())
    npz = tmp_path / "inverted.npz"
    save_data_file(npz, shifted_dataset(data, "invert"))
    base = ["train", "--config", str(toml), "--target", "model", "--max-steps", "3", "--no-progress",
            "--no-checkpoint", "--init", str(path)]
    import re

    accuracy = re.compile(r"initialised from .*: test accuracy ([0-9.]+) % by the target's own inference, before any "
                          r"step \(2000 images\)")
    assert main(base) == 0
    before = float(accuracy.search(capsys.readouterr().out).group(1))
    assert main([*base, "--data", str(npz)]) == 0  # the inverted digits: the base model fails on them
    assert float(accuracy.search(capsys.readouterr().out).group(1)) < before - 5
    bad = tmp_path / "bad.npz"
    np.savez(bad, x_train=data.x_train[:4], y_train=data.y_train[:4], x_test=data.x_test[:4].astype(np.int16),
             y_test=data.y_test[:4])
    assert main([*base, "--data", str(bad)]) == 2
    assert "x_test has dtype int16" in capsys.readouterr().err
    assert main(["train", "--config", str(toml), "--arith", "float", "--init", str(path), "--no-checkpoint"]) == 2
    assert "--init" in capsys.readouterr().err
    assert main(["train", "--config", str(toml), "--target", "model", "--no-progress", "--no-checkpoint", "--init",
                 str(tmp_path / "none.onnx")]) == 2
    assert "none.onnx: no such file" in capsys.readouterr().err


@pytest.mark.rtl
def test_init_on_the_simulated_board_equals_the_model(tmp_path, capsys):
    """--init with --target sim: the accelerator starts from the converted state and every step equals the model
    (--check-every 1); the small accelerator of the system tests (one cached build)."""
    cfg = apply_overrides(load_config("mlp"), [*SMALL, "data.train_limit=40", "data.test_limit=12",
                                               "train.epochs=1"])
    eng = ReferenceEngine(cfg)
    ck = tmp_path / "f.ckpt.npz"
    run_training(cfg, eng, progress=False, log=None, state_file=ck, handle_signals=False)
    toml = tmp_path / "s.toml"
    toml.write_text(cfg.to_toml())
    rc = main(["train", "--config", str(toml), "--target", "sim", "--init", str(ck), "--check-every", "1",
               "--max-steps", "4", "--no-progress", "--no-checkpoint"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "initialised from" in out
    # the model from the same conversion predicts what the board's inference gave
    hw = HwEngine(cfg)
    hw.load_state_dict(hw_state(cfg, read_source(str(ck))))
    data = load_training_data(cfg)
    acc = (_classes_hw(hw, data.x_test) == data.y_test).mean()
    assert f"test accuracy {100 * acc:.2f} %" in out


def test_the_continue_command_keeps_data():
    """An interrupted run on --data prints a continuing command with the same --data (the checkpoint's data
    fingerprint refuses another dataset)."""
    import argparse

    from host.cli import _continue_command

    args = argparse.Namespace(bitstream=None, data="rot90.npz", check_every=0, eval_every=0, no_progress=False)
    assert "--data rot90.npz" in _continue_command(args, "hw", "sim", None, None, "run.ckpt.npz")
