"""AXI4-Lite slave for the register map: how the Zynq processing system (an AXI master, through
``M_AXI_GP0`` and an AXI interconnect) reads and writes the accelerator's control and status registers.

- :class:`AXI4LiteSignature`: the AXI4-Lite channels, seen from the master.
- :class:`AXI4LiteCSRBridge`: AXI4-Lite slave to :class:`rtl_gen.regmap.CSRBusSignature`.
- :class:`AXI4LiteCSR`: bridge plus :class:`rtl_gen.regmap.CSRBank` for a map; the block a top level
  instantiates.
- :func:`vivado_ports`: port names for a Verilog export that Vivado's block design recognises.

Behaviour of the slave (32-bit data only, the width of the Zynq GP ports):

- AW, W and AR each have a one-entry holding register; ``awready``/``wready``/``arready`` are high
  whenever it is empty, independent of every other channel (so AW and W may arrive in either order or
  together; neither waits for the other).
- A write executes once both its address and data are held and the B channel is free; ``bvalid``
  then stays high, ``bresp`` stable, until ``bready``. One write and one read may be in flight at the
  same time; when both are ready to execute in the same cycle they take turns.
- A read executes once its address is held and the R channel is free; ``rvalid``/``rdata``/``rresp``
  then stay stable until ``rready``.
- Responses: ``OKAY`` (0), or ``SLVERR`` (2) for an address no register occupies, and for a write to a
  register with no writable field (nothing changes). Unmapped reads return 0. The low two address bits
  are ignored (the access covers the aligned word; ``wstrb`` selects bytes). ``awprot``/``arprot`` are
  accepted and ignored.
- Every output comes from a register: no combinational path from any input to any output.

Latency without backpressure: a read answers (``rvalid``) three cycles after the ``arvalid`` handshake
cycle; a write responds (``bvalid``) three cycles after the later of the AW and W handshakes. The access is
chosen in one cycle and reaches the register bus from registers in the next (``bus``: address, strobes and
data all registered), so the bank's address decode starts at flip-flops.

Verilog port names: a component member ``s_axi`` of this signature becomes ``s_axi__awaddr``,
``s_axi__awvalid``, ... with Amaranth's default export, or ``s_axi_awaddr``, ... (the AXI names Vivado
infers an interface from) with ``to_verilog(c, name, ports=vivado_ports(c))``. Clock and reset are
``clk`` and ``rst`` (active high, synchronous): in a block design, connect ``clk`` to the AXI clock and
``rst`` to ``peripheral_reset`` of a Processor System Reset block (not the active-low ``aresetn``).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.hdl import ValueCastable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .regmap import DATA_WIDTH, CSRBank, CSRBusSignature, RegisterMap, regs_signature

__all__ = [
    "RESP_OKAY",
    "RESP_SLVERR",
    "AXI4LiteCSR",
    "AXI4LiteCSRBridge",
    "AXI4LiteSignature",
    "vivado_ports",
]

RESP_OKAY = 0b00
RESP_SLVERR = 0b10

#: Order of the AXI4-Lite signals (as in the AMBA specification), used for exports and documentation.
AXI4LITE_SIGNALS = (
    "awaddr", "awprot", "awvalid", "awready",
    "wdata", "wstrb", "wvalid", "wready",
    "bresp", "bvalid", "bready",
    "araddr", "arprot", "arvalid", "arready",
    "rdata", "rresp", "rvalid", "rready",
)  # fmt: skip


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite, seen from the master (a slave port is ``In(AXI4LiteSignature(...))``).

    Members: ``awaddr``, ``awprot``, ``awvalid``, ``awready``, ``wdata``, ``wstrb``, ``wvalid``,
    ``wready``, ``bresp``, ``bvalid``, ``bready``, ``araddr``, ``arprot``, ``arvalid``, ``arready``,
    ``rdata``, ``rresp``, ``rvalid``, ``rready`` (lower-case AMBA names). Data is 32 bits.
    """

    def __init__(self, *, addr_width: int):
        if not isinstance(addr_width, int) or isinstance(addr_width, bool) or not 3 <= addr_width <= 32:
            raise ValueError(f"addr_width must be an integer in 3..32, not {addr_width!r}")
        self._addr_width = addr_width
        dw = DATA_WIDTH
        super().__init__(
            {
                "awaddr": Out(addr_width),
                "awprot": Out(3),
                "awvalid": Out(1),
                "awready": In(1),
                "wdata": Out(dw),
                "wstrb": Out(dw // 8),
                "wvalid": Out(1),
                "wready": In(1),
                "bresp": In(2),
                "bvalid": In(1),
                "bready": Out(1),
                "araddr": Out(addr_width),
                "arprot": Out(3),
                "arvalid": Out(1),
                "arready": In(1),
                "rdata": In(dw),
                "rresp": In(2),
                "rvalid": In(1),
                "rready": Out(1),
            }
        )

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def __eq__(self, other):
        return type(other) is type(self) and other.addr_width == self.addr_width

    def __repr__(self):
        return f"AXI4LiteSignature(addr_width={self._addr_width})"


class AXI4LiteCSRBridge(wiring.Component):
    """AXI4-Lite slave driving a register bus (see the module docstring for its behaviour).

    Parameters:
        addr_width: byte-address bits (both buses).

    Ports:
        s_axi: ``In(AXI4LiteSignature(addr_width=addr_width))``.
        bus: ``Out(CSRBusSignature(addr_width=addr_width))``.
    """

    def __init__(self, *, addr_width: int):
        super().__init__(
            {
                "s_axi": In(AXI4LiteSignature(addr_width=addr_width)),
                "bus": Out(CSRBusSignature(addr_width=addr_width)),
            }
        )
        self._addr_width = addr_width

    @property
    def addr_width(self) -> int:
        return self._addr_width

    def elaborate(self, platform):
        m = Module()
        axi, bus = self.s_axi, self.bus

        aw_full = Signal()
        aw_addr = Signal(self._addr_width)
        w_full = Signal()
        w_data = Signal(DATA_WIDTH)
        w_strb = Signal(DATA_WIDTH // 8)
        ar_full = Signal()
        ar_addr = Signal(self._addr_width)
        b_valid = Signal()
        b_resp = Signal(2)
        r_valid = Signal()
        r_data = Signal(DATA_WIDTH)
        r_resp = Signal(2)
        read_first = Signal()  # turn-taking when a read and a write are both ready to execute
        bus_w = Signal()  # the bus cycle of a write
        bus_r = Signal()  # the bus cycle of a read
        bus_addr = Signal(self._addr_width)
        bus_data = Signal(DATA_WIDTH)
        bus_strb = Signal(DATA_WIDTH // 8)

        m.d.comb += [
            axi.awready.eq(~aw_full),
            axi.wready.eq(~w_full),
            axi.arready.eq(~ar_full),
            axi.bvalid.eq(b_valid),
            axi.bresp.eq(b_resp),
            axi.rvalid.eq(r_valid),
            axi.rdata.eq(r_data),
            axi.rresp.eq(r_resp),
        ]

        with m.If(axi.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(axi.awaddr)]
        with m.If(axi.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), w_data.eq(axi.wdata), w_strb.eq(axi.wstrb)]
        with m.If(axi.arvalid & ~ar_full):
            m.d.sync += [ar_full.eq(1), ar_addr.eq(axi.araddr)]

        # An access is chosen in one cycle and put on the bus from registers in the next; its response is taken in
        # that bus cycle. The bank's address decode then starts at flip-flops (the chosen-access logic in front of
        # every register's clock enable closed below 80 MHz in context on the ECP5 proxy).
        can_write = aw_full & w_full & ~b_valid & ~bus_w  # bus_w: the previous write's response is not out yet
        can_read = ar_full & ~r_valid & ~bus_r
        do_write = Signal()
        do_read = Signal()
        m.d.comb += [
            do_write.eq(can_write & ~(can_read & read_first)),
            do_read.eq(can_read & ~do_write),
            bus.addr.eq(bus_addr),
            bus.w_stb.eq(bus_w),
            bus.w_data.eq(bus_data),
            bus.w_strb.eq(bus_strb),
            bus.r_stb.eq(bus_r),
        ]
        m.d.sync += [bus_w.eq(do_write), bus_r.eq(do_read)]
        with m.If(do_write | do_read):
            m.d.sync += bus_addr.eq(Mux(do_write, aw_addr, ar_addr))
        with m.If(do_write):
            m.d.sync += [
                aw_full.eq(0),
                w_full.eq(0),
                bus_data.eq(w_data),
                bus_strb.eq(w_strb),
                read_first.eq(1),
            ]

        with m.If(bus_w):
            m.d.sync += [b_valid.eq(1), b_resp.eq(Mux(bus.w_ok, RESP_OKAY, RESP_SLVERR))]
        with m.Elif(axi.bready):
            m.d.sync += b_valid.eq(0)

        with m.If(do_read):
            m.d.sync += [ar_full.eq(0), read_first.eq(0)]
        with m.If(bus_r):
            m.d.sync += [
                r_valid.eq(1),
                r_data.eq(Mux(bus.r_ok, bus.r_data, 0)),
                r_resp.eq(Mux(bus.r_ok, RESP_OKAY, RESP_SLVERR)),
            ]
        with m.Elif(axi.rready):
            m.d.sync += r_valid.eq(0)
        return m


class AXI4LiteCSR(wiring.Component):
    """The registers of ``regmap`` behind an AXI4-Lite slave port.

    Ports:
        s_axi: ``In(AXI4LiteSignature(addr_width=regmap.addr_width))``.
        regs: ``Out(regs_signature(regmap))``, the datapath side of :class:`rtl_gen.regmap.CSRBank`
            (Verilog ``regs__<register>__<field>``).
    """

    def __init__(self, regmap: RegisterMap):
        if not isinstance(regmap, RegisterMap):
            raise TypeError(f"regmap must be a RegisterMap, not {regmap!r}")
        self._regmap = regmap
        super().__init__(
            {
                "s_axi": In(AXI4LiteSignature(addr_width=regmap.addr_width)),
                "regs": Out(regs_signature(regmap)),
            }
        )

    @property
    def regmap(self) -> RegisterMap:
        return self._regmap

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = AXI4LiteCSRBridge(addr_width=self._regmap.addr_width)
        m.submodules.bank = bank = CSRBank(self._regmap)
        wiring.connect(m, wiring.flipped(self.s_axi), bridge.s_axi)
        wiring.connect(m, bridge.bus, bank.bus)
        wiring.connect(m, wiring.flipped(self.regs), bank.regs)
        return m


def vivado_ports(component: wiring.Component, *, axi_members=("s_axi",)) -> dict:
    """A ``ports=`` mapping for :func:`rtl_gen.toolchain.to_verilog` that names AXI ports the way
    Vivado expects (``s_axi_awaddr``: one underscore) and every other port as Amaranth does
    (``regs__ctrl__start``). ``axi_members`` are the top-level members holding an AXI4-Lite interface.
    Clock and reset keep their names (``clk``, ``rst``).
    """
    ports = {}
    for path, _member, value in component.signature.flatten(component):
        if isinstance(value, ValueCastable):
            value = value.as_value()
        sep = "_" if path[0] in axi_members else "__"
        name = sep.join(map(str, path))
        if name in ports:
            raise ValueError(f"port name {name!r} occurs twice in {component!r}")
        ports[name] = (value, None)  # direction follows from the drivers, as in Amaranth's own export
    return ports
