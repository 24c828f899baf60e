"""Bit-exact integer model of the accelerator's training step (the hardware arithmetic contract).

See ``docs/arithmetic.md``. Modules: :mod:`.arith` (datapath functions), :mod:`.rng`
(xorshift32 generator bank), :mod:`.optim` (hardware optimisers, beta update),
:mod:`.widths` (derived register widths), :mod:`.model` (the whole step),
:mod:`.engine` (the :class:`sim.train_loop.TrainEngine`), :mod:`.memory` (on-chip memory).
"""
