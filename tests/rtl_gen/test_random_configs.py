# amaranth: UnusedElaboratable=no
"""Random configurations through the generator and the simulator (marker ``random_configs``,
``make test-random``): the generator is verified, not one design.

Each case draws a network depth, layer widths, batch size (up to the paper's 100 at small widths), every lane
parameter, the dW window, the DSP or fabric dW/dX datapaths, the fraction widths and the hardware optimiser
(switch with and without undo, reset, its cutoff and rate; bop, iir, sgd with and without momentum) from a seeded
generator, builds the
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
        wide_batch = rng.random() < 0.25  # a batch up to the paper's B = 100 (the widest words) at small widths
        widths = [rng.choice([8, 12, 16] if wide_batch else [8, 12, 16, 24, 32, 40]) for _ in range(depth)]
        layers = ",".join(f'{{type="dense",units={w}}}' for w in widths) + ',{type="dense",units=10}'
        opt = rng.choice(["switch", "bop", "sgd", "iir"])
        lanes_out = rng.choice([2, 4, 8, 16])
        batch = rng.choice([16, 24, 50, 64, 100]) if wide_batch else rng.choice([2, 3, 4, 6, 8, 12])
        over = [
            "model.input_format=binary",
            f"model.layers=[{layers}]",
            f"train.batch_size={batch}",
            f"hw.lanes_in={rng.choice([32, 64])}",
            f"hw.lanes_out={lanes_out}",
            f"hw.lanes_b={rng.choice([1, 2, 4])}",
            f"hw.dw_passes={rng.choice([1, 2, 4])}",
            f"hw.dx_passes={rng.choice([1, 2, 4])}",
            f"hw.update_lanes={rng.choice([4, 8, 16, 32])}",
            f"hw.div_steps={rng.choice([1, 2, 4])}",
            f"hw.mul_steps={rng.choice([1, 2, 4, 8])}",
            # every field that changes the hardware: the dW window, the DSP or fabric datapaths, the po2 and loss
            # lanes (divisors of lanes_out), the fraction widths of BN, logits, exponents and probabilities
            f"hw.dw_window={rng.choice([0, 1, 2, 3, 5])}",
            f"hw.dw_dsp={rng.choice(['true', 'false'])}",
            f"hw.dx_dsp={rng.choice(['true', 'false'])}",
            f"hw.po2_lanes={rng.choice([d for d in (1, 2, 4, 8, 16) if lanes_out % d == 0])}",
            f"hw.loss_lanes={rng.choice([d for d in (1, 2, 4) if lanes_out % d == 0])}",
            f"hw.beta_frac_bits={rng.choice([12, 16, 20])}",
            f"hw.alpha_frac_bits={rng.choice([8, 10, 12])}",
            f"hw.logit_frac_bits={rng.choice([6, 8, 10])}",
            f"hw.exp_frac_bits={rng.choice([12, 16])}",
            f"hw.prob_frac_bits={rng.choice([12, 16])}",
            f"hw.running_frac_bits={rng.choice([6, 8])}",
            f"hw.optimizer={opt}",
            f"hw.rng_seed={rng.randint(1, 1 << 20)}",
            f"train.seed={rng.randint(0, 1000)}",
        ]
        if opt == "switch":  # with or without the re-run and undo; the accumulator's cutoff, reset and rate
            over += [f"hw.switch_undo={rng.choice(['false', 'true'])}",
                     f"hw.switch_cutoff={rng.choice([7, 15, 31, 63, 127])}",
                     f"hw.switch_reset={rng.choice(['false', 'true'])}",
                     f"hw.switch_rate={rng.choice([1.0, 0.5, 0.25])}"]
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
