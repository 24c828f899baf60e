"""The ``[hw]`` section: parameters of the on-chip arithmetic and datapath.

Owned by the bit-exact model (sim/hw) and the generator (rtl_gen); read through
``Config.hw``. Fields are declared with :func:`sim.schema.opt` so they are
validated at load time like every other section.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import opt


@dataclass
class HwConfig:
    optimizer: str = opt("switch", choices=("switch", "bop", "iir", "sgd"), doc="hardware weight optimiser")

    def check_against(self, cfg) -> None:
        """Cross-section checks (widths that could overflow, ...); raises ConfigError."""
