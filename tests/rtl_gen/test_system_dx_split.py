# amaranth: UnusedElaboratable=no
"""The dX split of a layer whose po2 backward engine is shared, with the codes packed in YDX's spare rows.

Random configuration case 20 of docs/results.md (seed 1711): 40-24-10 with one sample bank, so that the codes
live in the rows of the YDX buffer above its words, and one po2 backward engine for all three layers. Layer 1's
dX beats (8 values) are split into the 2-value BN beats of layer 0; the register that holds a beat while it is
split also took the output layer's dX beats in ``dx 2`` (the engine's handshake, not gated by the phase), so
``dx 1`` opened with one stray beat, written at the write position the previous step had left: one past layer
0's last word, which is the first row of the packed codes. Step 0 wrote it harmlessly at address 0; from step 1
on it zeroed four of layer 1's codes before its dX and dW read them (``a_beta0``, ``w1`` and their optimiser state
differed). Case 21 (16-32-24-10, ``hw.dx_passes = 1``) is the same fault through layers 3 and 2.
"""

from __future__ import annotations

import pytest

from sim.config import apply_overrides, load_config

CASE20 = [
    "model.input_format=binary",
    'model.layers=[{type="dense",units=40},{type="dense",units=24},{type="dense",units=10}]',
    "train.batch_size=8", "hw.lanes_in=32", "hw.lanes_out=2", "hw.lanes_b=1", "hw.dw_passes=4", "hw.dx_passes=4",
    "hw.update_lanes=32", "hw.div_steps=2", "hw.optimizer=iir", "hw.rng_seed=744977", "train.seed=712",
]


def _plan(over):
    from rtl_gen.top import Accelerator, SystemPlan

    plan = SystemPlan(apply_overrides(load_config("mlp"), over))
    acc = Accelerator(plan)
    acc.elaborate(None)
    return plan, acc


def test_case20_packs_the_codes_into_ydx_and_shares_one_engine():
    """The test below is about this layout: if a change of the generator moves the codes out of YDX or splits
    the engine, the whole-step test no longer covers the fault and needs another configuration."""
    plan, acc = _plan(CASE20)
    assert plan.backward_groups == [[0, 1, 2]]
    ydx_words, per_row = acc._cb_packing  # codes from row ydx_words on: directly after layer 0's dX words
    assert ydx_words == plan.layers[0].beats and per_row > 1
    lp1 = plan.layers[1]
    assert lp1.lanes_in // lp1.dx_passes > plan.layers[0].lanes_out  # layer 1's dX beats are split


@pytest.mark.rtl
def test_shared_engine_dx_split_with_packed_codes_two_steps_match_the_model():
    from host.verify import run_system

    cfg = apply_overrides(load_config("mlp"), CASE20)
    rep = run_system(cfg, mode="train", steps=2)  # the fault shows from the second step on
    assert len(rep["steps"]) == 2
    for i, st in enumerate(rep["steps"]):
        assert st["mismatch"] is None, (i, st["mismatch"])
