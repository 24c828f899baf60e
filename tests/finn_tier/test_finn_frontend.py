"""FINN's front end accepts ``xnortrain export``'s graph (marker ``finn``, ``make test-finn``): streamlining and the
conversion to hardware layers run in finn-plus's own environment (``.venv-finn``: it pins numpy, onnx and torch),
and FINN's Python execution gives the bit-exact model's class for every image, after each stage
(tests/finn_tier/finn_check.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from small_mlp import trained_engine

from host.export import export_qonnx
from sim.config import apply_overrides, load_config
from sim.hw.engine import prepare_inputs
from sim.train_loop import load_training_data

ROOT = Path(__file__).resolve().parents[2]
FINN_PY = ROOT / ".venv-finn" / "bin" / "python"
IMAGES = 100

pytestmark = pytest.mark.finn


def test_finn_streamlines_converts_and_executes_the_export(tmp_path):
    assert FINN_PY.is_file(), f"{FINN_PY} missing: `make test-finn` creates it (finn-plus in its own venv)"
    layers = 'model.layers=[{type="dense",units=64},{type="dense",units=32},{type="dense",units=10}]'
    cfg = apply_overrides(load_config("mlp"), ["train.batch_size=20", layers, "hw.lanes_in=32", "hw.lanes_out=8",
                                               "hw.lanes_b=2"])
    data = load_training_data(cfg)
    engine = trained_engine(cfg, data, 100)
    x = data.x_test[:IMAGES]
    expect = engine.model.forward_eval(prepare_inputs(cfg, x)).argmax(axis=1).tolist()
    model = tmp_path / "mlp.onnx"
    model.write_bytes(export_qonnx(cfg, engine.state_dict()).model.SerializeToString())
    np.savez(tmp_path / "x.npz", x=x.astype(np.float32))
    out = tmp_path / "finn.json"
    r = subprocess.run([str(FINN_PY), str(ROOT / "tests" / "finn_tier" / "finn_check.py"), str(model),
                        str(tmp_path / "x.npz"), str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    print(r.stdout)
    assert "MVAU" in res["hw_ops"] and "MatMul" not in res["hw_ops"], res["hw_ops"]
    for stage in ("tidy", "streamlined", "hw"):
        bad = [i for i, (a, b) in enumerate(zip(res[stage], expect, strict=True)) if a != b]
        assert not bad, f"{stage}: {len(bad)} of {IMAGES} classes differ, first {bad[:5]}"
