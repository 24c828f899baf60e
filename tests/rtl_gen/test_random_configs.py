# amaranth: UnusedElaboratable=no
"""Random configurations through the generator and the simulator (marker ``random_configs``,
``make test-random``): the generator is verified, not one design.

Each case draws a network depth, layer widths, batch size, lane parameters and hardware optimiser (switch
with and without undo, bop, iir, sgd with and without momentum) from a seeded generator, builds the
accelerator, runs ``STEPS`` (3) whole training steps on real MNIST in Verilator and compares every read-back
quantity with the bit-exact model after each step: some faults only show from the second step on (state the
first step leaves behind: momentum, the IIR filter, switch counters, a pointer that is not rewound).
``XNT_RANDOM_CONFIGS`` sets the number of cases (default 6), ``XNT_RANDOM_SEED`` the seed (default 2026).
Draws the generator rejects with a ConfigError are counted and replaced (the rejection itself is what the
fast tests of test_system.py check).
"""

from __future__ import annotations

import os
import random

import pytest

from rtl_gen.top import SystemPlan
from sim.config import apply_overrides, load_config
from sim.schema import ConfigError

N_CASES = int(os.environ.get("XNT_RANDOM_CONFIGS", "6"))
SEED = int(os.environ.get("XNT_RANDOM_SEED", "2026"))
STEPS = 3  # the second and third steps start from state the first one left in the accelerator


def draw_config(rng: random.Random):
    """One random, buildable configuration, and its overrides (for the report)."""
    rejected = 0
    while True:
        depth = rng.randint(1, 3)  # hidden layers
        widths = [rng.choice([8, 12, 16, 24, 32, 40]) for _ in range(depth)]
        layers = ",".join(f'{{type="dense",units={w}}}' for w in widths) + ',{type="dense",units=10}'
        opt = rng.choice(["switch", "bop", "sgd", "iir"])
        over = [
            "model.input_format=binary",
            f"model.layers=[{layers}]",
            f"train.batch_size={rng.choice([2, 3, 4, 6, 8])}",
            f"hw.lanes_in={rng.choice([32, 64])}",
            f"hw.lanes_out={rng.choice([2, 4, 8, 16])}",
            f"hw.lanes_b={rng.choice([1, 2, 4])}",
            f"hw.dw_passes={rng.choice([1, 2, 4])}",
            f"hw.dx_passes={rng.choice([1, 2, 4])}",
            f"hw.update_lanes={rng.choice([4, 8, 16, 32])}",
            f"hw.div_steps={rng.choice([1, 2, 4])}",
            f"hw.optimizer={opt}",
            f"hw.rng_seed={rng.randint(1, 1 << 20)}",
            f"train.seed={rng.randint(0, 1000)}",
        ]
        if opt == "switch":  # with or without the re-run and undo
            over.append(f"hw.switch_undo={rng.choice(['false', 'true'])}")
        if opt == "sgd":  # with or without the momentum field
            over.append(f"hw.sgd_momentum_shift={rng.choice([0, 2])}")
        try:
            cfg = apply_overrides(load_config("mlp"), over)
            SystemPlan(cfg)
        except ConfigError:
            rejected += 1
            continue
        return cfg, over, rejected


CASES = []
_rng = random.Random(SEED)
for _i in range(N_CASES):
    CASES.append(draw_config(_rng))


@pytest.mark.random_configs
@pytest.mark.parametrize("case", range(N_CASES))
def test_random_configuration_step_matches_the_model(case):
    from host.verify import run_system

    cfg, over, _rejected = CASES[case]
    rep = run_system(cfg, mode="train", steps=STEPS)
    assert len(rep["steps"]) == STEPS, over
    for i, step in enumerate(rep["steps"]):
        assert step["mismatch"] is None, (over, f"step {i + 1} of {STEPS}", step)
    print("PASSED", " ".join(over))
