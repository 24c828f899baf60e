"""Cells that the generated Verilog instantiates by name and that each flow maps to its family's primitive.

One so far, the **global buffer** (:data:`GLOBAL_BUFFER`): the accelerator's units take their synchronous reset
from one flip-flop (rtl_gen/top.py, docs/architecture.md section 9), a net with one load per unit flip-flop that
has a reset, about 14,000 in the SMALL design before the payload registers lost theirs. Routed in the fabric it is
the largest net after the clock and crowds the routing around every unit. The generated Verilog passes it through
a module of this name:

- for simulators (Verilator), Vivado and Yosys' generic flows the module is a wire (:func:`global_buffer_verilog`
  with ``family=None``, appended to the design's Verilog); Vivado replicates a high-fanout register itself;
- the ECP5 flow (boards/ecp5.py) reads ``family="ecp5"`` over it with ``read_verilog -overwrite``: a ``DCCA``, the
  clock-network buffer, so nextpnr-ecp5 routes the reset on a global network (it promotes only clock nets by itself).
"""

from __future__ import annotations

__all__ = ["GLOBAL_BUFFER", "global_buffer_verilog"]

#: the module name of the global buffer; ports ``i`` (from a flip-flop) and ``o`` (the buffered net)
GLOBAL_BUFFER = "xnt_global_buffer"

_BODIES = {
    None: "  assign o = i;\n",
    "ecp5": "  DCCA buffer (.CLKI(i), .CE(1'b1), .CLKO(o));\n",
}


def global_buffer_verilog(family: str | None = None) -> str:
    """The Verilog module :data:`GLOBAL_BUFFER` for a flow: ``None`` (a wire) or ``"ecp5"`` (a ``DCCA``)."""
    if family not in _BODIES:
        raise ValueError(f"no global buffer for the family {family!r}; known: {sorted(k for k in _BODIES if k)}")
    return f"module {GLOBAL_BUFFER}(input wire i, output wire o);\n{_BODIES[family]}endmodule\n"
