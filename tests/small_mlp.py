"""The small MLP every system-level test builds (784-12-10, B = 4, narrow lanes): configuration overrides of the
``mlp`` preset, in one place so that the tests share one accelerator build (the caches are keyed on the Verilog).

Importable as ``small_mlp`` from any test (pytest puts tests/, the folder of the root conftest.py, on sys.path)."""

SMALL = [
    "model.input_format=binary",
    "train.batch_size=4",
    'model.layers=[{type="dense",units=12},{type="dense",units=10}]',
    "hw.lanes_in=32",
    "hw.lanes_out=8",
    "hw.lanes_b=2",
    "hw.update_lanes=8",
    "hw.dw_passes=4",  # 8 dW cycles per bank row, still under the sweep's 32: no cycles lost
    "hw.dx_passes=2",
]


def trained_engine(cfg, data, steps: int, seed: int = 0):
    """A :class:`sim.hw.engine.HwEngine` of ``cfg`` after ``steps`` steps on random batches of ``data``'s training
    images (the trained networks of the export tests)."""
    import numpy as np

    from sim.hw.engine import HwEngine

    engine = HwEngine(cfg)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.integers(0, len(data.x_train), cfg.train.batch_size)
        engine.train_step(engine.prepare_inputs(data.x_train[idx]), data.y_train[idx], lr=cfg.lr, progress=0.0)
    return engine
