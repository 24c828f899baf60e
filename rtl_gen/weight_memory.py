"""Binary weights with per-weight optimiser state and the hardware weight optimisers (docs/arithmetic.md 7, 10).

Storage (all :class:`amaranth.lib.memory.Memory`, synchronous non-transparent read ports):

* weight banks: exactly the :class:`~rtl_gen.xnor_engine.XnorEngine` layout, one bank per output lane of
  ``depth = words * groups`` rows of ``lanes_in`` bits; row ``g * words + k`` of bank ``l`` holds inputs
  ``k * lanes_in ...`` of output ``g * lanes_out + l`` (bit 1 = +1). One read port (shared by the forward
  read port, the sweep and the host, never at the same time) and one write port with a write enable per
  ``update_lanes`` bits: a simple-dual-port RAM per bank (Yosys keeps shallow banks, e.g. the 64 rows of a
  256 x 256 layer at 64 x 16 lanes, in distributed RAM; deeper ones go to block RAM).
* optimiser state: one memory per state field (``acc``; ``m``; ``m`` and ``g``; ``latent`` and ``m``; plus
  ``undo`` with ``hw.switch_undo``), each ``update_lanes * bits`` wide and ``visits`` deep (below): row ``v``
  holds the state of the weights of visit ``v``. Widths come from :func:`sim.hw.optim.state_bits`.
* switch table (switch only): ``C + 1`` entries of 17 bits, host-written, one copy with one asynchronous read
  port per update lane (distributed RAM).

Sweep order (:class:`SweepGeometry`, shared with :mod:`rtl_gen.rng`): one *visit* per cycle updates
``U = update_lanes`` weights of one bank row::

    for addr in range(depth):            # g, k = divmod(addr, words)
        for lane in range(lanes_out):    # column c = g * lanes_out + lane, skipped when c >= n_out
            for chunk in range(lanes_in // U):   # rows k * lanes_in + chunk * U + (0 .. U-1), skipped past n_in
                visit v (v = 0, 1, ...)

Every column's rows are visited in increasing order, which is the order in which each column's
generators advance (docs/arithmetic.md 8). Rows past ``n_in`` inside the last chunk are padding: the
optimiser runs on them but they are not counted and their contents are unspecified.

Commands (``cmd`` stream, accepted while idle): ``UPDATE`` consumes one gradient tile per bank row (the
:func:`grad_layout` beat of :class:`rtl_gen.po2_backward.Po2Backward`, consumed at the row's last visit) and
one random-number beat per visit (:class:`rtl_gen.rng.RngEngine`), and applies the configured optimiser
exactly as :mod:`sim.hw.optim` (with the command's ``shift`` and, for switch, its accumulation ``gate``);
``INIT`` is the power-on sweep of :meth:`sim.hw.model.HwModel.reset`
(``w = +1`` iff the number's top bit is 0, sgd latent from its low bits, every other state 0; numbers only);
``UNDO`` (switch with ``hw.switch_undo``) copies the ``undo`` field, written with each weight's value before
the last ``UPDATE``, back into the weight banks (no streams; accumulators are kept, as the contract says).
The controller issues ``UNDO`` when the re-run batch's integer loss rose. ``flips`` counts the weights the
last sweep changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np
from amaranth import Array, Cat, Const, Elaboratable, Module, Mux, Shape, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.optim import PROB_BITS, state_bits

from .buffers import split_segments
from .shared import layer_port, per_layer
from .streams import KEEP, SkidBuffer, or_tree, replicas
from .xnor_engine import WeightReadSignature, XnorGeometry, _check_int, popcount

__all__ = [
    "INIT",
    "LATENCY",
    "OP_NAMES",
    "SPACE_STATE",
    "SPACE_STATE2",
    "SPACE_TABLE",
    "STATE_SPACES",
    "SPACE_WEIGHTS",
    "UNDO",
    "UPDATE",
    "OptimizerSpec",
    "StateMemory",
    "SweepGeometry",
    "WeightMemory",
    "WeightMemoryGeometry",
    "grad_layout",
    "rng_layout",
]

INIT, UPDATE, UNDO = 0, 1, 2
OP_NAMES = {INIT: "init", UPDATE: "update", UNDO: "undo"}
SPACE_WEIGHTS, SPACE_STATE, SPACE_TABLE, SPACE_STATE2 = 0, 1, 2, 3  # host port address spaces
STATE_SPACES = (SPACE_STATE, SPACE_STATE2)
"""The host port space of each optimiser state field, in :attr:`OptimizerSpec.fields` order (at most two)."""

OPT_STAGE = 3
"""The optimiser's first stage: stage 0 issues the reads, stage 1 has the memories' outputs, stage 2 each block
RAM's word registered as it leaves the RAM (:class:`StateMemory`; the weight banks' words likewise), stage 3 the
words chosen from them and registered (timing: the state memory's block RAMs, 179 of them at the paper's widths,
are spread over the die; their output delay and the routes to one register closed at 62.5 MHz on the ECP5
proxy)."""

WRITE_STAGE = OPT_STAGE + 4
"""The pipeline stage that writes a visit back: stages :data:`OPT_STAGE` .. ``WRITE_STAGE - 2`` the optimiser on
the registered words (:meth:`WeightMemory._datapath`), stage ``WRITE_STAGE - 1`` loads the write ports' address,
data and enable registers (one set per bank and per state slice; timing: one write-back stage's op and valid bit
fanned out to every memory's write data and enables, 63.1 / 68.0 MHz at the paper's widths on the ECP5 proxy,
nextpnr seeds 1 / 2). No read-after-write
hazard at any depth: each state row is visited once per sweep, consecutive visits of one bank row write disjoint
``update_lanes`` chunks (a write enable per chunk), and the next command waits until the last write is done."""

CMD_STAGES = 1
"""Cycles from a command's transfer to the cycle the sweep takes it from its registered slice."""

BANK_COPY_STAGE = 1
"""Cycles from the weight banks' write registers (loaded in stage ``WRITE_STAGE - 1``) to their write: the write
ports' pins come from copies of those registers (a copy per bank), loaded a cycle later with no logic between,
which the placer can put beside the bank's block RAMs."""

LATENCY = CMD_STAGES + WRITE_STAGE + 1 + BANK_COPY_STAGE
"""Cycles of a sweep beyond one per visit, counted from the cycle the command is transferred to the last
cycle ``busy`` is high (both included): ``visits + LATENCY`` with no stalls (the command's slice, the cycle the
sweep takes it, then per visit stages 0 .. :data:`WRITE_STAGE` and the banks' write copies,
:data:`BANK_COPY_STAGE`)."""

STATE_SEGMENT = 16384
"""Words of a :class:`StateMemory` segment: the ECP5 block RAM's deepest mode (16,384 x 1) and a multiple of the
7-series' 4,096 x 9, so that a segment is no deeper than one block RAM and the segments take no more block RAMs
than one memory would."""

GROUP_LANES = 4
"""Lanes of a group in the two-step choices among the banks' lanes: the sweep's gradient (stage 1 a lane in each
group, stage 2 the group) and a host read's bank word (a bank in each group, then the group)."""

MAX_CUTOFF = 1023  # the switch table lives in distributed RAM, one copy per update lane


def grad_layout(bank: XnorGeometry) -> data.StructLayout:
    """Gradient tile of one bank row: ``g[lane][bit]`` is ``sgn(dW)`` of input ``k * lanes_in + bit``,
    output ``g * lanes_out + lane`` (signed 2 bits: -1, 0, +1), and ``last`` (last row)."""
    return data.StructLayout(
        {"g": data.ArrayLayout(data.ArrayLayout(signed(2), bank.lanes_in), bank.lanes_out), "last": 1}
    )


def rng_layout(update_lanes: int) -> data.StructLayout:
    """Random numbers of one visit: ``u[j]`` (32 bits) for the visit's row ``j``, 0 for padding rows;
    ``last`` marks the sweep's last visit."""
    return data.StructLayout({"u": data.ArrayLayout(32, update_lanes), "last": 1})


@dataclass(frozen=True, kw_only=True)
class SweepGeometry:
    """The update sweep over one layer's weight banks: :class:`XnorGeometry` ``bank`` and ``update_lanes``
    (weights per visit, a divisor of ``bank.lanes_in``). See the module docstring for the order."""

    bank: XnorGeometry
    update_lanes: int

    def __post_init__(self):
        if not isinstance(self.bank, XnorGeometry):
            raise TypeError(f"bank must be an XnorGeometry, not {self.bank!r}")
        _check_int("update_lanes", self.update_lanes, 1, self.bank.lanes_in)
        if self.bank.lanes_in % self.update_lanes:
            raise ValueError(f"update_lanes must divide lanes_in = {self.bank.lanes_in}, not {self.update_lanes}")

    @property
    def chunks(self) -> int:
        """Visits per bank row and lane, ``lanes_in // update_lanes``."""
        return self.bank.lanes_in // self.update_lanes

    @property
    def chunks_last(self) -> int:
        """Visits per lane of a last-word row (rows past ``n_in`` are skipped)."""
        b = self.bank
        return -(-(b.n_in - (b.words - 1) * b.lanes_in) // self.update_lanes)

    @property
    def valid_last(self) -> int:
        """Real rows in the last chunk of the last word."""
        b = self.bank
        return b.n_in - (b.words - 1) * b.lanes_in - (self.chunks_last - 1) * self.update_lanes

    @property
    def lanes_last(self) -> int:
        """Real lanes of the last group."""
        b = self.bank
        return b.n_out - (b.groups - 1) * b.lanes_out

    @property
    def visits(self) -> int:
        """Visits per sweep: ``n_out * ceil(n_in / update_lanes)``."""
        return self.bank.n_out * -(-self.bank.n_in // self.update_lanes)

    def cycles(self) -> int:
        """Cycles of one sweep without stalls (see :data:`LATENCY`)."""
        return self.visits + LATENCY

    @cached_property
    def table(self) -> dict[str, np.ndarray]:
        """The visits in order: arrays ``addr``, ``lane``, ``chunk``, ``row`` (first row), ``col``."""
        b, U = self.bank, self.update_lanes
        out = {key: [] for key in ("addr", "lane", "chunk", "row", "col")}
        for addr in range(b.depth):
            g, k = divmod(addr, b.words)
            for lane in range(b.lanes_out):
                col = g * b.lanes_out + lane
                if col >= b.n_out:
                    continue
                for chunk in range(self.chunks):
                    row = k * b.lanes_in + chunk * U
                    if row >= b.n_in:
                        continue
                    for key, v in zip(out, (addr, lane, chunk, row, col), strict=True):
                        out[key].append(v)
        return {key: np.asarray(v, dtype=np.int64) for key, v in out.items()}

    def gather(self, a, pad: int = 0) -> np.ndarray:
        """Per-weight array ``a`` of shape ``(n_in, n_out)`` in sweep order: ``(visits, update_lanes)``."""
        a = np.asarray(a)
        if a.shape != (self.bank.n_in, self.bank.n_out):
            raise ValueError(f"expected shape {(self.bank.n_in, self.bank.n_out)}, not {a.shape}")
        t = self.table
        rows = t["row"][:, None] + np.arange(self.update_lanes)[None, :]
        ok = rows < self.bank.n_in
        out = np.full(rows.shape, pad, dtype=a.dtype)
        out[ok] = a[rows[ok], np.broadcast_to(t["col"][:, None], rows.shape)[ok]]
        return out

    def scatter(self, v) -> np.ndarray:
        """Inverse of :meth:`gather` (padding dropped)."""
        v = np.asarray(v)
        t = self.table
        rows = t["row"][:, None] + np.arange(self.update_lanes)[None, :]
        ok = rows < self.bank.n_in
        out = np.zeros((self.bank.n_in, self.bank.n_out), dtype=v.dtype)
        out[rows[ok], np.broadcast_to(t["col"][:, None], rows.shape)[ok]] = v[ok]
        return out

    def valid_mask(self) -> np.ndarray:
        """``(visits, update_lanes)`` bool: which positions are real weights."""
        rows = self.table["row"][:, None] + np.arange(self.update_lanes)[None, :]
        return rows < self.bank.n_in


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """The configured hardware optimiser's constants (from ``cfg.hw``; see :meth:`from_hw`).

    ``fields``: per-weight state fields ``(name, bits)`` in memory order (all signed except ``undo``).
    The per-sweep values that follow the learning-rate schedule are not here; they come with the ``UPDATE``
    command (what :meth:`sim.hw.model.HwModel._update_weights` passes to :mod:`sim.hw.optim`): its ``shift`` is
    ``bop``: the EMA shift ``min(hw.bop_shift + ratio_shift(ratio), 16)``; ``iir``: the alpha shift
    ``hw.iir_alpha_shift + decay``; ``sgd``: ``lr_shift(lr)`` clamped to 63; its ``gate`` (switch) is
    ``switch_gate(ratio)`` in 1 .. 2^16: an accumulator takes its increment only where ``(u & 0xFFFF) < gate``
    (2^16 = always). The switch table (the configured lambda, not scaled) is written through the host port.
    """

    kind: str
    fields: tuple[tuple[str, int], ...]
    cutoff: int = 0
    reset: bool = False
    undo: bool = False
    frac: int = 0  # bop F, iir Fm, sgd momentum Fm
    tau: int = 0  # bop threshold in Q.F
    gamma_shift: int = 0  # iir first EMA
    g_frac: int = 0  # iir FG
    latent_frac: int = 0  # sgd L - 1
    mom_shift: int = 0  # sgd momentum shift (0 = none)
    init_shift: int = 0  # sgd initial latent magnitude

    @classmethod
    def from_hw(cls, h) -> OptimizerSpec:
        """From the ``[hw]`` section (:class:`sim.hw_config.HwConfig`); field widths from
        :func:`sim.hw.optim.state_bits`."""
        bits = state_bits(h)

        def pick(word: str) -> int:
            found = [v for key, v in bits.items() if word in key]
            if len(found) != 1:
                raise RuntimeError(f"sim.hw.optim.state_bits has no single field containing {word!r}: {bits}")
            return int(found[0])

        kind = h.optimizer
        if kind == "switch":
            if h.switch_cutoff > MAX_CUTOFF:
                raise ValueError(
                    f"hw.switch_cutoff = {h.switch_cutoff} is too large for the RTL table; limit {MAX_CUTOFF}"
                )
            fields = [("acc", pick("accumulator"))] + ([("undo", pick("undo"))] if h.switch_undo else [])
            return cls(
                kind=kind, fields=tuple(fields), cutoff=h.switch_cutoff, reset=h.switch_reset, undo=h.switch_undo
            )
        if kind == "bop":
            return cls(
                kind=kind,
                fields=(("m", pick("ema m")),),
                frac=h.bop_frac_bits,
                tau=int(round(h.bop_threshold * (1 << h.bop_frac_bits))),
            )
        if kind == "iir":
            return cls(
                kind=kind,
                fields=(("m", pick("ema m")), ("g", pick("filter g"))),
                frac=h.iir_m_frac_bits,
                gamma_shift=h.iir_gamma_shift,
                g_frac=h.iir_g_frac_bits,
            )
        if kind == "sgd":
            fields = [("latent", pick("latent"))] + ([("m", pick("momentum"))] if h.sgd_momentum_shift > 0 else [])
            return cls(
                kind=kind,
                fields=tuple(fields),
                frac=h.sgd_momentum_frac_bits,
                latent_frac=h.sgd_latent_bits - 1,
                mom_shift=h.sgd_momentum_shift,
                init_shift=h.sgd_init_shift,
            )
        raise ValueError(f"hw.optimizer = {kind!r} has no RTL update unit")

    @property
    def field_bits(self) -> dict[str, int]:
        return dict(self.fields)

    def field_shape(self, name: str) -> Shape:
        return unsigned(1) if name == "undo" else signed(self.field_bits[name])


@dataclass(frozen=True, kw_only=True)
class WeightMemoryGeometry:
    """Everything the host and the hardware need to agree on: ``sweep`` (:class:`SweepGeometry`) and
    ``optimizer`` (:class:`OptimizerSpec`), the port layouts derived from them, and the packing of state rows."""

    sweep: SweepGeometry
    optimizer: OptimizerSpec

    def __post_init__(self):
        if not isinstance(self.sweep, SweepGeometry):
            raise TypeError(f"sweep must be a SweepGeometry, not {self.sweep!r}")
        if not isinstance(self.optimizer, OptimizerSpec):
            raise TypeError(f"optimizer must be an OptimizerSpec, not {self.optimizer!r}")

    @classmethod
    def from_config(
        cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, update_lanes: int
    ) -> WeightMemoryGeometry:
        """Weight layer ``layer_index`` of ``cfg``: shape from ``cfg.weight_layers()``, optimiser from ``cfg.hw``."""
        layers = cfg.weight_layers()
        _check_int("layer_index", layer_index, 0, len(layers) - 1)
        n_in, n_out = layers[layer_index].weight_shape
        bank = XnorGeometry(n_in=n_in, n_out=n_out, lanes_in=lanes_in, lanes_out=lanes_out)
        return cls(sweep=SweepGeometry(bank=bank, update_lanes=update_lanes), optimizer=OptimizerSpec.from_hw(cfg.hw))

    @property
    def bank(self) -> XnorGeometry:
        return self.sweep.bank

    cmd_layout = data.StructLayout({"op": 2, "shift": 6, "gate": PROB_BITS + 1})

    @property
    def state_layout(self) -> data.StructLayout:
        """One state row: per field (in :attr:`OptimizerSpec.fields` order) ``update_lanes`` values."""
        U, opt = self.sweep.update_lanes, self.optimizer
        return data.StructLayout({name: data.ArrayLayout(opt.field_shape(name), U) for name, _ in opt.fields})

    def field_width(self, name: str) -> int:
        """Bits of one state row of field ``name`` (``update_lanes`` values)."""
        return self.sweep.update_lanes * self.optimizer.field_shape(name).width

    def field_space(self, name: str) -> int:
        """The host port space of state field ``name`` (:data:`STATE_SPACES`)."""
        return STATE_SPACES[[n for n, _ in self.optimizer.fields].index(name)]

    @property
    def data_width(self) -> int:
        """Host port data: a weight row, one state field's row, or a table entry (whichever is widest)."""
        table = PROB_BITS + 1 if self.optimizer.kind == "switch" else 0
        return max([self.bank.lanes_in, table] + [self.field_width(n) for n, _ in self.optimizer.fields])

    @property
    def host_layout(self) -> data.StructLayout:
        """Host port payload: ``write``, ``space``, ``lane``, ``addr``, ``data``."""
        n_addr = max(self.bank.depth, self.sweep.visits, self.optimizer.cutoff + 1)
        return data.StructLayout(
            {"write": 1, "space": 2, "lane": range(self.bank.lanes_out), "addr": range(n_addr), "data": self.data_width}
        )

    def pack_state(self, state: dict[str, np.ndarray]) -> dict[str, list[int]]:
        """Per field, its host rows (one int per visit, the field's space) from per-weight arrays
        ``{field: (n_in, n_out)}``."""
        out = {}
        U = self.sweep.update_lanes
        for name, _ in self.optimizer.fields:
            width = self.optimizer.field_shape(name).width
            v = self.sweep.gather(np.asarray(state[name], dtype=np.int64)) & ((1 << width) - 1)
            words = np.zeros(self.sweep.visits, dtype=object)
            for j in range(U):
                words += v[:, j].astype(object) << (j * width)
            out[name] = words.tolist()
        return out

    def unpack_state(self, rows: dict[str, list[int]]) -> dict[str, np.ndarray]:
        """Inverse of :meth:`pack_state` (padding positions dropped)."""
        out = {}
        U = self.sweep.update_lanes
        for name, words in rows.items():
            shape = self.optimizer.field_shape(name)
            width = shape.width
            v = np.zeros((len(words), U), dtype=np.int64)
            for i, w in enumerate(words):
                for j in range(U):
                    x = (int(w) >> (j * width)) & ((1 << width) - 1)
                    if shape.signed and x >> (width - 1):
                        x -= 1 << width
                    v[i, j] = x
            out[name] = self.sweep.scatter(v)
        return out


class _CountedPort:
    """A port of a :class:`StateMemory` whose address is a register: it takes ``addr`` after a cycle with
    ``load`` high, else steps by one after a cycle with ``inc`` high. Read port: ``data`` is the word read two
    cycles before (it reads every cycle). Write port: ``data`` given in a cycle with ``en`` high is written in the
    next cycle, at the address the register holds then (``data`` and ``en`` are registered first)."""

    def __init__(self, shape, depth: int, name: str, copies: int = 0):
        self.load = Signal(name=f"{name}_load")
        self.addr = Signal(range(max(depth, 2)), name=f"{name}_addr")
        self.inc = Signal(name=f"{name}_inc")
        # with copies: one ``inc`` per address register (``incs[i]`` for the i-th, see StateMemory.counters),
        # driven by the owner from copies of its own (timing: one increment fanned out to every slice's counter)
        self.incs = [Signal(name=f"{name}_inc{i}") for i in range(copies)]
        self.en = Signal(name=f"{name}_en")
        self.data = Signal(shape, name=f"{name}_data")


NO_RW_CHECK = {"no_rw_check": 1}
"""Memory attributes for Yosys: no read-during-write logic on the memory's ports (its synchronous read of an
address written in the same cycle may give the old or the new word). The weight memory's memories need none:
a state row is read and written once per sweep, stages apart, and the host port and the forward read port run
only while no sweep does; a bank row is read while another visit writes a chunk of it (the visits of one row
follow each other), but the read uses only its own chunk, whose bits that write does not enable. Timing: the
logic was on the bank's read path (61.8 MHz at the paper's widths on the ECP5 proxy)."""


class StateMemory(Elaboratable):
    """An optimiser state memory: ``depth`` words, one read port (``read``) and one write port (``write``), each a
    :class:`_CountedPort` (its address a register that loads or counts); the memory reads every cycle, read data
    two cycles after the read.

    Its words are kept in segments of at most ``segment`` words (the bulk of whole ``block``-word blocks, as
    :class:`rtl_gen.buffers.SplitMemory`, cut into segments, then the tail), each cut into slices of at most
    ``slice_bits`` bits of the word, each slice its own memory with its own copy of the address registers (the
    address minus the segment's base, counting by itself: the synthesis keeps the copies apart) and a register
    and write data and write enable registers of its own (loaded a cycle before the write under the slice's own
    enable, the write address in the segment); each segment's word is registered as it leaves its block
    RAM, and the segment of the address read is chosen from these registers a
    cycle later. A deep memory is many block RAMs over the die: the registers let each RAM's output delay and the
    route to the choice fall in different cycles, and no logic sits between the address registers and the RAMs'
    address, data and write enable pins (timing: a read enable or an address multiplexer fanning out to 179 block
    RAMs closed at 54 and 63 MHz at the paper's widths on the ECP5 proxy, the write enable at 68 MHz).

    With ``inc_copies`` each address register steps on an increment of its own (the ports' ``incs``, one per
    register, :attr:`counters` of them, in segment then slice order; ``inc`` is unused): the owner drives them
    from copies of its own registers."""

    def __init__(self, *, shape, depth: int, name: str = "state", segment: int = STATE_SEGMENT, block: int = 4096,
                 slice_bits: int = 8, inc_copies: bool = False):
        _check_int("slice_bits", slice_bits, 1, 4096)
        self.slice_bits = slice_bits
        if segment % block:
            raise ValueError(f"segment ({segment}) must be a multiple of block ({block})")
        bulk, *tail = split_segments(depth, block)
        self.segments = [(b, min(segment, bulk[1] - b)) for b in range(0, bulk[1], segment)] + tail
        self.shape, self.depth, self.name = shape, depth, name
        width = Shape.cast(shape).width
        self.counters = len(self.segments) * -(-width // slice_bits)
        """Address registers of each port: one per slice of each segment."""
        n = self.counters if inc_copies else 0
        self.read = _CountedPort(shape, depth, f"{name}_rd", n)
        self.write = _CountedPort(shape, depth, f"{name}_wr", n)

    @staticmethod
    def _counted(m: Module, port: _CountedPort, base: int, n: int, name: str, index: int):
        """``(register, whether its next value is in the segment)`` of ``port``'s address minus ``base`` modulo
        ``2^bits`` (below the segment's ``n`` words exactly when the address is in it: an address below the base
        wraps to ``2^bits - base + address``, at least the words, as base + words <= 2^bits). The flag comes from
        registers (whether the register's value and the one after it are in the segment, kept beside it) or, as the
        register loads, from the address compared with the segment's bounds on the bits above their common power of
        two (timing: the load's fan-out, then the compare of the chosen address, 14.1 ns at the paper's widths on
        the ECP5 proxy; the register's compare into every write data register's enable, 89.1 MHz)."""
        bits = len(port.addr)
        inc = port.incs[index] if port.incs else port.inc
        a = Signal(bits, name=name)
        nxt = Signal.like(a, name=f"{name}_next")
        hit = Signal(name=f"{name}_hit_next")
        h0 = Signal(name=f"{name}_in")  # a is in the segment
        h1 = Signal(name=f"{name}_in1")  # a + 1 (modulo 2^bits) is
        step2 = (a < n - 2) | (a == (1 << bits) - 2) | ((a == (1 << bits) - 1) & (n > 1))  # a + 2 is
        m.d.comb += [
            nxt.eq(Mux(port.load, port.addr - base, Mux(inc, a + 1, a))),
            hit.eq(Mux(port.load, _within(port.addr, base, base + n), Mux(inc, h1, h0))),
        ]
        m.d.sync += [a.eq(nxt), h0.eq(hit),
                     h1.eq(Mux(port.load, _within((port.addr + 1)[:bits], base, base + n), Mux(inc, step2, h1)))]
        return a, hit

    def elaborate(self, platform):
        m = Module()
        width = len(Value.cast(self.read.data))
        wdata = Value.cast(self.write.data)
        words = []
        count = 0
        for i, (base, n) in enumerate(self.segments):
            word = Signal(width, name=f"{self.name}_seg{i}_q")
            hit1, hit2 = Signal(name=f"{self.name}_seg{i}_hit1"), Signal(name=f"{self.name}_seg{i}_hit2")
            # the segment's word in slices of at most slice_bits bits, each its own memory with its own address
            # registers (timing: one register's route to a segment's 48 block RAMs took 16 ns at the paper's
            # widths on the ECP5 proxy)
            for j, lo in enumerate(range(0, width, self.slice_bits)):
                hi = min(lo + self.slice_bits, width)
                mem = Memory(shape=hi - lo, depth=max(n, 2), init=[], attrs=NO_RW_CHECK)
                m.submodules[f"seg{i}_{j}"] = mem
                rd, wr = mem.read_port(), mem.write_port()
                a, _ = self._counted(m, self.read, base, n, f"{self.name}_seg{i}_s{j}_ra", count)
                wa, whit = self._counted(m, self.write, base, n, f"{self.name}_seg{i}_s{j}_wa", count)
                count += 1
                # the write in the next cycle, if its address is in the segment: the enable and the data in
                # registers of the slice (each loads under its own enable, so the copies stay apart)
                load = Signal(name=f"{self.name}_seg{i}_s{j}_wload")
                we = Signal(name=f"{self.name}_seg{i}_s{j}_we")
                wd = Signal(hi - lo, name=f"{self.name}_seg{i}_s{j}_wd")
                m.d.comb += load.eq(self.write.en & whit)
                m.d.sync += we.eq(load)
                with m.If(load):
                    m.d.sync += wd.eq(wdata[lo:hi])
                if j == 0:
                    m.d.sync += [hit1.eq(a < n), hit2.eq(hit1)]
                m.d.comb += [
                    rd.addr.eq(a[: len(rd.addr)]), rd.en.eq(1),
                    wr.addr.eq(wa[: len(wr.addr)]), wr.data.eq(wd), wr.en.eq(we),
                ]  # fmt: skip
                m.d.sync += word[lo:hi].eq(rd.data)
            words.append(Mux(hit2, word, 0))
        m.d.comb += Value.cast(self.read.data).eq(or_tree(words))
        return m


def _within(x: Value, lo: int, hi: int) -> Value:
    """``lo <= x < hi`` for an unsigned ``x``, each bound compared on the bits of ``x`` above the largest power of two
    that divides it (a segment's bounds are multiples of its block: a few bits, no carry chain)."""

    def ge(b):
        if b <= 0:
            return Const(1)
        k = (b & -b).bit_length() - 1
        return x[k:] >= (b >> k)

    def lt(b):
        if b >= 1 << len(x):
            return Const(1)
        k = (b & -b).bit_length() - 1
        return x[k:] < (b >> k)

    return ge(lo) & lt(hi)


class WeightMemory(wiring.Component):
    """Weight banks + optimiser state + the update sweep of one dense layer (see the module docstring), or of
    several layers with one sweep datapath.

    Parameters (keyword-only): ``geometry`` (:class:`WeightMemoryGeometry`); :meth:`from_config` derives it. Or
    ``geometries``: one per layer, all with the same lanes and optimiser. Their bank rows and state rows follow
    each other in one set of banks and state memories, the sweep's geometry constants are picked by the
    ``layer`` input (hold it while the layer's work runs), and ``read`` / ``host`` addresses are within the
    selected layer. The switch table is one table for all layers (the contract has one).

    Ports:
        cmd: ``In(stream.Signature(cmd_layout))`` ``op`` (INIT / UPDATE / UNDO), ``shift`` (6 bits) and
            ``gate`` (17 bits, switch), the per-sweep values of :class:`OptimizerSpec`; through a registered
            slice, taken from it while idle (the sweep starts a cycle after the transfer).
        grad: ``In(stream.Signature(grad_layout(bank)))`` one tile per bank row (UPDATE).
        rng: ``In(stream.Signature(rng_layout(update_lanes)))`` one beat per visit (UPDATE, INIT).
        read: ``In(WeightReadSignature(bank))`` forward read port for an
            :class:`~rtl_gen.xnor_engine.XnorEngineCore` (or the po2 backward engine); valid while idle
            and no host read is in progress.
        host: ``In(stream.Signature(host_layout))`` ``write``, ``space`` (0 weights: ``lane``, ``addr`` = bank
            row, ``data`` = the row; 1 and 3 (:data:`STATE_SPACES`) the first and second state field:
            ``addr`` = visit, ``data`` = the field's ``update_lanes`` values (low bits); 2 switch table:
            ``addr`` = p, ``data`` = T[p], write only), ``lane``, ``addr``, ``data``. Requests enter a
            registered slice (two deep) and are taken from it while idle, not in the cycle after a transfer; one
            read outstanding. A state write takes effect two cycles after it is taken, a weight row's
            ``update_lanes``-bit chunks one a cycle from then on (not taken meanwhile), a read reads in the cycle
            after it (all from registers).
        host_rdata: ``Out(stream.Signature(data_width))`` one word per host read (table reads return 0).
        busy: ``Out(1)`` a sweep is running. flips: ``Out(range(n_in * n_out + 1))`` weights changed by
            the last sweep (valid once ``busy`` is low).
        layer: ``In(range(len(geometries)))`` (several layers only) the layer of every port above.
    """

    def __init__(self, *, geometry: WeightMemoryGeometry | None = None, geometries=None):
        geos = per_layer(geometry, geometries, WeightMemoryGeometry,
                         key=lambda g: (g.bank.lanes_in, g.bank.lanes_out, g.sweep.update_lanes, g.optimizer),
                         unit="WeightMemory", agree="lanes_in, lanes_out, update_lanes and optimiser")
        self._geos = geos
        self._geometry = geo = geos[0]
        # the ports are built for the deepest layer (read addresses, host addresses) and the largest flip count
        bank = max((g.bank for g in geos), key=lambda b: b.depth)
        n_addr = max(max(g.bank.depth, g.sweep.visits, g.optimizer.cutoff + 1) for g in geos)
        self._host_layout = data.StructLayout(
            {"write": 1, "space": 2, "lane": range(geo.bank.lanes_out), "addr": range(n_addr), "data": geo.data_width}
        )
        super().__init__(
            {
                **layer_port(len(geos)),
                "cmd": In(stream.Signature(geo.cmd_layout)),
                "grad": In(stream.Signature(grad_layout(bank))),
                "rng": In(stream.Signature(rng_layout(geo.sweep.update_lanes))),
                "read": In(WeightReadSignature(bank)),
                "host": In(stream.Signature(self._host_layout)),
                "host_rdata": Out(stream.Signature(geo.data_width)),
                "busy": Out(1),
                "flips": Out(range(max(g.bank.n_in * g.bank.n_out for g in geos) + 1)),
            }
        )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, update_lanes: int) -> WeightMemory:
        """The weight memory of weight layer ``layer_index`` of ``cfg`` (:meth:`WeightMemoryGeometry.from_config`)."""
        return cls(
            geometry=WeightMemoryGeometry.from_config(
                cfg, layer_index, lanes_in=lanes_in, lanes_out=lanes_out, update_lanes=update_lanes
            )
        )

    @property
    def geometry(self) -> WeightMemoryGeometry:
        """The (first) layer's geometry."""
        return self._geometry

    @property
    def geometries(self) -> list[WeightMemoryGeometry]:
        return list(self._geos)

    # --- hardware -----------------------------------------------------------------------------------------

    def elaborate(self, platform):
        geos = self._geos
        geo = self._geometry
        sw, opt = geo.sweep, geo.optimizer
        bank = sw.bank
        U, L = sw.update_lanes, bank.lanes_out
        chunks = sw.chunks
        m = Module()
        # the command and the host requests enter through registered slices (docs/architecture.md, "Timing
        # discipline": every unit registered at its boundaries): their valid bits, which come from the phase
        # wiring's and the host sequencer's decodes, end there instead of reaching the load and the clock enable
        # of every state slice's address registers (the SMALL design in context on the ECP5 proxy: the host request
        # slice's valid -> the target choice -> ``cmd_go`` / the host read -> 22 address registers' enables, 13.4
        # ns, 11.5 of it routing). A sweep starts, and a host request is taken, a cycle later.
        # The layer (several layers) travels with each request: the sweep's constants come from the command's
        # layer, kept in a register for the sweep; the bases of a command's or a host request's rows from the
        # request's own; the forward read port's from ``layer`` itself.
        lay_shape = range(max(len(geos), 2))
        layer_in = self.layer if len(geos) > 1 else Const(0, 1)
        cmd_in = m.submodules.cmd_in = SkidBuffer(
            shape=data.StructLayout({"p": geo.cmd_layout, "layer": lay_shape}), ring=False)
        host_in = m.submodules.host_in = SkidBuffer(
            shape=data.StructLayout({"p": self._host_layout, "layer": lay_shape}), ring=False)
        # Each port takes a request only while the other's slice is empty (registers), so that requests are taken
        # inside in the order they came (a command and a host request in the same cycle: the command first)
        for port, slc, other in ((self.cmd, cmd_in, host_in), (self.host, host_in, cmd_in)):
            m.d.comb += [slc.i.valid.eq(port.valid & ~other.o.valid), port.ready.eq(slc.i.ready & ~other.o.valid),
                         slc.i.payload.p.eq(port.payload), slc.i.payload.layer.eq(layer_in)]
        cmd = SimpleNamespace(valid=cmd_in.o.valid, ready=cmd_in.o.ready, payload=cmd_in.o.payload.p)
        host = SimpleNamespace(valid=host_in.o.valid, ready=host_in.o.ready, payload=host_in.o.payload.p)

        # --- the layers' constants (one layer: constants); a layer's rows and visits follow the previous
        # layers' in the shared banks and state memories ---
        def mx(f):
            return max(max(f(x) for x in geos), 2)

        D_all = sum(x.bank.depth for x in geos)
        V_all = sum(x.sweep.visits for x in geos)

        def pick(sel, name, shape, f):
            """``f(layer geometry, index)`` of the layer ``sel``."""
            out = Signal(shape, name=name)
            with m.Switch(sel):
                for i, x in enumerate(geos):
                    with m.Case(i):
                        m.d.comb += out.eq(f(x, i))
            return out

        sweep_layer = Signal(lay_shape)  # the running sweep's layer (loaded with its command)
        req_layer = Signal(lay_shape)  # the layer of the command or the host request being taken
        m.d.comb += req_layer.eq(Mux(cmd.valid, cmd_in.o.payload.layer, host_in.o.payload.layer))
        K1 = pick(sweep_layer, "K1", range(mx(lambda x: x.bank.words)), lambda x, i: x.bank.words - 1)
        G1 = pick(sweep_layer, "G1", range(mx(lambda x: x.bank.groups)), lambda x, i: x.bank.groups - 1)
        D1 = pick(sweep_layer, "D1", range(mx(lambda x: x.bank.depth)), lambda x, i: x.bank.depth - 1)
        CL1 = pick(sweep_layer, "CL1", range(chunks), lambda x, i: x.sweep.chunks_last - 1)
        LL1 = pick(sweep_layer, "LL1", range(L), lambda x, i: x.sweep.lanes_last - 1)
        vmask = pick(sweep_layer, "vmask", U, lambda x, i: (1 << x.sweep.valid_last) - 1)  # a partial last chunk's
        # rows
        def bank_base(x, i):  # layer i's first bank row
            return sum(y.bank.depth for y in geos[:i])

        def visit_base(x, i):  # layer i's first optimiser state row (visit)
            return sum(y.sweep.visits for y in geos[:i])

        bbase = pick(req_layer, "bbase", range(max(D_all, 2)), bank_base)
        sbase = pick(req_layer, "sbase", range(max(V_all, 2)), visit_base)
        fbase = pick(layer_in, "fwd_bbase", range(max(D_all, 2)), bank_base)

        # --- sweep counters (stage 0) ---
        running = Signal()
        op = Signal(2)
        shift = Signal(6)
        gate = Signal(PROB_BITS + 1)
        addr = Signal(range(mx(lambda x: x.bank.depth)))
        k = Signal(range(mx(lambda x: x.bank.words)))
        g = Signal(range(mx(lambda x: x.bank.groups)))
        lane = Signal(range(L))
        chunk = Signal(range(chunks))
        last_chunk = Signal()
        last_lane = Signal()
        last_visit = Signal()
        partial = Signal()  # the last chunk of a last-word row (may hold padding rows)
        m.d.comb += [
            last_chunk.eq((chunk == chunks - 1) | ((k == K1) & (chunk == CL1))),
            last_lane.eq((lane == L - 1) | ((g == G1) & (lane == LL1))),
            last_visit.eq(last_chunk & last_lane & (addr == D1)),
            partial.eq((k == K1) & (chunk == CL1)),
        ]
        need_rng = running & ((op == UPDATE) | (op == INIT))
        need_grad = running & (op == UPDATE)
        issue = Signal()
        cmd_go = cmd.valid & cmd.ready
        # running and what the sweep waits for, next cycle's values: copied into registers of each group of
        # counters that step with a visit, each group forming its own ``issue`` (timing: ``op`` -> ``issue`` fanned
        # out to every state slice's and every bank lane's counters across the die)
        run_next = Signal()
        op_next = Signal.like(op)
        m.d.comb += op_next.eq(Mux(cmd_go, cmd.payload.op, op))
        m.d.comb += run_next.eq(Mux(cmd_go, 1, running & ~(issue & last_visit)))
        wait_next = Cat(run_next, run_next & ((op_next == UPDATE) | (op_next == INIT)), run_next & (op_next == UPDATE))

        def issue_copy(name):
            """``issue`` from registers of its own."""
            r = replicas(m, wait_next, 1, name=name)[0]
            return r[0] & (~r[1] | self.rng.valid) & (~r[2] | self.grad.valid)

        m.d.comb += [
            issue.eq(running & (~need_rng | self.rng.valid) & (~need_grad | self.grad.valid)),
            self.rng.ready.eq(issue & need_rng),
            self.grad.ready.eq(issue & need_grad & last_chunk & last_lane),
        ]
        with m.If(issue):
            with m.If(last_chunk):
                m.d.sync += chunk.eq(0)
                with m.If(last_lane):
                    m.d.sync += [lane.eq(0), addr.eq(addr + 1)]
                    with m.If(k == K1):
                        m.d.sync += [k.eq(0), g.eq(g + 1)]
                    with m.Else():
                        m.d.sync += k.eq(k + 1)
                with m.Else():
                    m.d.sync += lane.eq(lane + 1)
            with m.Else():
                m.d.sync += chunk.eq(chunk + 1)
            with m.If(last_visit):
                m.d.sync += running.eq(0)

        bank_ra = Signal(range(max(D_all, 2)))  # the banks' read address register (below)

        # --- stage 1 registers ---
        s1_valid = Signal()
        s1_op = Signal(2)
        s1_lane = Signal(range(L))
        s1_chunk = Signal(range(chunks))
        s1_addr = Signal(range(max(D_all, 2)))  # the bank row (the layer's base included)
        s1_partial = Signal()
        s1_u = Signal(data.ArrayLayout(32, U))
        # stage 0 picks the visit's chunk of every lane's gradient, by a chunk counter per lane (each counts from its
        # own value, so the copies stay apart), stage 1 the lane (timing: lane and chunk choosing 2 U of the tile's
        # 2 lanes_in lanes_out bits in one cycle closed at 79.4 MHz at the paper's widths on the ECP5 proxy)
        s1_gch = []
        for lane_i in range(L):
            gl = Signal(2 * bank.lanes_in, name=f"grad_lane{lane_i}")
            m.d.comb += gl.eq(self.grad.payload.g[lane_i].as_value())
            if chunks > 1:
                cc = Signal(range(chunks), name=f"chunk{lane_i}")
                step = issue_copy(f"issue_chunk{lane_i}")
                with m.If(cmd.valid & cmd.ready):
                    m.d.sync += cc.eq(0)
                with m.Elif(step):
                    m.d.sync += cc.eq(Mux(last_chunk, 0, cc + 1))
                gl = gl.word_select(cc, 2 * U)
            r = Signal(2 * U, name=f"s1_g{lane_i}")
            m.d.sync += r.eq(gl)
            s1_gch.append(r)
        # stage 1 loads in every cycle, its valid bit says whether it holds a visit (every later use is gated by
        # the stages' valid bits). Timing: ``issue`` (the gradient's and the random numbers' valid) as the enable
        # of every stage-1 bit, 256 of them at the paper's widths.
        m.d.sync += [
            s1_valid.eq(issue),
            s1_op.eq(op),
            s1_lane.eq(lane),
            s1_chunk.eq(chunk),
            s1_addr.eq(bank_ra),
            s1_partial.eq(partial),
            s1_u.eq(self.rng.payload.u),
        ]

        # --- stages 2 .. WRITE_STAGE; a visit moves on every cycle (no stalls). Stage 2 holds the memories'
        # words as they leave the block RAMs, stage OPT_STAGE the chosen words (timing: block-RAM output into the
        # optimiser closed at 29-35 MHz on the ECP5 proxy, into one register at 62.5 at the paper's widths), the
        # optimiser runs in stages OPT_STAGE .. WRITE_STAGE - 2 (:meth:`_datapath`), WRITE_STAGE - 1 loads the write
        # ports' registers, WRITE_STAGE writes back ---
        WB = WRITE_STAGE

        def stages(x, name, first=1):
            """``{stage: x in that stage}`` for stages ``first .. WRITE_STAGE`` (``x`` belongs to ``first``)."""
            out = {first: x}
            for st in range(first + 1, WB + 1):
                out[st] = Signal.like(x, name=f"s{st}_{name}")
                m.d.sync += out[st].eq(out[st - 1])
            return out

        s_valid = stages(s1_valid, "valid")
        s_op = stages(s1_op, "op")
        s_lane = stages(s1_lane, "lane")
        s_chunk = stages(s1_chunk, "chunk")
        s_addr = stages(s1_addr, "addr")
        s_partial = stages(s1_partial, "partial")
        # the visit's lane of the gradient picked over stages 1 and 2 by registered one-hot selects: stage 1 picks
        # a lane in each group of GROUP_LANES lanes (a flag per lane, lane == l registered), stage 2 the group (a
        # flag per group, registered from stage 1's lane). Timing: ``s1_lane`` choosing among the 16 lanes' 16
        # bits, 256 multiplexer inputs, closed at 87.3 MHz at the paper's widths on the ECP5 proxy (nextpnr seed 1)
        def pick_lane(rows, hot, name):
            """The one of ``rows`` (one per lane) whose flag ``hot`` (a register per lane, one set) is set, over two
            stages: a row in each group of :data:`GROUP_LANES` lanes into a register, then the group by a flag per
            group (a register); the value of the next stage (no register of its own)."""
            groups = []
            for q in range(0, L, GROUP_LANES):
                lanes = range(q, min(L, q + GROUP_LANES))
                r = Signal.like(rows[0], name=f"{name}_group{q // GROUP_LANES}")
                f = Signal(name=f"{name}_group_hot{q // GROUP_LANES}")
                m.d.sync += [r.eq(or_tree([Mux(hot[i], rows[i], 0) for i in lanes])),
                             f.eq(Cat(*(hot[i] for i in lanes)).any())]
                groups.append(Mux(f, r, 0))
            return or_tree(groups)

        hot1 = [Signal(name=f"s1_lane_hot{lane_i}") for lane_i in range(L)]
        m.d.sync += [hot1[lane_i].eq(lane == lane_i) for lane_i in range(L)]
        s2_g = Signal(data.ArrayLayout(signed(2), U))  # stage 2's gradient, the groups' choice (not a register)
        s3_g = Signal(data.ArrayLayout(signed(2), U))
        s2_u, s3_u = Signal.like(s1_u), Signal.like(s1_u)
        m.d.comb += s2_g.eq(pick_lane(s1_gch, hot1, "s2_g"))
        m.d.sync += [s2_u.eq(s1_u), s3_g.eq(s2_g), s3_u.eq(s2_u)]
        assert OPT_STAGE == 3
        # switch: the increment per row, sgn(dW) where the schedule's gate takes it ((u & 0xFFFF) < gate, compared
        # in stage 1) and 0 elsewhere, formed in stage 2
        s3_inc = Signal(data.ArrayLayout(data.StructLayout({"up": signed(2), "down": signed(2)}), U))
        if opt.kind == "switch":
            for j in range(U):
                take = Signal(name=f"s2_take{j}")
                m.d.sync += take.eq(s1_u[j][:16] < gate)
                m.d.sync += [s3_inc[j].up.eq(Mux(take, s2_g[j], 0)), s3_inc[j].down.eq(Mux(take, -s2_g[j], 0))]

        # --- host port and command ---
        busy = Signal()
        rd_go = Signal()  # a host read taken in the cycle before: the memories' addresses load from registers
        rd_issued = Signal()
        rd_held = Signal()  # the memories read (a cycle after the request: their address registers)
        rd_held2 = Signal()  # the words in their registers (w_rows, the state slices')
        rd_held3 = Signal()  # the state words in theirs (st_q), the bank's word in its group's (host_groups)
        rd_space = Signal(2)
        rd_lane = Signal(range(L))
        resp_valid = Signal()
        resp_data = Signal(geo.data_width)
        h = host.payload
        # idle: no sweep, no host request in the cycle before, no host read in flight and no response waiting, a
        # register (timing: its gates in front of
        # the handshakes whose load fans out to every state slice's address registers, 70.8 MHz at the paper's
        # widths on the ECP5 proxy), loaded from the next values of those registers
        idle = Signal(init=1)
        busy_next = Signal()
        host_bank_next = Signal()  # a host weight write's chunks are being written (below)
        resp_next = Signal()
        # busy = running or a visit in a stage, as a register (timing: the OR of the stages' valid bits fanning out
        # to every memory port's multiplexers closed at 44.5 MHz at the paper's widths on the ECP5 proxy): its
        # next value from the next values of running (set by a command; an issue implies running, so its last
        # visit's clearing is covered by that visit entering stage 1) and of the stages' valid bits
        # (stage WRITE_STAGE too: the banks' write port copies write a cycle after it, BANK_COPY_STAGE)
        m.d.comb += busy_next.eq(running | (cmd.valid & cmd.ready)
                                 | Cat(*(s_valid[st] for st in range(1, WRITE_STAGE + BANK_COPY_STAGE))).any())
        m.d.sync += busy.eq(busy_next)
        m.d.comb += [
            self.busy.eq(busy | cmd.valid),  # a command waiting in its slice counts as busy
            cmd.ready.eq(idle),
            host.ready.eq(idle & ~cmd.valid),
            self.host_rdata.valid.eq(resp_valid),
            self.host_rdata.payload.eq(resp_data),
        ]
        host_go = host.valid & host.ready
        host_rd = host_go & ~h.write
        host_wr = host_go & h.write
        m.d.sync += [rd_go.eq(host_rd), rd_issued.eq(rd_go), rd_held.eq(rd_issued), rd_held2.eq(rd_held),
                     rd_held3.eq(rd_held2)]
        # a host read's space, lane and memory rows taken a cycle after the request, from registers loaded every
        # cycle (timing: the handshake into their enables, from the host request slice across the die; the row
        # of the request's layer, base + address, into every state slice's address register, 11.97 ns at the
        # paper's widths on the ECP5 proxy): the memories' addresses load a cycle after the request (``rd_go``)
        h_space0 = Signal.like(rd_space, name="host_space0")
        h_lane0 = Signal.like(rd_lane, name="host_lane0")
        h_space1 = Signal.like(rd_space, name="host_space1")
        h_lane1 = Signal.like(rd_lane, name="host_lane1")
        h_layer = host_in.o.payload.layer
        h_bank_row = Signal(range(max(D_all, 2)), name="host_rd_bank_row")
        h_visit = Signal(range(max(V_all, 2)), name="host_rd_visit")
        m.d.sync += [h_space0.eq(h.space), h_lane0.eq(h.lane), h_space1.eq(h_space0), h_lane1.eq(h_lane0),
                     h_bank_row.eq(pick(h_layer, "host_rd_bbase", range(max(D_all, 2)), bank_base) + h.addr),
                     h_visit.eq(pick(h_layer, "host_rd_sbase", range(max(V_all, 2)), visit_base) + h.addr)]
        with m.If(rd_issued):
            m.d.sync += [rd_space.eq(h_space1), rd_lane.eq(h_lane1)]
        # the response three cycles after the memories' read (the words are registered first)
        m.d.comb += resp_next.eq(rd_held3 | (resp_valid & ~self.host_rdata.ready))
        m.d.sync += [resp_valid.eq(resp_next),
                     idle.eq(~(busy_next | host_go | host_bank_next | rd_go | rd_issued | rd_held | rd_held2
                               | resp_next))]
        flips = Signal.like(self.flips)
        m.d.comb += self.flips.eq(flips)
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += [
                sweep_layer.eq(cmd_in.o.payload.layer),
                running.eq(1),
                op.eq(cmd.payload.op),
                shift.eq(cmd.payload.shift),
                gate.eq(cmd.payload.gate),
                addr.eq(0),
                k.eq(0),
                g.eq(0),
                lane.eq(0),
                chunk.eq(0),
                flips.eq(0),
            ]

        # --- weight banks ---
        # The banks read at the forward read port's address while ``fwd_sel`` (a register: no sweep and no host
        # read), else every cycle at ``bank_ra`` (a register: the sweep's row, counted from the command on, or the
        # host's row, registered: a host read reads a cycle after its request). Timing: ``busy`` choosing between
        # the three addresses, then the layer's base added, closed at 61.8 MHz at the paper's widths on the ECP5
        # proxy.
        fwd_sel = Signal(init=1)
        fwd_addr = Signal.like(bank_ra)
        m.d.comb += fwd_addr.eq(fbase + self.read.addr)
        m.d.sync += fwd_sel.eq(~(running | (cmd.valid & cmd.ready) | rd_go))
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += bank_ra.eq(bbase)
        with m.Elif(rd_go & (h_space0 == SPACE_WEIGHTS)):
            m.d.sync += bank_ra.eq(h_bank_row)
        with m.Elif(issue & last_chunk & last_lane):
            m.d.sync += bank_ra.eq(bank_ra + 1)
        bank_rd = []
        bank_wr = []
        for lane_i in range(L):
            mem = m.submodules[f"wbank{lane_i}"] = Memory(shape=bank.lanes_in, depth=max(D_all, 2), init=[],
                                                          attrs=NO_RW_CHECK)
            rd = mem.read_port()
            wr = mem.write_port(granularity=U)
            m.d.comb += [
                rd.addr.eq(Mux(fwd_sel, fwd_addr, bank_ra)),
                rd.en.eq(Mux(fwd_sel, self.read.en, 1)),
                self.read.data[lane_i].eq(rd.data),
            ]
            bank_rd.append(rd)
            bank_wr.append(wr)
        # every bank's word registered as it leaves the RAM (timing: a block RAM's output delay, 5.6 ns on the
        # ECP5 proxy, left no time for a multiplexer behind it; the 7-series' block RAMs absorb such a register).
        # The sweep picks the visit's chunk of each bank's word in stage 2, by a chunk register per bank (loaded
        # with the chunk of that bank's visits only, so the copies stay apart), its bank in a group of GROUP_LANES
        # in stage 3 (a flag per bank, a register) and the group in stage 4: the optimiser takes the old weight in
        # stage OPT_STAGE + 2; a host read picks a bank in each group of GL banks, then the group (timing: one
        # register choosing among all banks' words, 16 x 64 bits gathered from the whole die, closed at 76.3 MHz at
        # the paper's widths on the ECP5 proxy; the bank of chunk registers by the lane, 79.8 MHz)
        w_rows = [Signal(bank.lanes_in, name=f"s2_w_row{lane_i}") for lane_i in range(L)]
        m.d.sync += [w_rows[lane_i].eq(rd.data) for lane_i, rd in enumerate(bank_rd)]
        c_rows = [Signal(U, name=f"s3_w_chunk{lane_i}") for lane_i in range(L)]
        for lane_i in range(L):
            if chunks == 1:
                m.d.sync += c_rows[lane_i].eq(w_rows[lane_i])
                continue
            csel = Signal(range(chunks), name=f"s2_chunk{lane_i}")
            with m.If(s_valid[1] & (s_lane[1] == lane_i)):
                m.d.sync += csel.eq(s_chunk[1])
            m.d.sync += c_rows[lane_i].eq(w_rows[lane_i].word_select(csel, U))
        hot3 = [Signal(name=f"s3_lane_hot{lane_i}") for lane_i in range(L)]
        m.d.sync += [hot3[lane_i].eq(s_lane[2] == lane_i) for lane_i in range(L)]
        w_old5 = Signal(U, name="s5_w_old")
        m.d.sync += w_old5.eq(pick_lane(c_rows, hot3, "s4_w"))
        w_old = stages(w_old5, "w_old", OPT_STAGE + 2)
        GL = GROUP_LANES  # banks per group of a host read's first choice
        host_groups = []
        for k in range(0, L, GL):
            rows = w_rows[k:k + GL]
            gsel = Signal(range(len(rows)), name=f"host_rd_sel{k // GL}")
            with m.If(rd_issued & (h_lane1 >= k) & (h_lane1 < k + len(rows))):
                m.d.sync += gsel.eq(h_lane1 - k)
            grp = Signal(bank.lanes_in, name=f"host_rd_row{k // GL}")
            m.d.sync += grp.eq(Array(rows)[gsel])
            host_groups.append(grp)

        # --- state memories ---
        st_rd, st_wr, st_q = {}, {}, {}  # st_q: the read words in stage OPT_STAGE
        if len(opt.fields) > len(STATE_SPACES):
            raise ValueError(f"{len(opt.fields)} optimiser state fields; the host port has spaces for "
                             f"{len(STATE_SPACES)}")
        for name, _ in opt.fields:
            layout = data.ArrayLayout(opt.field_shape(name), U)
            mem = m.submodules[f"state_{name}"] = StateMemory(shape=layout, depth=max(V_all, 2), name=f"state_{name}",
                                                               inc_copies=True)
            rd, wr = mem.read, mem.write
            m.d.comb += [  # the sweep's visit (from sbase at the command, one a visit) or the host's row
                rd.load.eq(cmd_go | (rd_go & (h_space0 == geo.field_space(name)))),
                rd.addr.eq(Mux(cmd_go, sbase, h_visit)),
            ]
            # each address register steps with an issue of its own
            m.d.comb += [inc.eq(issue_copy(f"issue_{name}{i}")) for i, inc in enumerate(rd.incs)]
            st_rd[name], st_wr[name] = rd, wr
            st_q[name] = Signal(layout, name=f"st3_{name}")
            m.d.sync += st_q[name].eq(rd.data)
        table_ports, table_writes = [], []
        if opt.kind == "switch":
            # one copy of the table per update lane, each with one read port: Yosys' memory_libmap would
            # duplicate a many-port table itself, but its search over the port assignments of a 16-read-port
            # memory exhausts the wasm32 build's 4 GB (YoWASP), so the copies are made here
            for j in range(U):
                table = Memory(shape=PROB_BITS + 1, depth=opt.cutoff + 1, init=[])
                m.submodules[f"switch_table{j}"] = table
                table_ports.append(table.read_port(domain="comb"))
                table_writes.append(table.write_port())  # from the registered host write (below)

        # --- the optimiser (stages OPT_STAGE .. WRITE_STAGE - 2; its results belong to WRITE_STAGE - 1) ---
        new_w = Signal(U)
        new_state = {
            name: Signal(data.ArrayLayout(opt.field_shape(name), U), name=f"new_{name}") for name, _ in opt.fields
        }
        self._datapath(m, s_op[OPT_STAGE], shift, s3_inc, w_old[OPT_STAGE + 2], s3_g, s3_u, st_q, new_w, new_state,
                       table_ports)

        # --- write-back: stage WRITE_STAGE - 1 loads the write ports' registers, stage WRITE_STAGE writes ---
        # Every write port takes its address, data and enables from registers of its own (per bank, per state
        # slice), loaded a cycle before the write with the visit of stage WRITE_STAGE - 1 or the host's write (the
        # host writes only while no sweep runs); each copy loads under an enable of its own (its bank's lane, its
        # slice's segment), so the synthesis cannot merge the copies. Timing: the write-back stage's op choosing
        # the write data (UNDO's bits or the new ones) and its valid bit forming the write enables fanned out to
        # every bank's and every state block RAM's pins, 63.1 / 68.0 MHz at the paper's widths on the ECP5 proxy
        # (nextpnr seeds 1 / 2).
        LD = WB - 1
        wb_bits = Signal(U)  # the bank bits of the visit in stage LD
        undo_bits = stages(st_q["undo"].as_value(), "undo", OPT_STAGE) if "undo" in st_q else w_old
        m.d.comb += wb_bits.eq(Mux(s_op[LD] == UNDO, undo_bits[LD], new_w))
        # the host's weight and state writes: the request registered first (no transfer is taken in the cycle
        # after it, idle), then the write ports' registers load from it; a state write is two cycles after the
        # request, a weight row's chunks follow one a cycle from then on, as the sweep's (timing: the handshake
        # into every bank's write registers, 86.8 MHz at the paper's widths on the ECP5 proxy; a whole row's write
        # data register per bank loaded from the registered row did not route)
        hw_valid = Signal(name="host_wr_valid")
        hw_space = Signal.like(h.space, name="host_wr_space")
        hw_lane = Signal.like(h.lane, name="host_wr_lane")
        host_addr = Signal.like(bank_ra, name="host_wr_addr")  # the bank row, the layer's base included
        hw_data = Signal.like(h.data, name="host_wr_data")
        hw_taddr = Signal(range(max(opt.cutoff + 1, 2)) if opt.kind == "switch" else 1, name="host_wr_table_addr")
        host_bank = Signal()  # a host weight write's chunk is loaded into the bank's registers (hw_chunk)
        m.d.sync += hw_valid.eq(host_wr)
        # loaded in every cycle but those of a weight row's chunks (timing: host_wr, the handshake with the host
        # request slice, as the enable of every bit, 17.7 ns in context on the ECP5 proxy); only hw_valid's cycle
        # and a weight row's chunks use them
        with m.If(~host_bank):
            m.d.sync += [hw_space.eq(h.space), hw_lane.eq(h.lane), host_addr.eq(bbase + h.addr),
                         hw_data.eq(h.data), hw_taddr.eq(h.addr)]
        for twr in table_writes:  # the switch table's rows, a cycle after the request
            m.d.comb += [twr.addr.eq(hw_taddr), twr.data.eq(hw_data),
                         twr.en.eq(hw_valid & (hw_space == SPACE_TABLE))]
        hw_chunk = Signal(range(chunks), name="host_wr_chunk")
        hw_bits = Signal(U, name="host_wr_bits")
        m.d.comb += hw_bits.eq(hw_data.word_select(hw_chunk, U) if chunks > 1 else hw_data[:U])
        with m.If(host_wr & (h.space == SPACE_WEIGHTS)):
            m.d.sync += [host_bank.eq(1), hw_chunk.eq(0)]
        with m.Elif(host_bank):
            m.d.sync += hw_chunk.eq(hw_chunk + 1)
            with m.If(hw_chunk == chunks - 1):
                m.d.sync += host_bank.eq(0)
        m.d.comb += host_bank_next.eq((host_wr & (h.space == SPACE_WEIGHTS)) | (host_bank & (hw_chunk != chunks - 1)))
        sweep_lane = [Signal(name=f"ld_lane{lane_i}") for lane_i in range(L)]  # stage LD's visit writes bank lane_i
        # and whether its bits are the undo field's, per bank (timing: stage LD's op choosing between the undo
        # field and the new bits fanned out to every bank's write data registers, 12.4 ns at the paper's widths on
        # the ECP5 proxy, nextpnr seed 2)
        undo_lane = [Signal(name=f"ld_undo{lane_i}") for lane_i in range(L)]
        for lane_i, (sl, ul) in enumerate(zip(sweep_lane, undo_lane, strict=True)):
            m.d.sync += [sl.eq(s_valid[LD - 1] & (s_lane[LD - 1] == lane_i)),
                         ul.eq(s_valid[LD - 1] & (s_lane[LD - 1] == lane_i) & (s_op[LD - 1] == UNDO))]
        chunk_hot = Signal(chunks)
        m.d.comb += chunk_hot.eq(Const(1, chunks) << s_chunk[LD])
        # a host weight write's chunk is for bank lane_i: a register per bank, loaded from the next values of
        # host_bank and hw_lane (timing: hw_lane compared with each bank's number, a LUT by the register, then the
        # bank's write registers' clock enables: 13.7 ns, 12.5 routing, at the paper's widths on the ECP5 proxy)
        lane_next = Mux(host_bank, hw_lane, h.lane)
        for lane_i, wr in enumerate(bank_wr):
            host_i = Signal(name=f"host_wr_bank{lane_i}")
            m.d.sync += host_i.eq(host_bank_next & (lane_next == lane_i))
            wa = Signal.like(bank_ra, name=f"bank{lane_i}_wa")
            wd = Signal(U, name=f"bank{lane_i}_wd")  # the chunk's bits
            we = Signal(chunks, name=f"bank{lane_i}_we")
            m.d.sync += we.eq(Mux(sweep_lane[lane_i], chunk_hot, 0) | Mux(host_i, Const(1, chunks) << hw_chunk, 0))
            with m.If(sweep_lane[lane_i] | host_i):
                m.d.sync += [wa.eq(Mux(sweep_lane[lane_i], s_addr[LD], host_addr)),
                             wd.eq(Mux(undo_lane[lane_i], undo_bits[LD], Mux(sweep_lane[lane_i], new_w, hw_bits)))]
            # BANK_COPY_STAGE: the write port's pins from copies a cycle later, a copy per bank loaded in every
            # cycle with no logic in front, so the registers above, and the choice and enables in front of them,
            # stay by the sweep's pipeline (timing: the sweep's bank-lane flag into the write data register that
            # fed every chunk's data pins, 12.44 ns, 11.4 of it routing, alone at the paper's widths on the ECP5
            # proxy; a data copy per chunk, beside that chunk's block RAMs, did not route: router2's overuse rose
            # past 1,000 wires by iteration 39 among the unit's 182 EBR)
            # (the address and the data with no reset: they matter only under an enable; the enables' copy clears
            # with the reset as its register does, so an abort drops a write on its way as before)
            wa_p = Signal.like(wa, name=f"bank{lane_i}_wa_p", attrs=KEEP, reset_less=True)
            we_p = Signal.like(we, name=f"bank{lane_i}_we_p", attrs=KEEP)
            wd_p = Signal(U, name=f"bank{lane_i}_wd_p", attrs=KEEP, reset_less=True)
            m.d.sync += [wa_p.eq(wa), we_p.eq(we), wd_p.eq(wd)]
            m.d.comb += [wr.addr.eq(wa_p), wr.data.eq(wd_p.replicate(chunks)), wr.en.eq(we_p)]
        # the state write counters load while no sweep runs and in the cycle after a command (busy a cycle before
        # low, a register), from a register: the host write's row in the cycle after its request, else the sweep's
        # first row (the layer's, as in the cycle before); a write of each field's space a register of its own
        # (timing: the host write's space compared and choosing the address of every state slice's counter,
        # 93.9 MHz at the paper's widths on the ECP5 proxy, nextpnr seed 2)
        st_load = Signal(init=1, name="state_wr_load")
        m.d.sync += st_load.eq(~busy)
        for name, _ in opt.fields:
            wr = st_wr[name]
            host_here = Signal(name=f"host_wr_{name}")
            host_field = host_wr & (h.space == geo.field_space(name))
            st_wa = Signal(range(max(V_all, 2)), name=f"host_wr_{name}_visit")
            m.d.sync += [host_here.eq(host_field), st_wa.eq(Mux(host_field, sbase + h.addr, sbase))]
            m.d.comb += [  # the write-back's visit: counted from the sweep's first row (loaded while no sweep runs,
                # so not from the command's handshake: timing), one a valid stage
                wr.load.eq(st_load),
                wr.addr.eq(st_wa),
                *(inc.eq(v) for inc, v in zip(wr.incs, replicas(m, s_valid[WB - 1], len(wr.incs),
                                                                  name=f"wb_valid_{name}"), strict=True)),
                wr.data.eq(Mux(s_valid[LD], new_state[name].as_value(), hw_data[: geo.field_width(name)])),
                wr.en.eq((s_valid[LD] & (s_op[LD] != UNDO)) | host_here),
            ]

        # --- flip counter (the changed bits registered in stage WB, counted there) ---
        changed = Signal(U)
        valid_mask = Mux(s_partial[LD], vmask, (1 << U) - 1)
        m.d.sync += changed.eq((wb_bits ^ w_old[LD]) & valid_mask)
        with m.If(s_valid[WB]):
            m.d.sync += flips.eq(flips + popcount(changed))

        # --- host read responses (the memories read a cycle after the request; the words are registered first,
        # three cycles after the read: a bank's word, its group's choice, the response) ---
        with m.If(rd_held3 & (rd_space == SPACE_WEIGHTS)):
            m.d.sync += resp_data.eq(Array(host_groups)[rd_lane // GL])
        with m.If(rd_held3 & (rd_space != SPACE_WEIGHTS)):
            with m.Switch(rd_space):
                for name, _ in opt.fields:
                    with m.Case(geo.field_space(name)):
                        m.d.sync += resp_data.eq(st_q[name].as_value())
                with m.Default():
                    m.d.sync += resp_data.eq(0)
        return m

    # --- the four optimisers, per update lane ------------------------------------------------------------

    def _datapath(self, m, op, shift, inc, w_old, g, u, st_rd, new_w, new_state, table_ports):
        """The optimiser: its inputs (``op``, ``g``, ``u``, the state words ``st_rd``; switch: ``inc``, the gated
        increment per row and its negation) are the registers of stage ``S =`` :data:`OPT_STAGE`, ``w_old`` the
        register of stage ``S + 2`` (the bank word is picked over three stages); ``new_w`` and ``new_state`` belong to
        stage ``WRITE_STAGE - 1 = S + 3`` (which loads the write-back's registers). The switch optimiser adds and
        compares in stage ``S``, clamps and looks its table up by the clamped magnitude in ``S + 1``, compares with the
        entry and takes the sign of ``p`` by the old weight in ``S + 2`` and forms the write data in ``S + 3``; the
        others compute in stage ``S``, compare in ``S + 1``, form the weight with the old one in ``S + 2``, and
        their registered results wait for stage ``S + 3``."""
        opt = self._geometry.optimizer
        U = self._geometry.sweep.update_lanes
        kind = opt.kind

        def late(x, name):
            """``x`` one cycle later."""
            x = Value.cast(x)
            r = Signal(x.shape(), name=name)
            m.d.sync += r.eq(x)
            return r

        def at_wb(x, stage, name):
            """``x`` of stage ``stage`` delayed to stage ``WRITE_STAGE - 1``."""
            for st in range(stage + 1, WRITE_STAGE):
                x = late(x, f"{name}_s{st}")
            return x

        S = OPT_STAGE
        ops = {S: op}  # op in stages S .. WRITE_STAGE - 1
        for st in range(S + 1, WRITE_STAGE):
            ops[st] = late(ops[st - 1], f"op{st}")
        # Per-sweep constants derived from the command's shift, registered (shift is stable during a sweep).
        if kind == "bop":
            mask = Signal(16)
            m.d.sync += mask.eq((Const(1, 17) << shift) - 1)
        elif kind == "iir":
            a_mask = Signal(64)
            r_lsh = Signal(6)
            m.d.sync += [a_mask.eq((Const(1, 65) << shift) - 1), r_lsh.eq(Mux(shift > 16, shift - 16, 0))]
        elif kind == "sgd":
            d_shift = opt.latent_frac - opt.frac  # step << D in the latent's fraction
            sh = Signal(signed(8))
            lsh = Signal(range(64))
            rsh = Signal(range(33))
            ush = Signal(range(33))  # 32 - rsh: the random bits used are u >> ush
            zero = Signal()
            m.d.comb += sh.eq(shift - d_shift)
            m.d.sync += [
                lsh.eq(Mux(sh < 0, -sh, 0)),
                rsh.eq(Mux(sh > 32, 32, Mux(sh > 0, sh, 0))),
                ush.eq(Mux(sh > 32, 0, Mux(sh > 0, 32 - sh, 32))),
                zero.eq(sh > 32),
            ]

        for j in range(U):
            w = w_old[j]
            gj = g[j]
            uj = Signal(32, name=f"u{j}")
            m.d.comb += uj.eq(u[j])
            r_lo = uj[:16]
            r_hi = uj[16:]
            init_w = ~uj[31]
            nw = Signal(name=f"nw{j}")
            if kind == "switch":  # nw in stage S + 3
                init5 = late(late(late(init_w, f"init3_{j}"), f"init4_{j}"), f"init5_{j}")
                m.d.comb += new_w[j].eq(at_wb(Mux(ops[S + 3] == INIT, init5, nw), S + 3, f"nw{j}"))
            else:  # nw in stage S + 2, with the weight
                init4 = late(late(init_w, f"init3_{j}"), f"init4_{j}")
                m.d.comb += new_w[j].eq(at_wb(Mux(ops[S + 2] == INIT, init4, nw), S + 2, f"nw{j}"))

            def state_in(name, j=j):
                return st_rd[name][j]

            def state_out(name, value_upd, value_init=0, j=j):  # values of stage S
                m.d.comb += new_state[name][j].eq(at_wb(Mux(op == INIT, value_init, value_upd), S, f"{name}{j}"))

            def state_out5(name, value_upd, value_init, j=j):  # values of stage S + 3
                m.d.comb += new_state[name][j].eq(at_wb(Mux(ops[S + 3] == INIT, value_init, value_upd), S + 3,
                                                        f"{name}{j}"))

            if kind == "switch":
                C = opt.cutoff
                acc = state_in("acc")
                up, down = inc[j].up, inc[j].down  # the gated increment and its negation (stage S - 1)
                s = Signal(signed(len(acc) + 1), name=f"sum{j}")
                ns = Signal(signed(len(acc) + 1), name=f"nsum{j}")  # -s
                hi = Signal(name=f"hi{j}")  # s > C
                lo = Signal(name=f"lo{j}")  # s < -C
                # stage S: both sums and the clamp's comparisons (on acc, against C - increment) in parallel
                m.d.comb += [
                    s.eq(acc + up),
                    ns.eq(down - acc),
                    hi.eq(Mux(up == 1, acc > C - 1, Mux(up == -1, acc > C + 1, acc > C))),
                    lo.eq(Mux(up == 1, acc < -C - 1, Mux(up == -1, acc < -C + 1, acc < -C))),
                ]
                s3, ns3, hi3, lo3 = (late(s, f"sum3_{j}"), late(ns, f"nsum3_{j}"), late(hi, f"hi3_{j}"),
                                     late(lo, f"lo3_{j}"))
                rhi3 = late(r_hi, f"rhi3_{j}")
                # stage S + 1: clamp(s), and its magnitude's table entry (p = +-clamp(s) by the weight, and where
                # p > 0 it is the magnitude: the clamp is symmetric, so the weight is needed only in stage S + 2)
                acc3 = Signal(signed(len(acc)), name=f"acc3_{j}")
                mag3 = Signal(range(C + 1), name=f"mag3_{j}")
                m.d.comb += [
                    acc3.eq(Mux(hi3, C, Mux(lo3, -C, s3))),
                    mag3.eq(Mux(hi3 | lo3, C, Mux(s3 < 0, ns3, s3))),
                    table_ports[j].addr.eq(mag3),
                ]
                t4, gt4, lt4 = (late(table_ports[j].data, f"t4_{j}"), late(acc3 > 0, f"gt4_{j}"),
                                late(acc3 < 0, f"lt4_{j}"))
                acc4, w4, rhi4 = late(acc3, f"acc4_{j}"), w, late(rhi3, f"rhi4_{j}")
                # stage S + 2: the switch (p > 0 and the number below the entry); stage S + 3: the write data
                switch = late(Mux(w4, gt4, lt4) & (rhi4 < t4), f"sw5_{j}")
                acc5, w5 = late(acc4, f"acc5_{j}"), late(w4, f"w5_{j}")
                m.d.comb += nw.eq(w5 ^ switch)
                state_out5("acc", Mux(switch, 0, acc5) if opt.reset else acc5, 0)
                if opt.undo:
                    state_out5("undo", w5, init5)
            elif kind == "bop":
                F = opt.frac
                mm = state_in("m")
                d = Signal(signed(F + 4), name=f"d{j}")
                t = Signal(signed(max(F + 4, 17) + 1), name=f"t{j}")
                m1 = Signal(signed(len(mm)), name=f"m{j}")
                m.d.comb += [
                    d.eq((gj << F) - mm),
                    t.eq(d + (r_lo & mask)),
                    m1.eq(mm + (t >> shift)),
                    nw.eq(w ^ Mux(w, late(late(m1 > opt.tau, f"up3_{j}"), f"up4_{j}"),
                                  late(late(m1 < -opt.tau, f"dn3_{j}"), f"dn4_{j}"))),
                ]
                state_out("m", m1)
            elif kind == "iir":
                Fm, FG = opt.frac, opt.g_frac
                mm, gg = state_in("m"), state_in("g")
                d = Signal(signed(Fm + 4), name=f"dm{j}")
                m1 = Signal(signed(len(mm)), name=f"m{j}")
                m.d.comb += [
                    d.eq((gj << Fm) - mm),
                    m1.eq(mm + ((d + (r_lo & ((1 << opt.gamma_shift) - 1))) >> opt.gamma_shift)),
                ]
                e = Signal(signed(FG + 3), name=f"dg{j}")
                t = Signal(signed(70), name=f"tg{j}")
                g1 = Signal(signed(len(gg)), name=f"g{j}")
                m.d.comb += [
                    e.eq((m1 << (FG - Fm)) - gg),
                    t.eq(e + ((r_hi << r_lsh) & a_mask)),
                    g1.eq(gg + (t >> shift)),
                    nw.eq(Mux(late(late(g1 > 0, f"pos3_{j}"), f"pos4_{j}"), 0,
                              Mux(late(late(g1 < 0, f"neg3_{j}"), f"neg4_{j}"), 1, w))),
                ]
                state_out("m", m1)
                state_out("g", g1)
            else:  # sgd
                Fm, Fc = opt.frac, opt.latent_frac
                c = state_in("latent")
                if opt.mom_shift > 0:
                    mm = state_in("m")
                    d = Signal(signed(Fm + 4), name=f"dm{j}")
                    m1 = Signal(signed(len(mm)), name=f"m{j}")
                    m.d.comb += [
                        d.eq((gj << Fm) - mm),
                        m1.eq(mm + ((d + (r_lo & ((1 << opt.mom_shift) - 1))) >> opt.mom_shift)),
                    ]
                    step = m1
                    state_out("m", m1)
                else:
                    step = Signal(signed(Fm + 2), name=f"step{j}")
                    m.d.comb += step.eq(gj << Fm)
                big = Signal(signed(len(step) + 64 + 2), name=f"x{j}")
                delta = Signal(signed(len(step) + 64 + 2), name=f"delta{j}")
                m.d.comb += [
                    big.eq((step << lsh) + (uj >> ush)),
                    delta.eq(Mux(zero, 0, big >> rsh)),
                ]
                c1 = Signal(signed(len(delta) + 1), name=f"c{j}")
                lim = 1 << Fc
                c2 = Signal(signed(Fc + 1), name=f"latent{j}")
                m.d.comb += [c1.eq(c - delta), c2.eq(Mux(c1 < -lim, -lim, Mux(c1 > lim - 1, lim - 1, c1)))]
                m.d.comb += nw.eq(late(late(c2 >= 0, f"sign3_{j}"), f"sign4_{j}"))
                # Initial latent: magnitude from the number's low 16 bits, sign from the initial weight.
                mag_bits = Fc - opt.init_shift
                lo = uj[:16]
                mag = (lo >> (16 - mag_bits)) if mag_bits <= 16 else (lo << (mag_bits - 16))
                mag_s = Signal(signed(max(mag_bits, 1) + 2), name=f"mag{j}")
                m.d.comb += mag_s.eq(mag)
                state_out("latent", c2, Mux(init_w, mag_s, -1 - mag_s))
