"""Memory ports driven by several phases of the top level (:mod:`rtl_gen.top`): a multiplexer of callers
(:class:`PortMux`), a narrow memory packed into the lanes of a wider one (:class:`PackedPort`), one layer's region
of a memory every layer shares (:class:`OffsetPort`), and a stream whose payload is assigned field by field
(:class:`StreamView`).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Mux, Signal

__all__ = ["OffsetPort", "PackedPort", "PortMux", "StreamView"]


class PortMux:
    """Drivers of one memory port from several phases: ``add(cond, **values)``; ``emit`` assigns them in an
    if/elif chain (conditions are mutually exclusive; the first listed wins).

    ``late`` (a write port): every caller's condition and values are registered where the caller is, and the
    chain picks among the registers, so each write reaches the memory a cycle after its caller asked for it. The
    callers' stream logic then ends at flip-flops beside them, and the memory's address, data and enable come from
    flip-flops through the chain alone (the routed SMALL design's failing paths had ended at the Y/dX buffer's
    distributed RAM, 832 endpoints at 80 MHz: a writer's ``valid`` -> the multiplexer -> the write address and data
    of 38 RAM slices across the die). A word written in cycle ``t`` can be read from cycle ``t + 2`` on: the top
    level's phases read nothing that soon after writing it (the whole-step tests check every phase).

    ``late=2`` registers the chain's output as well, so the memory's write address, data and enable come straight
    from flip-flops: a write reaches the memory two cycles after its caller, and is readable from ``t + 3`` on.
    For a memory of many distributed-RAM slices (YDX: 38 at SMALL's widths), whose write address reaches every
    slice: with ``late=1`` the chain's LUTs sat in front of that net (13.8 ns, 12.6 of it routing, the routed
    SMALL design's worst path at seed 1)."""

    def __init__(self, port, name: str, *, late: int = 0):
        if late not in (0, 1, 2):
            raise ValueError(f"PortMux {name}: late is 0, 1 or 2 register stages, not {late!r}")
        self.port = port
        self.name = name
        self.late = late
        self.cases: list[tuple] = []

    def add(self, cond, **values):
        self.cases.append((cond, values))

    def emit(self, m):
        first = True
        full = len(getattr(self.port, "en", Const(0, 1))) > 1  # a write port with lanes: en=1 writes all of them
        cases = []
        for i, (cond, values) in enumerate(self.cases):
            if full and isinstance(values.get("en"), int) and values["en"] == 1:
                values = {**values, "en": Const(-1, len(self.port.en))}
            if self.late:
                held = Signal(name=f"{self.name}_c{i}_q")
                m.d.sync += held.eq(cond)
                regs = {}
                for k, v in values.items():
                    r = Signal.like(getattr(self.port, k), name=f"{self.name}_c{i}_{k}_q", reset_less=k != "en")
                    m.d.sync += r.eq(v)
                    regs[k] = r
                cond, values = held, regs
            cases.append((cond, values))
        keys = list(dict.fromkeys(k for _, values in cases for k in values))  # in order: the Verilog is reproducible
        if self.late == 2:  # the chain into registers; the port from them
            out = {k: Signal.like(getattr(self.port, k), name=f"{self.name}_{k}_q", reset_less=k != "en")
                   for k in keys}
            nxt = {k: Signal.like(v, name=f"{self.name}_{k}_next") for k, v in out.items()}
            m.d.sync += [out[k].eq(nxt[k]) for k in keys]
            m.d.comb += [getattr(self.port, k).eq(out[k]) for k in keys]
        else:
            nxt = {k: getattr(self.port, k) for k in keys}
        for cond, values in cases:
            ctx = m.If(cond) if first else m.Elif(cond)
            with ctx:
                m.d.comb += [nxt[k].eq(v) for k, v in values.items()]
            first = False


class PackedPort:
    """A narrow memory seen through a :class:`PortMux` of a wider one: word ``a`` of the narrow memory is lane
    ``a mod n`` (``gran`` bits) of row ``base + a div n`` (``n`` a power of two; the wide write port has lanes of
    ``gran`` bits). ``add`` as a :class:`PortMux`. The callers are multiplexed at the narrow width and reach the
    wide port as one caller (a write's data is replicated into every lane after the multiplexer, its lane
    enabled). ``port.data`` (read) is the lane of the last row read, which holds while no read is issued (the
    read port contract)."""

    def __init__(self, mux: PortMux, *, base: int, n: int, gran: int, width: int, read: bool):
        self.mux, self.base, self.n, self.gran, self.width, self.read = mux, base, n, gran, width, read
        self.shift = n.bit_length() - 1
        self.cases: list[tuple] = []
        name = mux.name
        self.port = SimpleNamespace(data=Signal(width, name=f"{name}_packed_data"))
        self._any = Signal(name=f"{name}_packed_any")
        self._addr = Signal(len(mux.port.addr), name=f"{name}_packed_addr")
        self._en = Signal(name=f"{name}_packed_en")
        self._lane = Signal(range(max(n, 2)), name=f"{name}_packed_lane")
        if read:
            mux.add(self._any, addr=self._addr, en=self._en)
        else:
            self._data = Signal(width, name=f"{name}_packed_wdata")
            word = Cat(*([self._data, Const(0, gran - width)] * n))
            mux.add(self._any, addr=self._addr, data=word, en=Mux(self._en, Const(1, n) << self._lane, 0))

    def add(self, cond, addr, en, data=None):
        self.cases.append((cond, addr, en, data))

    def emit(self, m):
        lane = Signal.like(self._lane, name=f"{self.mux.name}_packed_next_lane")
        for i, (cond, addr, en, data) in enumerate(self.cases):
            with (m.If if i == 0 else m.Elif)(cond):
                m.d.comb += [self._any.eq(1), self._addr.eq(self.base + (addr >> self.shift)), self._en.eq(en),
                             lane.eq(addr[: self.shift] if self.shift else 0)]
                if not self.read:
                    m.d.comb += self._data.eq(data)
        if not self.read:
            m.d.comb += self._lane.eq(lane)
            return
        with m.If(self._any & self._en):
            m.d.sync += self._lane.eq(lane)
        with m.Switch(self._lane):
            for i in range(self.n):
                with m.Case(i):
                    m.d.comb += self.port.data.eq(self.mux.port.data[i * self.gran:i * self.gran + self.width])


class OffsetPort:
    """One layer's view of a :class:`PortMux` of a memory that holds every layer's words from ``base`` on:
    ``add`` offsets the address; ``port`` is the shared port (its data)."""

    def __init__(self, mux: PortMux, base: int):
        self.mux, self.base = mux, base

    @property
    def port(self):
        return self.mux.port

    def add(self, cond, addr, **values):
        self.mux.add(cond, addr=addr + self.base, **values)

    def emit(self, m):
        pass  # the shared PortMux assigns the port


class StreamView:
    """``valid``/``ready`` of a stream whose payload is assigned field by field (for :func:`fork`)."""

    def __init__(self, valid, ready):
        self.valid = valid
        self.ready = ready
