"""``xnortrain export``: the QONNX graph of a trained network classifies as the accelerator's evaluation does.

A small MLP (784-32-16-10, B = 20) trained a few dozen steps on the bit-exact model; qonnx's own executor on the
export against :meth:`sim.hw.model.HwModel.forward_eval` (the arithmetic the accelerator's ``infer`` is checked
against): the first maximum of the graph's output equals the model's class on a fixed 2,000 of the test images
(``benchmarks/export_qonnx.py``: the whole 10,000 and the paper's MLP), and every threshold node equals the
model's decision at every value its layer can produce."""

from __future__ import annotations

import numpy as np
import pytest
from qonnx.core.onnx_exec import execute_onnx
from qonnx.custom_op.general.multithreshold import multithreshold
from small_mlp import trained_engine

from host.cli import main
from host.export import export_qonnx, reachable_y
from sim.config import apply_overrides, load_config
from sim.hw import arith as A
from sim.hw.engine import prepare_inputs
from sim.train_loop import load_training_data

LAYERS = 'model.layers=[{type="dense",units=32},{type="dense",units=16},{type="dense",units=10}]'
N_TEST = 2000


@pytest.fixture(scope="module")
def trained():
    """(cfg, engine, data) after 60 steps of the bit-exact model (a few seconds)."""
    cfg = apply_overrides(load_config("mlp"), ["model.input_format=binary", "train.batch_size=20", LAYERS,
                                               "hw.lanes_in=32", "hw.lanes_out=8", "hw.lanes_b=2"])
    data = load_training_data(cfg)
    return cfg, trained_engine(cfg, data, 60), data


def test_classes_equal_the_bit_exact_models_evaluation(trained):
    cfg, engine, data = trained
    x = data.x_test[:N_TEST]
    expect = engine.model.forward_eval(prepare_inputs(cfg, x)).argmax(axis=1)
    assert 0.2 < (expect == data.y_test[:N_TEST]).mean() < 1.0  # trained (chance: 0.1), not everything right
    graph = export_qonnx(cfg, engine.state_dict(), batch=len(x))
    out = execute_onnx(graph, {"global_in": x.astype(np.float32)})["global_out"]
    got = out.argmax(axis=1)
    bad = np.flatnonzero(got != expect)
    assert bad.size == 0, f"{bad.size} of {len(x)} images differ, first {bad[:5]}"


def test_flat_input_and_batch_one(trained):
    cfg, engine, data = trained
    x = data.x_test[:3]
    expect = engine.model.forward_eval(prepare_inputs(cfg, x)).argmax(axis=1)
    flat = export_qonnx(cfg, engine.state_dict(), batch=3, input_shape="flat")
    assert flat.get_tensor_shape("global_in") == [3, 784]
    out = execute_onnx(flat, {"global_in": x.reshape(3, -1).astype(np.float32)})["global_out"]
    assert (out.argmax(axis=1) == expect).all()
    one = export_qonnx(cfg, engine.state_dict())
    assert one.get_tensor_shape("global_in") == [1, 1, 28, 28]
    out = execute_onnx(one, {"global_in": x[:1].astype(np.float32)})["global_out"]
    assert out.argmax(axis=1)[0] == expect[0]


def test_every_threshold_node_equals_the_model_on_every_reachable_y(trained):
    """Each hidden layer's MultiThreshold gives the accelerator's eval sign at every Y the layer can produce; the
    output layer's counts order every pair of (class, Y) as the accelerator's Q.FL logits do; the input node
    binarises every pixel level as the host does."""
    cfg, engine, _ = trained
    model = engine.model
    graph = export_qonnx(cfg, engine.state_dict())
    node = {n.output[0]: n for n in graph.graph.node}
    levels = np.arange(256, dtype=np.float32).reshape(1, 256)
    thr0 = graph.get_initializer(node["x0"].input[1])
    pix = 2 * multithreshold(levels, thr0[:256]) - 1
    host = prepare_inputs(cfg, np.arange(256, dtype=np.uint8).reshape(256, 1, 1, 1)).reshape(1, 256)
    assert (pix == host).all()
    last = len(model.layers) - 1
    for j, s in enumerate(model.layers):
        ys = reachable_y(s.fan_in, model.x_max[j])
        y = np.repeat(ys[:, None], s.out_channels, axis=1)
        if j < last:
            thr = graph.get_initializer(node[f"x{j + 1}"].input[1])
            got = 2 * multithreshold(y.astype(np.float32), thr) - 1
            want = A.bn_forward_eval(y, model.beta[j], model.mu_r[j], model.s_r[j], model.p, model.bounds[j].y)
            assert (got == want).all(), f"layer {j}"
        else:
            thr = graph.get_initializer(node["global_out"].input[1])
            got = multithreshold(y.astype(np.float32), thr).reshape(-1)
            want = A.output_logits_eval(y, model.beta[j], model.mu_r[j], model.s_r[j], model.p).reshape(-1)
            order = np.argsort(want, kind="stable")
            assert (np.diff(got[order]) >= 0).all()  # the same order
            assert ((np.diff(got[order]) == 0) == (np.diff(want[order]) == 0)).all()  # the same ties


def test_cli_writes_refuses_and_names_the_layer(tmp_path, trained, capsys):
    from sim.train_loop import load_checkpoint

    cfg, engine, _ = trained
    toml = tmp_path / "small.toml"
    toml.write_text(cfg.to_toml())
    ckpt = tmp_path / "run.json"
    assert main(["train", "--target", "model", "--config", str(toml), "--max-steps", "3", "--set",
                 "data.test_limit=20", "--json", str(ckpt), "--no-progress"]) == 0
    state = tmp_path / "run.ckpt.npz"
    out = tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(state), "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(state), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(state), "--out", str(out), "--force"]) == 0
    assert main(["export", "--checkpoint", str(state), "--out", str(tmp_path / "model.txt")]) == 2
    assert "ending in .onnx" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "none.npz"), "--out", str(tmp_path / "b.onnx")]) == 2
    assert "none.npz" in capsys.readouterr().err
    # a conv network is refused naming the layer (before anything is written)
    conv = apply_overrides(load_config("mlp"), [
        'model.layers=[{type="conv",channels=4,kernel=3},{type="dense",units=10}]', "hw.check_widths=false"])
    from host.common import UserError
    from host.export import _check_exportable

    with pytest.raises(UserError, match=r"model.layers\[0\] \(conv\)"):
        _check_exportable(conv)
    assert load_checkpoint(state).engine == "hw"
