# amaranth: UnusedElaboratable=no
"""A po2 backward engine shared by layers of different shapes: every dX phase leaves the engine empty.

Random configuration case 7 of docs/results.md (seed 1711): 12-40-12-10 with hw.dx_passes = 4, where layer 1 and
the output layer share one engine (equal lanes_in). The output layer's 12 inputs fill three of its four dX passes,
so each row ends with padding beats; the dX phase used to end at the last *kept* beat, leaving the last row's
padding beat in the engine, and the next layer's dX (layer 1 into layer 0's buffer) started with it: layer 0's
BN-bias gradient came out 0 where the model has 13,856. The phase now ends when every beat, padding included, has
left the engine.
"""

from __future__ import annotations

import pytest

from sim.config import apply_overrides, load_config

CASE7 = [
    "model.input_format=binary",
    'model.layers=[{type="dense",units=12},{type="dense",units=40},{type="dense",units=12},{type="dense",units=10}]',
    "train.batch_size=6", "hw.lanes_in=32", "hw.lanes_out=2", "hw.lanes_b=4", "hw.dw_passes=4", "hw.dx_passes=4",
    "hw.update_lanes=4", "hw.div_steps=4", "hw.optimizer=iir", "hw.rng_seed=758224", "train.seed=822",
]


@pytest.mark.rtl
def test_shared_engine_with_padding_passes_whole_steps_match_the_model():
    from host.verify import run_system
    from rtl_gen.top import SystemPlan

    cfg = apply_overrides(load_config("mlp"), CASE7)
    groups = SystemPlan(cfg).backward_groups
    assert any(1 in g and 3 in g for g in groups), groups  # the sharing this test is about
    rep = run_system(cfg, mode="train", steps=2)
    assert len(rep["steps"]) == 2
    for i, st in enumerate(rep["steps"]):
        assert st["mismatch"] is None, (i, st["mismatch"])
