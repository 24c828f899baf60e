"""Batch-norm units of one layer: training-mode forward (:class:`BnForwardUnit`) and the BNN-specific l1
backward (:class:`BnBackwardUnit`), bit-exact to :func:`sim.hw.arith.bn_forward` and
:func:`sim.hw.arith.bn_backward` (docs/arithmetic.md sections 3.3-3.5 and 5.1).

Geometry (:class:`BnLayer`): one weight layer's bounds from :func:`sim.hw.widths.layer_bounds` (batch B,
channels M, fan-in N, x_max and every derived width), the :class:`sim.hw.arith.ArithParams` and ``lanes``,
the channels carried per beat. :meth:`BnLayer.from_config` derives all of it from a configuration, so no
constant is written down twice.

Element order (all per-element streams, in and out): **batch-major**, exactly as the XNOR engine emits ``Y``.
For every sample row ``b = 0 .. B-1`` the ``G = ceil(M / lanes)`` groups follow in order; lane ``l`` of group
``g`` is channel ``g * lanes + l``; lanes past ``M`` in the last group are padding (ignored on input, 0 on
output); ``last`` marks the last group of a row (it is not checked: the units go by their counts).

Per-channel streams carry one channel per beat in channel order, ``last`` on channel ``M - 1``.

Schedule of :class:`BnForwardUnit` (one batch; then it starts over):

====== =====================================================================================================
PASS1  ``y`` (B*G beats): ``sum_y`` per channel
EPI1   per channel ``t_mu = ceil(sum_y / B)`` (divider)
PASS2  ``y_replay`` (B*G beats): ``Ys``, ``Ns`` (split at ``t_mu``)
EPI2   per channel (``beta`` consumed): ``S``, ``S' = max(S, 1)``, ``C``, ``theta``, ``theta_lo``,
       ``theta_hi`` (three divider runs)
PASS3  ``y_replay`` again (B*G beats): ``x_hat`` and mask out; ``sum x_hat y``, ``sum x_hat``
EPI3   per channel ``A`` and ``alpha_q`` (divider, channels overlapped); one ``stats`` beat per channel
====== =====================================================================================================

The divisions by the configuration constants are done on the shared sequential divider with narrow
quotients: each dividend is first saturated and offset so that the quotient is a small non-negative number
(thresholds saturate at ``+-(Ymax + 1)`` anyway), and the ``2^Fb`` factor of ``K = B^2 2^Fb`` is removed by a
shift (``floor(u / (d 2^f)) = floor(floor(u / 2^f) / d)``).

Schedule of :class:`BnBackwardUnit`: PASS1 ``dx`` (B*G beats): ``P1``, ``P2``; EPI per channel (``alpha``
consumed and kept with its zero-scale flag): one ``p1`` beat; PASS2 ``dx_replay`` (B*G beats): ``alpha_q P2``
(one multiplier per pass-2 lane) and ``Q`` out (0 for every sample of a flagged channel).

Cycle models (no input stalls, no output backpressure, replay and per-channel inputs offered whenever the
unit is ready): :meth:`BnForwardUnit.cycles`, :meth:`BnBackwardUnit.cycles`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from amaranth import Cat, Const, Module, Mux, Shape, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.arith import ArithParams
from sim.hw.widths import LayerBounds, hw_supported, layer_bounds, signed_bits

from .divider import CONST_DIV_LATENCY, Divider, const_divide, ring_schedule
from .divider import iterations as div_iterations
from .divider import stages as div_stages
from .shared import layer_port
from .streams import KEEP, SkidBuffer

__all__ = [
    "BN_FWD_ACC_STAGES",
    "EPI1_DIV_STAGES",
    "BnBackwardUnit",
    "BnForwardCore",
    "BnForwardUnit",
    "BnLayer",
    "Phase",
    "backward_cycles",
    "forward_cycles",
    "merge_bounds",
    "mul_const",
    "mul_const_fabric",
]

MAX_LANES = 4096


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class BnLayer:
    """One weight layer as the BN and po2 units see it.

    Parameters (keyword-only):
        bounds: the layer's :class:`sim.hw.widths.LayerBounds` (batch ``n``, ``fan_out`` channels, ``fan_in``,
            ``x_max`` and the worst-case magnitudes every width is derived from).
        params: :class:`sim.hw.arith.ArithParams` (``beta_frac``, ``alpha_frac``, ``k`` ...).
        lanes: channels per beat, 1..4096.
        top: the output layer (its po2 operand is ``|Q|``, not ``|Q| B``).
    """

    bounds: LayerBounds
    params: ArithParams
    lanes: int
    top: bool = False

    def __post_init__(self):
        if not isinstance(self.bounds, LayerBounds):
            raise TypeError(f"bounds must be a sim.hw.widths.LayerBounds, not {self.bounds!r}")
        if not isinstance(self.params, ArithParams):
            raise TypeError(f"params must be a sim.hw.arith.ArithParams, not {self.params!r}")
        _check_int("lanes", self.lanes, 1, MAX_LANES)
        _check_int("bounds.n (batch)", self.bounds.n, 1, 1 << 20)
        _check_int("bounds.fan_out (channels)", self.bounds.fan_out, 1, 1 << 20)
        if not isinstance(self.top, bool):
            raise ValueError(f"top must be a bool, not {self.top!r}")

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes: int) -> BnLayer:
        """Layer ``layer_index`` (among weight layers) of ``cfg``: bounds from :func:`layer_bounds`, params from
        :meth:`ArithParams.from_config`."""
        if not hw_supported(cfg):
            raise ValueError("the configuration's topology is not covered by the hardware model (dense + BN only)")
        bounds = layer_bounds(cfg)
        _check_int("layer_index", layer_index, 0, len(bounds) - 1)
        return cls(
            bounds=bounds[layer_index],
            params=ArithParams.from_config(cfg),
            lanes=lanes,
            top=layer_index == len(bounds) - 1,
        )

    def as_dict(self) -> dict:
        """JSON-ready description (e.g. for a testbench in another process); :meth:`from_dict` inverts it."""
        return {"bounds": asdict(self.bounds), "params": asdict(self.params), "lanes": self.lanes, "top": self.top}

    @classmethod
    def from_dict(cls, d: dict) -> BnLayer:
        return cls(bounds=LayerBounds(**d["bounds"]), params=ArithParams(**d["params"]), lanes=d["lanes"], top=d["top"])

    # --- geometry ---
    @property
    def batch(self) -> int:
        return self.bounds.n

    @property
    def channels(self) -> int:
        return self.bounds.fan_out

    @property
    def fan_in(self) -> int:
        return self.bounds.fan_in

    @property
    def x_max(self) -> int:
        return self.bounds.x_max

    @property
    def y_bound(self) -> int:
        """``Ymax = N x_max``: the ``y_bound`` argument of :func:`sim.hw.arith.bn_forward`."""
        return self.bounds.y

    @property
    def groups(self) -> int:
        return -(-self.channels // self.lanes)

    @property
    def lanes_last(self) -> int:
        """Real lanes of the last group."""
        return self.channels - (self.groups - 1) * self.lanes

    def lanes_of(self, group: int) -> int:
        return self.lanes_last if group == self.groups - 1 else self.lanes

    @property
    def beats(self) -> int:
        """Beats of one pass over the batch, ``B * G``."""
        return self.batch * self.groups

    # --- widths (sim.hw.widths) ---
    @cached_property
    def widths(self) -> dict[str, int]:
        return self.bounds.widths()

    @property
    def K(self) -> int:
        """``B^2 2^Fb``."""
        return self.batch * self.batch << self.params.beta_frac

    @property
    def s_width(self) -> int:
        """Bits of ``S`` and ``S' = max(S, 1)``."""
        return max(self.widths["S"], 1)

    @property
    def s_eff_max(self) -> int:
        return max(self.bounds.S, 1)

    @property
    def run_width(self) -> int:
        """Bits of the running statistics ``mu_r``, ``s_r`` (signed, Q.running_frac)."""
        return self.widths["running"]

    @property
    def seff_width(self) -> int:
        """Bits of the per-channel scale the unit keeps: ``S'`` (training) or ``s_r' = max(s_r, 1)`` (eval)."""
        return max(self.s_width, self.run_width)

    @property
    def c_eval_bound(self) -> int:
        """``|C'|`` of the eval thresholds: ``|mu_r 2^Fb - beta_q s_r'|`` with ``|mu_r|, s_r' <= running``."""
        p = self.params
        return (self.bounds.running << p.beta_frac) + (1 << (p.beta_int - 1 + p.beta_frac)) * self.bounds.running

    @property
    def c_width(self) -> int:
        """Bits of the per-channel numerator: ``C`` (training) or ``C'`` (eval)."""
        return max(self.widths["C"], signed_bits(self.c_eval_bound))

    @property
    def count_width(self) -> int:
        """Bits of the signed counts ``Ns`` and ``sum x_hat`` (in ``[-B, B]``)."""
        return signed_bits(self.batch)

    @property
    def beta_width(self) -> int:
        return self.params.beta_int + self.params.beta_frac

    @property
    def k2_width(self) -> int:
        """Bits of the per-channel product ``alpha_q P2`` of the backward pass."""
        return signed_bits(self.bounds.alpha_q * self.bounds.P)

    # --- stream payloads ---
    @property
    def y_layout(self) -> data.StructLayout:
        """``y``: ``lanes`` signed ``Y`` (lane 0 in the low bits), then ``last`` (the XNOR engine's ``y_layout``)."""
        return data.StructLayout({"y": data.ArrayLayout(signed(self.widths["y"]), self.lanes), "last": 1})

    @property
    def x_layout(self) -> data.StructLayout:
        """``x_hat`` (bit ``l`` = lane ``l``, 1 means +1), ``mask`` (1: ``|x| <= 1``), ``last``."""
        return data.StructLayout({"x_hat": self.lanes, "mask": self.lanes, "last": 1})

    @property
    def thr_layout(self) -> data.StructLayout:
        t = signed(self.widths["theta"])
        return data.StructLayout({"theta": t, "lo": t, "hi": t})

    @property
    def stats_layout(self) -> data.StructLayout:
        """One channel's :class:`sim.hw.arith.BnForward` fields, in this order from bit 0."""
        w = self.widths
        t = signed(w["theta"])
        return data.StructLayout(
            {
                "sum_y": signed(w["sum_y"]),
                "S": unsigned(self.s_width),
                "S_eff": unsigned(self.seff_width),
                "theta": t,
                "theta_lo": t,
                "theta_hi": t,
                "alpha_q": unsigned(w["alpha_q"]),
                "C": signed(self.c_width),
                "last": 1,
            }
        )

    @property
    def run_layout(self) -> data.StructLayout:
        """Running statistics of one channel (eval mode, with its ``beta``): ``mu`` (``mu_r``), ``s`` (``s_r``)."""
        return data.StructLayout({"mu": signed(self.run_width), "s": signed(self.run_width)})

    @property
    def dx_layout(self) -> data.StructLayout:
        """``dx`` (``lanes`` signed), ``x_hat`` (bit per lane, 1 means +1), ``last``."""
        return data.StructLayout(
            {"dx": data.ArrayLayout(signed(self.widths["dx"]), self.lanes), "x_hat": self.lanes, "last": 1}
        )

    @property
    def q_layout(self) -> data.StructLayout:
        """``q`` (``lanes`` signed ``Q``), ``last``."""
        return data.StructLayout({"q": data.ArrayLayout(signed(self.widths["Q"]), self.lanes), "last": 1})

    @property
    def p1_layout(self) -> data.StructLayout:
        return data.StructLayout({"p1": signed(self.widths["P"]), "last": 1})

    @property
    def alpha_layout(self) -> data.StructLayout:
        """Per channel, for the backward pass: ``alpha_q`` (from bit 0), then ``zero`` (the batch l1 scale ``S``
        was 0: the channel passes no gradient)."""
        return data.StructLayout({"alpha_q": unsigned(self.widths["alpha_q"]), "zero": 1})


def merge_bounds(layers, *, channels: int | None = None) -> BnLayer:
    """One :class:`BnLayer` whose every bound is the largest of ``layers``' (same batch and params), for a unit
    shared by those layers: its registers hold any of their values. ``channels`` (default: the largest)
    replaces ``fan_out``; ``top`` and ``lanes`` come from the first layer."""
    layers = list(layers)
    if not layers:
        raise ValueError("merge_bounds needs at least one layer")
    bounds = [asdict(b.bounds) for b in layers]
    merged = {k: bounds[0][k] if k == "layer" else max(d[k] for d in bounds) for k in bounds[0]}
    if channels is not None:
        merged["fan_out"] = channels
    return replace(layers[0], bounds=LayerBounds(**merged))


class Phase:
    """Values of :attr:`BnForwardCore.phase`."""

    PASS1, EPI1, PASS2, EPI2, PASS3, EPI3 = range(6)


_FWD_PASSES = (Phase.PASS1, Phase.PASS2, Phase.PASS3)


class _Channels:
    """The channel geometry a BN or po2 unit runs: constants for one layer, or, for a unit shared by layers
    of different channel counts (``channels``, one per layer), signals picked by ``sel`` (the unit's
    ``layer`` input). ``g1``, ``ll1``, ``m1``: groups, real lanes of the last group and channels, minus one;
    ``single``: one group; ``pad``: the lanes past the channels in the last group (bit per lane)."""

    def __init__(self, m: Module, layer: BnLayer, channels, sel, name: str = "ch"):
        L = self.lanes = layer.lanes
        chans = list(channels)
        groups = [-(-c // L) for c in chans]
        lasts = [c - (g - 1) * L for c, g in zip(chans, groups, strict=True)]
        self.max_groups, self.max_channels = max(groups), max(chans)
        self.min_lanes_last = min(lasts)  # lanes below this are real in every group of every layer
        self.all_single, self.any_single = all(g == 1 for g in groups), any(g == 1 for g in groups)
        pads = [((1 << L) - 1) & ~((1 << last) - 1) for last in lasts]
        if len(chans) == 1:
            self.g1, self.ll1, self.m1 = groups[0] - 1, lasts[0] - 1, chans[0] - 1
            self.single, self.pad = Const(int(groups[0] == 1)), Const(pads[0], L)
            return
        self.g1 = Signal(range(self.max_groups), name=f"{name}_g1")
        self.ll1 = Signal(range(L), name=f"{name}_ll1")
        self.m1 = Signal(range(self.max_channels), name=f"{name}_m1")
        self.single = Signal(name=f"{name}_single")
        self.pad = Signal(L, name=f"{name}_pad")
        with m.Switch(sel):
            for i, (c, g, last, pad) in enumerate(zip(chans, groups, lasts, pads, strict=True)):
                with m.Case(i):
                    m.d.comb += [self.g1.eq(g - 1), self.ll1.eq(last - 1), self.m1.eq(c - 1),
                                 self.single.eq(g == 1), self.pad.eq(pad)]

    def real(self, lane: int, last_group):
        """Whether ``lane`` of a beat holds a real channel (``last_group``: the beat is of the last group)."""
        if lane < self.min_lanes_last:
            return Const(1)
        return ~(last_group & self.pad[lane])


def _check_channels(layer: BnLayer, channels) -> list[int]:
    chans = [layer.channels] if channels is None else list(channels)
    for c in chans:
        _check_int("channels", c, 1, 1 << 20)
    if max(chans) > layer.channels:
        raise ValueError(f"channels {chans} exceed the layer geometry's {layer.channels}")
    return chans


def _raw_hazard(ch: _Channels, s1_valid):
    """Whether stage 0 must not accept a beat this cycle: in a layer of one group every beat reads the
    accumulator word that the beat in stage 1 is writing (read-after-write), so such a layer's passes take a beat
    every other cycle. Layers of two or more groups never wait (a word is read again ``G`` beats later)."""
    if not ch.any_single:
        return Const(0)
    return ch.single & s1_valid


def pass_cycles(layer: BnLayer) -> int:
    """Cycles of an accumulating element pass of a BN unit, from the first transfer to the last beat's write:
    ``B G + 1``, or ``2 B`` for a layer of one group (a beat every other cycle, :func:`_raw_hazard`)."""
    return 2 * layer.batch if layer.groups == 1 else layer.beats + 1


X_QUEUE_DEPTH = 8
"""Entries of :class:`BnForwardCore`'s x queue: pass 3 takes a beat only while the queue has room for every beat
ahead of it (its stages never stall); more than the beats in the credit loop (stage 1, ``xr``, the queue's two
cycles, the take), so that an always-ready consumer sees a beat a cycle."""

STATS_QUEUE_DEPTH = 4
"""Entries of :class:`BnForwardCore`'s EPI3 queue (a channel's stats fields from its division's request to its
response): more than the divider holds, so the queue never holds the requests back at the divider's rate."""

THR_WRITE_STAGES = 1
"""Cycles at the end of :class:`BnForwardCore`'s EPI1 and EPI2 (each): a channel's thresholds are registered
before their write to ``thr_mem`` (ECP5 timing proxy, docs/results/timing.md), and the next pass starts once
the last channel's are written."""

BN_FWD_ACC_STAGES = 1
"""Stages of :class:`BnForwardCore`'s element passes after stage 1 (the compares): the accumulators are read,
added to and written a cycle later (ECP5 timing proxy, docs/results.md), so each pass ends that many cycles after
:func:`pass_cycles`."""


class _BeatCounter:
    """Group and row counters of a batch-major pass; advance on ``step``."""

    def __init__(self, m: Module, ch: _Channels, batch: int, step, name: str):
        B = batch
        self.g = Signal(range(ch.max_groups), name=f"{name}_g")
        self.b = Signal(range(B), name=f"{name}_b")
        self.first_row = Signal(name=f"{name}_first_row")
        self.last_group = Signal(name=f"{name}_last_group")
        self.last = Signal(name=f"{name}_last")
        m.d.comb += [
            self.first_row.eq(self.b == 0),
            self.last_group.eq(self.g == ch.g1),
            self.last.eq(self.last_group & (self.b == B - 1)),
        ]
        with m.If(step):
            with m.If(self.last_group):
                m.d.sync += [self.g.eq(0), self.b.eq(Mux(self.b == B - 1, 0, self.b + 1))]
            with m.Else():
                m.d.sync += self.g.eq(self.g + 1)


class _LaneWalker:
    """Group / lane / channel counters of a per-channel sequencer over the real channels."""

    def __init__(self, m: Module, ch: _Channels, name: str):
        self.g = Signal(range(ch.max_groups), name=f"{name}_g")
        self.l = Signal(range(ch.lanes), name=f"{name}_l")
        self.ch = Signal(range(ch.max_channels), name=f"{name}_ch")
        self.last_lane = Signal(name=f"{name}_last_lane")
        self.last_group = Signal(name=f"{name}_last_group")
        m.d.comb += [
            self.last_group.eq(self.g == ch.g1),
            self.last_lane.eq(self.l == Mux(self.last_group, ch.ll1, ch.lanes - 1)),
        ]

    def next_channel(self, m: Module):
        """Sync statements moving to the next channel (wrapping to channel 0 after the last)."""
        with m.If(self.last_lane):
            m.d.sync += self.l.eq(0)
            with m.If(self.last_group):
                m.d.sync += [self.g.eq(0), self.ch.eq(0)]
            with m.Else():
                m.d.sync += [self.g.eq(self.g + 1), self.ch.eq(self.ch + 1)]
        with m.Else():
            m.d.sync += [self.l.eq(self.l + 1), self.ch.eq(self.ch + 1)]


class _CountdownWalker:
    """A per-channel sequencer as :class:`_LaneWalker` (``g``, ``l``, ``ch``, ``last_lane``, ``last_group``,
    :meth:`next_channel`) whose ``last_lane`` is ``left == 0``, a count of the group's lanes still to come in a
    register of its own: the lane index ``l`` then fans out to the data path's lane multiplexers alone. ``left``
    is loaded for group 0 by :meth:`restart` (every cycle while the sequencer rests at channel 0, so that a
    shared unit's layer may change between batches)."""

    def __init__(self, m: Module, ch: _Channels, name: str):
        self._ch = ch
        #: registers that step as ``g`` does in :meth:`next_channel` (copies of it that count by themselves)
        self.followers = []
        #: registers that step as ``l`` does in :meth:`next_channel`
        self.lane_followers = []
        self.g = Signal(range(ch.max_groups), name=f"{name}_g")
        self.l = Signal(range(ch.lanes), name=f"{name}_l")
        self.ch = Signal(range(ch.max_channels), name=f"{name}_ch")
        self.left = Signal(range(ch.lanes), name=f"{name}_left")
        self.last_lane = Signal(name=f"{name}_last_lane")
        self.last_group = Signal(name=f"{name}_last_group")
        m.d.comb += [self.last_group.eq(self.g == ch.g1), self.last_lane.eq(self.left == 0)]

    def _lanes1(self, last_group):
        return Mux(last_group, self._ch.ll1, self._ch.lanes - 1)

    def restart(self, m: Module):
        m.d.sync += self.left.eq(self._lanes1(self._ch.single))

    def next_channel(self, m: Module):
        """Sync statements moving to the next channel (wrapping to channel 0 after the last)."""
        with m.If(self.last_lane):
            m.d.sync += [self.l.eq(0), *(f.eq(0) for f in self.lane_followers)]
            with m.If(self.last_group):
                m.d.sync += [self.g.eq(0), self.ch.eq(0), self.left.eq(self._lanes1(self._ch.single)),
                             *(f.eq(0) for f in self.followers)]
            with m.Else():
                m.d.sync += [self.g.eq(self.g + 1), self.ch.eq(self.ch + 1),
                             self.left.eq(self._lanes1(self.g + 1 == self._ch.g1)),
                             *(f.eq(f + 1) for f in self.followers)]
        with m.Else():
            m.d.sync += [self.l.eq(self.l + 1), self.ch.eq(self.ch + 1), self.left.eq(self.left - 1),
                         *(f.eq(f + 1) for f in self.lane_followers)]

    def lane_of(self, m: Module, mem: _LaneSlices, shape, name: str) -> Signal:
        """``mem.rd_data[l]``: each slice picks its lane at a copy of ``l`` of its own (a lane follower), then the
        slice is picked (timing: ``l`` into the lane multiplexers of every memory, one net to hundreds of LUTs,
        11.3 ns with 85 % routing at the paper's widths on the ECP5 proxy)."""
        lanes = len(mem.rd_data)
        bits = (BN_MEM_SLICE - 1).bit_length()
        picks, first = [], None
        for _lo, n, rd, _wr, sfx in mem.slices:
            l_k = Signal(range(lanes), name=f"{name}_l{sfx}")
            self.lane_followers.append(l_k)
            first = l_k if first is None else first
            pick = Signal(shape, name=f"{name}_pick{sfx}")
            if len(mem.slices) == 1:
                m.d.comb += pick.eq(rd.data[l_k])
            else:
                m.d.comb += pick.eq(rd.data[0] if n == 1 else rd.data[l_k[:bits]])
            picks.append(pick)
        if len(picks) == 1:
            return picks[0]
        out = Signal(shape, name=name)
        with m.Switch(first[bits:]):
            for k, pick in enumerate(picks):
                with m.Case(k):
                    m.d.comb += out.eq(pick)
        return out


def _lane(m: Module, view, index, shape, name: str) -> Signal:
    """``view[index]`` (dynamic lane select) bound to a Signal, so the multiplexer is built once."""
    sig = Signal(shape, name=name)
    m.d.comb += sig.eq(view[index])
    return sig


def mul_const(value, c: int):
    """``value * c`` for a configuration constant ``c >= 0`` (``B``, ``B 2^Fb``, ``K``): a multiplication by a
    constant, which synthesis maps to DSP48 slices (the design leaves most of the device's 220 unused); a
    power-of-two factor of ``c`` is a shift, outside the multiplier."""
    if c < 0:
        raise ValueError(f"mul_const needs a non-negative constant, not {c}")
    if c == 0:
        return Const(0)
    shift = (c & -c).bit_length() - 1
    odd = c >> shift
    prod = value if odd == 1 else value * Const(odd, unsigned(odd.bit_length()))
    return prod << shift if shift else prod


def mul_const_fabric(value, c: int, max_terms: int = 3):
    """``value * c`` as a balanced sum of shifted copies of ``value`` when ``c`` has at most ``max_terms`` set bits
    (``B = 100``: three), else :func:`mul_const`. On the ECP5 proxy a product wider than the 18-bit MULT18 is
    several multipliers joined by adders in the same cycle (a 44-bit ``|Q| B``: 61 cells, 64 MHz); two adder
    levels in the fabric are shorter."""
    if c < 0:
        raise ValueError(f"mul_const_fabric needs a non-negative constant, not {c}")
    if c == 0 or bin(c).count("1") > max_terms:
        return mul_const(value, c)
    return _sum_tree([value << i if i else value for i in range(c.bit_length()) if c >> i & 1])


MUL_PART = 17
"""Bits of the unsigned low parts :func:`_mul_parts` cuts a wide operand into (an 18x18 signed multiplier takes
one part and a narrow second operand)."""


def _mul_parts(m: Module, value, name: str) -> list:
    """The signed ``value`` as ``[(part, shift), ...]`` Signals with ``value = sum(part << shift)``: unsigned
    :data:`MUL_PART`-bit low parts and a signed top part of at most ``MUL_PART + 1`` bits."""
    width = len(value)
    parts, lo = [], 0
    while width - lo > MUL_PART + 1:
        part = Signal(unsigned(MUL_PART), name=f"{name}{len(parts)}")
        m.d.comb += part.eq(value[lo:lo + MUL_PART])
        parts.append((part, lo))
        lo += MUL_PART
    top = Signal(signed(width - lo), name=f"{name}{len(parts)}")
    m.d.comb += top.eq(value[lo:])
    parts.append((top, lo))
    return parts


def _sum_tree(terms):
    """``sum(terms)`` as a balanced tree of two-input additions (fewer adders in series than a chain)."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def divider_widths(layer: BnLayer) -> tuple[int, int, int]:
    """``(dividend, divisor, quotient)`` widths of the forward unit's divider (see :class:`BnForwardCore`)."""
    B = layer.batch
    wd = (B * layer.s_eff_max).bit_length()
    wq = layer.widths["alpha_q"]  # EPI3's alpha; EPI1 and EPI2 divide by constants without the divider
    return wd + wq, wd, wq


EPI1_DIV_STAGES = 2
"""BN forward EPI1: registers between the channel's lane of ``sum_mem`` (plus its offset) and the division by
``B`` (:func:`rtl_gen.divider.const_divide`): the lane chosen within each part of :data:`EPI1_PART` lanes, then
the part; each adds a cycle to EPI1, not a cycle a channel."""

EPI1_PART = 8
"""Lanes of a part of BN forward EPI1's two-stage lane choice (:data:`EPI1_DIV_STAGES`)."""

EPI3_ISSUE = 6
"""BN forward EPI3: cycles from one channel's division request to the next one's (within a group): the lane's
words, the channel's word registered, the products, their sum, the dividend, the request."""


def epi3_responses(layer: BnLayer, div_steps: int = 1) -> list[int]:
    """The cycle (from EPI3's first) of each channel's stats beat in :class:`BnForwardUnit`'s EPI3 when every beat
    is taken at once: per channel the lane's words, the channel's word registered, A's products and sum, the
    dividend (:data:`EPI3_ISSUE` cycles from the previous request taken; the group's read first), one request;
    the beat with each response (the channel's other fields wait in a queue)."""
    wq = divider_widths(layer)[2]
    it, ring = div_iterations(wq, div_steps), div_stages(div_steps)
    M, L = layer.channels, layer.lanes
    return ring_schedule(ring, it, [EPI3_ISSUE] + [EPI3_ISSUE + 1 if c % L == 0 else EPI3_ISSUE for c in range(1, M)])


STATS_OUT_STAGE = 1
"""Cycles of :class:`BnForwardUnit`'s registered stats output (a :class:`~rtl_gen.streams.SkidBuffer`)."""


def forward_cycles(layer: BnLayer, div_steps: int = 1) -> dict[str, int]:
    """Cycles of every phase of :class:`BnForwardUnit` and their ``total`` for one batch with no stalls (see
    there), for a divider resolving ``div_steps`` quotient bits per cycle."""
    wq = divider_widths(layer)[2]
    _check_int("div_steps", div_steps, 1, wq)
    M, L = layer.channels, layer.lanes
    pc = pass_cycles(layer)
    # EPI1: a group's read, then a channel a cycle (the registered dividend, then the division by B, a
    # pipeline); done with the last quotient
    epi1 = 1 + sum(2 if c % L == 0 else 1 for c in range(1, M)) + EPI1_DIV_STAGES + CONST_DIV_LATENCY + 1
    # EPI2 (training): per channel the lane's words registered, beta in, the products of S, S, S' and the term of C,
    # beta S', C, C -+ S' 2^Fb, saturation, the three dividends over B^2 (the group's read first), the request:
    # eleven cycles a channel; done with the last channel's quotients
    epi2 = 11 + sum(12 if c % L == 0 else 11 for c in range(1, M)) + CONST_DIV_LATENCY + 1
    epi1 += THR_WRITE_STAGES
    epi2 += THR_WRITE_STAGES
    epi3 = epi3_responses(layer, div_steps)[-1] + 1 + STATS_OUT_STAGE
    pc += BN_FWD_ACC_STAGES
    out = {
        "pass1": pc,
        "epi1": epi1,
        "pass2": pc,
        "epi2": epi2,
        "pass3": pc,
        "epi3": epi3,
    }
    out["total"] = sum(out.values())
    return out


BN_MEM_SLICE = 8
"""Lanes per slice of the per-group memories of :class:`BnBackwardUnit` (P1, P2, alpha) and of
:class:`BnForwardCore` (the accumulators): each slice is a memory of its own, read at an address register of its
own (timing: one read address reached every lane's LUT-RAM cells, BN backward 11.9 ns with 94 % routing, BN
forward 11.7 ns with 91 %, at the paper's widths on the ECP5 proxy)."""

BN_BWD_MEM_SLICE = 4
"""Lanes per slice of :class:`BnBackwardUnit`'s P1, P2 and alpha memories (each read at an address register of
its own; timing: a P2 slice's read address over eight lanes' LUT-RAM cells, 10.0 ns of routing at the paper's
widths on the ECP5 proxy)."""


class _LaneSlices:
    """A memory of ``lanes`` words of ``shape`` per address, cut into slices of ``slice_lanes`` lanes
    (:data:`BN_MEM_SLICE` unless given),
    each a :class:`~amaranth.lib.memory.Memory` of its own (``{name}_mem``, or ``{name}_mem{k}`` for more than one
    slice). ``rd_data`` joins the slices' read data; ``wr_data`` is cut into their write data; ``slices`` gives
    each slice's first lane, lanes, read port, write port and name suffix (addresses and enables are the
    caller's)."""

    def __init__(self, m: Module, shape, lanes: int, depth: int, name: str, granularity: bool = False,
                 slice_lanes: int = BN_MEM_SLICE):
        bits = Shape.cast(shape).width
        self.rd_data = Signal(data.ArrayLayout(shape, lanes), name=f"{name}_rd_data")
        self.wr_data = Signal(data.ArrayLayout(shape, lanes), name=f"{name}_wr_data")
        self.slices = []
        count = -(-lanes // slice_lanes)
        for k in range(count):
            lo = k * slice_lanes
            n = min(slice_lanes, lanes - lo)
            sfx = "" if count == 1 else str(k)
            mem = m.submodules[f"{name}_mem{sfx}"] = Memory(shape=data.ArrayLayout(shape, n), depth=depth, init=[])
            rd = mem.read_port()
            wr = mem.write_port(granularity=1) if granularity else mem.write_port()
            m.d.comb += [self.rd_data.as_value()[lo * bits:(lo + n) * bits].eq(rd.data.as_value()),
                         wr.data.as_value().eq(self.wr_data.as_value()[lo * bits:(lo + n) * bits])]
            self.slices.append((lo, n, rd, wr, sfx))


class BnForwardCore(wiring.Component):
    """:func:`sim.hw.arith.bn_forward` for one layer, without its divider (see the module docstring).

    Parameters (keyword-only): ``layer`` (:class:`BnLayer`), ``div_steps`` (quotient bits per cycle of the
    divider it is meant for; only used by :meth:`cycles`).

    Ports:
        y: ``In(stream.Signature(layer.y_layout))`` pass 1 (from the XNOR engine).
        y_replay: ``In(stream.Signature(layer.y_layout))`` passes 2 and 3 (the same ``Y``, twice, from the
            controller's buffer).
        beta: ``In(stream.Signature(signed(Ib + Fb)))`` ``beta_q`` per channel, consumed in EPI2.
        eval_mode: ``In(1)`` evaluation mode (hold it for the whole batch; the unit registers it and reads it from
            EPI2 on): EPI2 takes the thresholds from the running statistics (:func:`sim.hw.arith.bn_forward_eval`,
            no division), EPI3 sends ``C' = mu_r 2^Fb - beta_q s_r'`` as ``C`` and ``s_r'`` as ``S_eff`` (the eval
            logits' constants) without computing ``alpha``.
        run: ``In(run_layout)`` ``mu_r``, ``s_r`` of the channel whose ``beta`` is offered (eval mode).
        x: ``Out(stream.Signature(layer.x_layout))`` pass 3.
        stats: ``Out(stream.Signature(layer.stats_layout))`` per channel, in EPI3.
        div_req / div_resp: to and from a :class:`rtl_gen.divider.Divider` with :attr:`div_widths`.
        phase: ``Out(3)`` the current :class:`Phase`.
    """

    def __init__(self, *, layer: BnLayer, div_steps: int = 1, channels=None):
        if not isinstance(layer, BnLayer):
            raise TypeError(f"layer must be a BnLayer, not {layer!r}")
        self._layer = layer
        self._channels = _check_channels(layer, channels)
        wn, wd, wq = divider_widths(layer)
        self._div_widths = (wn, wd, wq)
        self._div_steps = _check_int("div_steps", div_steps, 1, wq)
        req = data.StructLayout({"dividend": wn, "divisor": wd})
        resp = data.StructLayout({"quotient": wq, "remainder": wd, "overflow": 1})
        super().__init__(
            {
                **layer_port(len(self._channels)),
                "y": In(stream.Signature(layer.y_layout)),
                "y_replay": In(stream.Signature(layer.y_layout)),
                "beta": In(stream.Signature(signed(layer.beta_width))),
                "eval_mode": In(1),
                "run": In(layer.run_layout),
                "x": Out(stream.Signature(layer.x_layout)),
                "stats": Out(stream.Signature(layer.stats_layout)),
                "div_req": Out(stream.Signature(req)),
                "div_resp": In(stream.Signature(resp)),
                "phase": Out(3),
            }
        )

    @property
    def bn_layer(self) -> BnLayer:
        return self._layer

    @property
    def div_widths(self) -> tuple[int, int, int]:
        """``(dividend_width, divisor_width, quotient_width)`` of the divider this core needs."""
        return self._div_widths

    @property
    def div_steps(self) -> int:
        return self._div_steps

    @property
    def div_iterations(self) -> int:
        """Cycles per division of the divider (``ceil(quotient_width / div_steps)``)."""
        return -(-self._div_widths[2] // self._div_steps)

    def make_divider(self) -> Divider:
        """A :class:`Divider` matching :attr:`div_widths` and :attr:`div_steps`."""
        wn, wd, wq = self._div_widths
        return Divider(dividend_width=wn, divisor_width=wd, quotient_width=wq, steps=self._div_steps)

    def cycles(self) -> dict[str, int]:
        """Cycles of every phase and their ``total`` for one batch with no stalls (:func:`forward_cycles`)."""
        return forward_cycles(self._layer, self._div_steps)

    def elaborate(self, platform):
        lay = self._layer
        p = lay.params
        w = lay.widths
        m = Module()
        ch = _Channels(m, lay, self._channels, self.layer if len(self._channels) > 1 else None)
        B, G, L, M = lay.batch, ch.max_groups, lay.lanes, ch.max_channels
        fb, fa = p.beta_frac, p.alpha_frac
        ymax = lay.y_bound
        T = ymax + 1
        K = lay.K
        TK = T * K
        wn, wd, wq = self._div_widths

        phase = Signal(range(6), name="phase_r")
        m.d.comb += self.phase.eq(phase)
        # ``phase`` is a pass: a register set with ``phase`` (timing: the decode of ``phase`` in front of the
        # accumulator memories' read address multiplexer, whose output fans out to every LUT RAM cell of the
        # four memories, closed at 88.0 MHz at the paper's widths on the ECP5 proxy)
        in_pass = Signal(init=1, name="in_pass")  # PASS1 = 0 is the reset phase
        # copies of in_pass for its three large groups of loads, set with it (timing: in_pass to the epilogue
        # sequencer's enables, the walkers' restarts and the threshold memory's read port, 11.94 ns with 10.9 of
        # it routing at the paper's widths on the ECP5 proxy): the sequencer's, the walkers', the threshold read's
        in_pass_seq, in_pass_walk, in_pass_thr = (Signal(init=1, name=f"in_pass_{k}", attrs=KEEP)
                                                  for k in ("seq", "walk", "thr"))

        def set_in_pass(v):
            return [r.eq(v) for r in (in_pass, in_pass_seq, in_pass_walk, in_pass_thr)]

        # ---- per-channel state ---------------------------------------------------------------------------
        sum_shape = signed(w["sum_y"])
        cnt_shape = signed(lay.count_width)
        # the accumulators, each cut into slices of lanes (BN_MEM_SLICE)
        sum_mem = _LaneSlices(m, sum_shape, L, G, "sum")
        ys_mem = _LaneSlices(m, sum_shape, L, G, "ys")
        ns_mem = _LaneSlices(m, cnt_shape, L, G, "ns")
        m.submodules.thr_mem = thr_mem = Memory(shape=data.ArrayLayout(lay.thr_layout, L), depth=G, init=[])
        chan_layout = data.StructLayout({"S_eff": unsigned(lay.seff_width), "zero": 1, "C": signed(lay.c_width)})
        m.submodules.chan_mem = chan_mem = Memory(shape=chan_layout, depth=M, init=[])
        thr_rd, thr_wr = thr_mem.read_port(), thr_mem.write_port(granularity=1)
        chan_rd, chan_wr = chan_mem.read_port(), chan_mem.write_port()

        # ---- element passes --------------------------------------------------------------------------------
        # Stage 0 accepts a beat and reads the group's words; stage 1 compares, accumulates (read-modify-write)
        # and, in pass 3, pushes x_hat / mask into the output queue.
        # The stages never stall (``adv`` is 1): pass 3 takes a beat only while the x queue has room for it and
        # every beat ahead of it (``x_credits``, X_QUEUE_DEPTH in all; timing: the x queue's ready as the stall
        # enable of the stage registers and the threshold memory's read register, 528 clock enables, closed at
        # 84.1 MHz at the paper's widths on the ECP5 proxy, 90 % routing)
        m.submodules.x_queue = x_queue = SyncFIFOBuffered(width=Shape.cast(lay.x_layout).width, depth=X_QUEUE_DEPTH)
        x_credits = Signal(range(X_QUEUE_DEPTH + 1), init=X_QUEUE_DEPTH, name="x_credits")
        x_room = Signal(init=1, name="x_room")  # x_credits != 0, a register
        adv = Signal()
        in_done = Signal()  # every beat of this pass accepted
        accept = Signal()
        s1_valid = Signal()
        s1_y = Signal(data.ArrayLayout(signed(w["y"]), L))
        s1_first = Signal()
        s1_last = Signal()
        s1_last_group = Signal()
        s1_g = Signal(range(G))
        in_payload = Signal(lay.y_layout)
        cnt = _BeatCounter(m, ch, B, accept, "in")
        p1 = phase == Phase.PASS1
        hazard = _raw_hazard(ch, s1_valid)
        # pass 3's x_hat and mask are registered (``xr``) before the x queue (timing: the threshold memory's read
        # word, the compares and the queue's input multiplexer in one cycle closed at 82.4 MHz at the paper's
        # widths on the ECP5 proxy)
        xr_valid = Signal(name="xr_valid")
        x_view = data.View(lay.x_layout, x_queue.r_data)
        x_take, x_give, x_next = Signal(), Signal(), Signal.like(x_credits)
        m.d.comb += [
            x_take.eq(self.y_replay.valid & self.y_replay.ready & (phase == Phase.PASS3)),
            x_give.eq(self.x.valid & self.x.ready),
            x_next.eq(x_credits - x_take + x_give),
            self.x.valid.eq(x_queue.r_rdy),
            self.x.payload.eq(x_view),
            x_queue.r_en.eq(self.x.ready),
        ]
        m.d.sync += [x_credits.eq(x_next), x_room.eq(x_next != 0)]
        m.d.comb += [
            adv.eq(1),
            self.y.ready.eq(p1 & ~in_done & ~hazard),
            self.y_replay.ready.eq(((phase == Phase.PASS2) | ((phase == Phase.PASS3) & x_room)) & ~in_done & ~hazard),
            accept.eq((self.y.valid & self.y.ready) | (self.y_replay.valid & self.y_replay.ready)),
            in_payload.eq(Mux(p1, self.y.payload, self.y_replay.payload)),
        ]
        with m.If(accept & cnt.last):
            m.d.sync += in_done.eq(1)
        # a copy of s1_y of its own for the threshold compares (x_hat, mask): the accumulators' adders pull s1_y
        # one way and the threshold memory's compares the other (timing: s1_y -> the mask compare's carry chain ->
        # the x queue's input register, 12.48 ns in context on the ECP5 proxy, 6.6 ns of it the route out of s1_y)
        s1_yc = Signal(data.ArrayLayout(signed(w["y"]), L), name="s1_y_cmp", attrs=KEEP, reset_less=True)
        with m.If(adv):
            m.d.sync += [
                s1_valid.eq(accept),
                s1_y.eq(in_payload.y),
                s1_yc.eq(in_payload.y),
                s1_first.eq(cnt.first_row),
                s1_last.eq(cnt.last),
                s1_last_group.eq(cnt.last_group),
                s1_g.eq(cnt.g),
            ]

        # Stage 1: the compares (pass 3: x_hat / mask into the output queue) and the accumulators' read; stage 2
        # adds and writes the group's words back (a one-group layer waits a cycle per beat). The compare and the
        # add a stage apart (timing: `y >= theta` picking `ns +- 1` into the accumulator memory's write port
        # closed at 94 MHz on the ECP5 proxy).
        s2_valid = Signal()
        s2_last = Signal()
        s2_y = Signal(data.ArrayLayout(signed(w["y"]), L))  # pass 1: y into sum_y
        s2_neg_y = Signal(data.ArrayLayout(signed(w["y"] + 1), L))  # passes 2, 3: -y, and s2_y, into Ys
        s2_sel = Signal(L)  # passes 2, 3: +-1 into Ns
        m.d.sync += s2_valid.eq(s1_valid & adv)
        with m.If(adv):
            m.d.sync += [s2_last.eq(s1_last), s2_y.eq(s1_y)]
        # the accumulators' write enables as registers (stage 2 holds a beat of the pass: its phase is the one of
        # the cycle before; timing: the phase's decode into every LUT-RAM cell's write enable)
        sum_wen = Signal(name="sum_wen")
        cnt_wen = Signal(name="cnt_wen")  # Ys and Ns
        m.d.sync += [sum_wen.eq(s1_valid & adv & (phase == Phase.PASS1)),
                     cnt_wen.eq(s1_valid & adv & ((phase == Phase.PASS2) | (phase == Phase.PASS3)))]
        sum_new = Signal(data.ArrayLayout(sum_shape, L))
        ys_new = Signal(data.ArrayLayout(sum_shape, L))
        ns_new = Signal(data.ArrayLayout(cnt_shape, L))
        sum_old, ys_old, ns_old = sum_mem.rd_data, ys_mem.rd_data, ns_mem.rd_data
        # the first row's clear, a copy of s2_first per accumulator and slice of BN_MEM_SLICE lanes (timing: one
        # s2_first to every lane's clear multiplexer of the three accumulators, then the adder's carry chain into
        # the LUT-RAM write data, 12.85 ns with 10.9 of it routing at the paper's widths on the ECP5 proxy)
        first_c = {}
        for mname in ("sum", "ys", "ns"):
            for k in range(-(-L // BN_MEM_SLICE)):
                f_k = Signal(name=f"s2_first_{mname}{k}", attrs=KEEP, reset_less=True)
                with m.If(adv):
                    m.d.sync += f_k.eq(s1_first)
                first_c[mname, k] = f_k
        x_hat = Signal(L)
        mask = Signal(L)
        for lane in range(L):
            y = s1_yc[lane]
            thr = thr_rd.data[lane]
            sel = Signal(name=f"sel{lane}")  # y >= t_mu (pass 2), y >= theta (pass 3): t_mu lives in slot theta
            neg_y = Signal(signed(w["y"] + 1), name=f"neg_y{lane}")
            m.d.comb += [sel.eq(y >= thr.theta), neg_y.eq(-s1_y[lane])]
            # the compare registered alone, +-y chosen in stage 2 (timing: the compare's carry chain and the choice
            # of +-y in one cycle closed at 92.0 MHz at the paper's widths on the ECP5 proxy)
            with m.If(adv):
                m.d.sync += [s2_sel[lane].eq(sel), s2_neg_y[lane].eq(neg_y)]
            ns_inc = Signal(cnt_shape, name=f"ns_inc{lane}")
            m.d.comb += [
                sum_new[lane].eq(Mux(first_c["sum", lane // BN_MEM_SLICE], 0, sum_old[lane]) + s2_y[lane]),
                ys_new[lane].eq(Mux(first_c["ys", lane // BN_MEM_SLICE], 0, ys_old[lane])
                                + Mux(s2_sel[lane], s2_y[lane], s2_neg_y[lane])),
                ns_inc.eq(Mux(s2_sel[lane], 1, -1)),
                ns_new[lane].eq(Mux(first_c["ns", lane // BN_MEM_SLICE], 0, ns_old[lane]) + ns_inc),
            ]
            real = ch.real(lane, s1_last_group)
            m.d.comb += [
                x_hat[lane].eq(sel & real),
                mask[lane].eq((y >= thr.lo) & (y <= thr.hi) & real),
            ]
        xr = Signal(lay.x_layout, name="xr", reset_less=True)
        m.d.sync += [xr_valid.eq(s1_valid & (phase == Phase.PASS3)),
                     xr.x_hat.eq(x_hat), xr.mask.eq(mask), xr.last.eq(s1_last_group)]
        m.d.comb += [
            x_queue.w_en.eq(xr_valid),  # never full: the credits
            x_queue.w_data.eq(xr),
            sum_mem.wr_data.eq(sum_new),
            ys_mem.wr_data.eq(ys_new),
            ns_mem.wr_data.eq(ns_new),
        ]
        # each slice's write address (stage 2's group) a register of its own, by the slice (timing: one register to the
        # write address of every LUT-RAM slice of the three accumulators, 11.6 ns with 11.1 of it routing at the
        # paper's widths on the ECP5 proxy)
        for mname, mem, wen in (("sum", sum_mem, sum_wen), ("ys", ys_mem, cnt_wen), ("ns", ns_mem, cnt_wen)):
            for _lo, _n, _rd, wr, sfx in mem.slices:
                g_k = Signal(range(G), name=f"s2_g_{mname}{sfx}", attrs=KEEP, reset_less=True)
                with m.If(adv):
                    m.d.sync += g_k.eq(s1_g)
                m.d.comb += [wr.addr.eq(g_k), wr.en.eq(wen)]

        # ---- per-channel sequencer (epilogues) ------------------------------------------------------------
        # (timing: the lane index's fan-out to the lane multiplexers and into the sequencer's own last-lane
        # compare closed at 80.8 MHz at the paper's widths on the ECP5 proxy: _CountdownWalker)
        walk = _CountdownWalker(m, ch, "epi")
        # EPI1 and EPI2 overlap channels: ``walk`` issues a channel's divisions and moves on (WT once every
        # channel's are issued), ``rwalk`` takes the responses in order and writes each channel's thresholds.
        rwalk = _CountdownWalker(m, ch, "resp")
        with m.If(in_pass_walk):  # both rest at channel 0 in a pass
            walk.restart(m)
            rwalk.restart(m)
        est = Signal(range(13), name="est")  # step within the epilogue: a group's read, then a channel's steps
        RD, CH0, CH1, CH2, CH3, WT, CH2A, CH2B, CH0B, CH1B, CH1C, CH0C, CH1R = range(13)
        epi_rd = Signal()
        m.d.comb += epi_rd.eq(~in_pass_thr & (est == RD))
        # beta's ready as a flip-flop, set with every step of ``est`` and in each cycle of EPI2's CH0 but its last:
        # in training, beta is taken from the channel's second cycle in CH0 on (EPI2 below: the lane's words reach
        # the multipliers through registers a cycle behind the lane); in evaluation, which takes no products, from
        # its first (the phase and ``in_pass`` change only with est -> RD, so at a step into CH0 they hold).
        # Timing: the decode of phase, in_pass and est, routed across the die into the beta slice's select copies
        # (skid_valid_c1's reset), was the SMALL design's worst path at one nextpnr seed, 13.07 ns in context
        beta_rdy = Signal(name="beta_rdy")

        def set_est(step):
            into_ch0 = (step == CH0) if isinstance(step, Value) else Const(step == CH0)
            return [est.eq(step), beta_rdy.eq(into_ch0 & (phase == Phase.EPI2) & ~in_pass & self.eval_mode)]

        m.d.comb += self.beta.ready.eq(beta_rdy)
        # in a pass the thresholds are read in stage 0, the accumulators in stage 1. The accumulators are read
        # every cycle (no enable): in a pass their word matters only with a valid stage 2, which follows a stage-1
        # move (its group's word read in that cycle; the RAW hazard check keeps stage 2's write off that group);
        # in an epilogue the group (``walk.g``) changes only with a read cycle (RD), and nothing writes them
        # (timing: the pass's stall ``adv``, from ``phase`` and the x queue, as the clock enable of every read
        # register closed at 79.8 MHz at the paper's widths on the ECP5 proxy)
        # Each accumulator slice reads at an address register of its own that counts by itself (the synthesis
        # keeps the copies apart): in a pass it steps with stage 1's beats (it equals s1_g), in an epilogue it
        # steps as ``walk.g`` does (both wrap to 0 at the end of a pass and of an epilogue; timing: the address
        # as ``Mux(in_pass, s1_g, walk.g)``, one net to every LUT-RAM cell of a memory, 11.7 ns with 91 % routing
        # at the paper's widths on the ECP5 proxy)
        for mem, name in ((sum_mem, "sum"), (ys_mem, "ys"), (ns_mem, "ns")):
            for _lo, _n, port, _wr, sfx in mem.slices:
                rd_g = Signal(range(G), name=f"{name}_rd_g{sfx}")
                with m.If(s1_valid):  # a pass (no beat is taken in an epilogue)
                    m.d.sync += rd_g.eq(Mux(rd_g == ch.g1, 0, rd_g + 1))
                walk.followers.append(rd_g)
                m.d.comb += [port.addr.eq(rd_g), port.en.eq(1)]
        m.d.comb += [thr_rd.addr.eq(Mux(in_pass_thr, cnt.g, walk.g)), thr_rd.en.eq(Mux(in_pass_thr, adv, epi_rd))]
        sum_l = walk.lane_of(m, sum_mem, sum_shape, "sum_l")
        # EPI1's dividend, offset in every lane before the lane choice (timing: the lane index's fan-out into
        # the multiplexer, then the offset's carry chain into the divider's request register closed at 99.6 MHz
        # on the ECP5 proxy; now the index reaches only the final choice)
        # chosen in two registered stages: the lane within each part of EPI1_PART lanes, then the part (timing:
        # the lane index's fan-out into the 64-lane multiplexer, one cycle, closed at 85.4 MHz at the paper's
        # widths on the ECP5 proxy, 87 % routing)
        epi1_n = Signal(wn, name="epi1_dividend")
        epi1_lanes = [Signal(wn, name=f"epi1_dividend{i}") for i in range(L)]
        for i, sig in enumerate(epi1_lanes):
            m.d.comb += sig.eq(sum_mem.rd_data[i] + (B * ymax + B - 1))
        lo_bits = min(EPI1_PART, L).bit_length() - 1 if L > 1 else 0
        parts = [epi1_lanes[i:i + (1 << lo_bits)] for i in range(0, L, 1 << lo_bits)]
        part_r = [Signal(wn, name=f"epi1_part{j}", reset_less=True) for j in range(len(parts))]
        l_hi = Signal(range(len(parts)), name="epi1_part_r", reset_less=True)
        m.d.sync += l_hi.eq(walk.l >> lo_bits)
        for part, reg in zip(parts, part_r, strict=True):
            with m.Switch(walk.l[:lo_bits] if lo_bits else Const(0, 1)):
                for i, sig in enumerate(part):
                    with m.Case(i):
                        m.d.sync += reg.eq(sig)
        with m.Switch(l_hi):
            for j, reg in enumerate(part_r):
                with m.Case(j):
                    m.d.comb += epi1_n.eq(reg)
        ys_l = walk.lane_of(m, ys_mem, sum_shape, "ys_l")
        ns_l = walk.lane_of(m, ns_mem, cnt_shape, "ns_l")
        thr_l = _lane(m, thr_rd.data, walk.l, lay.thr_layout, "thr_l")

        # Pass end: the last beat is in stage 2 and being written.
        with m.If(in_pass & s2_valid & s2_last):  # each pass is followed by its epilogue
            m.d.sync += [phase.eq(phase + 1), *set_in_pass(0), *set_est(RD), in_done.eq(0)]

        # EPI1 and EPI2 end a cycle after their last channel (THR_WRITE_STAGES), when its registered thresholds
        # are written: a layer of one group reads that word in the pass's first cycle
        thr_fin = Signal(name="thr_fin")

        def end_epilogue(next_phase):
            if next_phase == Phase.PASS1:
                m.d.sync += [phase.eq(next_phase), *set_in_pass(1)]
            else:
                m.d.sync += thr_fin.eq(1)

        def channel_done(next_phase):
            walk.next_channel(m)
            with m.If(walk.last_lane):
                m.d.sync += set_est(RD)
                with m.If(walk.last_group):
                    end_epilogue(next_phase)
            with m.Else():
                m.d.sync += set_est(CH0)

        def channel_issued():
            """The issuing side of EPI1 / EPI2 / EPI3: the next channel (its group read first), WT after the last."""
            walk.next_channel(m)
            with m.If(walk.last_lane):
                m.d.sync += set_est(Mux(walk.last_group, WT, RD))
            with m.Else():
                m.d.sync += set_est(CH0)

        def channel_answered(next_phase):
            """The response side of EPI1 / EPI2 / EPI3: a channel's result was taken."""
            rwalk.next_channel(m)
            with m.If(rwalk.last_lane & rwalk.last_group):
                m.d.sync += set_est(RD)
                end_epilogue(next_phase)

        # EPI3's alpha division on the divider (one a channel; responses in order)
        alpha_n = Signal(wn, name="alpha_dividend")
        divisor = Signal(wd, name="divisor_r")
        m.d.comb += [self.div_req.payload.dividend.eq(alpha_n), self.div_req.payload.divisor.eq(divisor)]
        req_fire = Signal()
        m.d.comb += req_fire.eq(self.div_req.valid & self.div_req.ready)
        q_now = self.div_resp.payload.quotient

        # EPI1 and EPI2 divide by the constants B and B^2 (rtl_gen.divider.const_divide: a channel a cycle, the
        # quotients CONST_DIV_LATENCY cycles after the request; responses in order)
        # EPI1's dividend is registered before its partial products, and its request a cycle later
        # (EPI1_DIV_STAGES; timing: the lane multiplexer into the constant product closed at 72 MHz at the
        # paper's widths on the ECP5 proxy); EPI2's dividends are registers already.
        n1_c = Signal((2 * B * ymax + B - 1).bit_length(), name="epi1_n_c")
        m.d.sync += n1_c.eq(epi1_n)
        q1 = const_divide(m, n1_c, B, "epi1_div")
        n2 = [Signal(((2 * TK + K - 1) >> fb).bit_length(), name=f"epi2_n{i}") for i in range(3)]
        q2 = [const_divide(m, n2[i], B * B, f"epi2_div{i}") for i in range(3)]
        c_req = Signal()
        c_req0 = Signal(name="epi1_req_part")
        c_req1 = Signal(name="epi1_req_r")
        m.d.sync += [c_req0.eq(c_req & (phase == Phase.EPI1)), c_req1.eq(c_req0)]
        c_pipe = [Signal(name=f"cdiv_v{i}") for i in range(CONST_DIV_LATENCY)]
        m.d.sync += [c_pipe[0].eq(Mux(phase == Phase.EPI1, c_req1, c_req)),
                     *(c_pipe[i].eq(c_pipe[i - 1]) for i in range(1, CONST_DIV_LATENCY))]
        c_resp = c_pipe[-1]

        # a channel's thresholds are chosen (EPI1's, EPI2's or the eval ones) into registers and written to
        # thr_mem a cycle later (THR_WRITE_STAGES; timing: `C'` saturated -> `t_eval` -> the word's multiplexer ->
        # every lane's LUT RAM write data closed at 81.4 MHz at the paper's widths on the ECP5 proxy)
        thr_word = Signal(lay.thr_layout)
        thr_en = Signal(L, name="thr_en")
        thr_word_r = Signal(lay.thr_layout, name="thr_word_r", reset_less=True)
        thr_en_r = Signal(L, name="thr_en_r")
        thr_addr_r = Signal(range(G), name="thr_addr_r", reset_less=True)
        m.d.sync += [thr_word_r.eq(thr_word), thr_en_r.eq(thr_en),
                     thr_addr_r.eq(Mux(self.eval_mode & (phase == Phase.EPI2), walk.g, rwalk.g))]
        m.d.comb += [thr_wr.addr.eq(thr_addr_r), thr_wr.en.eq(thr_en_r)]
        for lane in range(L):
            m.d.comb += thr_wr.data[lane].eq(thr_word_r)

        # Registers of the per-channel arithmetic.
        beta_r = Signal(signed(lay.beta_width))
        S_r = Signal(unsigned(lay.seff_width))
        s_eff = Signal(unsigned(lay.seff_width))
        mu_r = Signal(signed(lay.run_width))
        c_r = Signal(signed(lay.c_width))
        a_r = Signal(unsigned(w["A"]))
        bs_r = Signal(unsigned(wd))
        chan_l = chan_rd.data
        # EPI3: the channel's word registered as it leaves chan_mem, before B S' and C Ns (timing: the memory's
        # output straight into the constant product B S' closed at 65 MHz at the paper's widths on the ECP5 proxy)
        chan_q = Signal.like(chan_l, name="chan_q", reset_less=True)
        # products and their operands registered apart (timing: a multiplier and the subtraction after it in one
        # cycle closed at 62 MHz on the ECP5 proxy)
        # the channel's lane of the group words, registered (timing: the lane multiplexer in front of a multiplier)
        # The multipliers' operand and product registers have no reset, so that each is the MULT18's own register
        # on the ECP5 proxy (boards/ecp5_dsp.py; timing: sum_r -> a MULT18 in the fabric -> sum_ns, 13.07 ns in
        # context at 427fbc0 seed 2) and the DSP48's on the Zynq
        ys_r = Signal(sum_shape, name="ys_r")
        sum_r = Signal(sum_shape, name="sum_r", reset_less=True)
        ns_r = Signal(cnt_shape, name="ns_r", reset_less=True)
        ysb_r = Signal(mul_const(ys_l, B).shape(), name="ys_b")
        psn_r = Signal((sum_l * ns_l).shape(), name="sum_ns", reset_less=True)
        cterm_r = Signal(signed(lay.c_width), name="c_term")
        # beta_q S' as the products of beta's and S's 17-bit parts (the top part of beta signed), each within one
        # 18x18 multiplier and registered apart in CH1 (from S: S' = 1 where S = 0, beta_q itself), summed in CH1B
        # (timing: a multiplier wider than the 18-bit MULT18 and the adder joining its parts closed at 87 MHz on
        # the ECP5 proxy; with S' 24 bits wide at the paper's widths, at 94 MHz)
        # The multipliers take beta_q and S from copies of beta_r and S_r of their own, loaded with them (the
        # copies have no reset, so the synthesis keeps them apart from the originals): timing, S_r's fan-out
        # placed it far from the multipliers, S_r -> a MULT18 -> beta_s_pp0 closed at 92.0 MHz at the paper's
        # widths on the ECP5 proxy (6.4 ns of routing)
        beta_m = Signal.like(beta_r, name="beta_mul", reset_less=True)
        S_m = Signal.like(S_r, name="s_mul", reset_less=True)
        beta_x = Signal(signed(max(lay.beta_width, 18)), name="beta_x")  # beta_q = beta_hi 2^17 + beta_lo
        beta_lo = Signal(unsigned(17), name="beta_lo")
        beta_hi = Signal(signed(len(beta_x) - 17), name="beta_hi")
        m.d.comb += [beta_x.eq(beta_m), beta_lo.eq(beta_x[:17]), beta_hi.eq(beta_x >> 17)]
        s_parts = []
        for lo in range(0, len(S_m), MUL_PART):
            part = Signal(unsigned(min(MUL_PART, len(S_m) - lo)), name=f"s_part{len(s_parts)}")
            m.d.comb += part.eq(S_m[lo:lo + MUL_PART])
            s_parts.append((part, lo))
        bs_pairs = [(b, sp, bsh + ssh) for b, bsh in ((beta_lo, 0), (beta_hi, 17)) for sp, ssh in s_parts]
        bs_pp = [Signal((b * sp).shape(), name=f"beta_s_pp{i}", reset_less=True)
                 for i, (b, sp, _) in enumerate(bs_pairs)]
        s_zero = Signal(name="s_zero")
        # beta_q S' in two halves, registered in CH1B: beta_lo S' (beta_q itself where S' = 1) and beta_hi S'
        # (0 there), joined in CH1C's subtraction, C = B 2^Fb sum_y - beta_lo S' - beta_hi S' 2^17 (timing: the
        # MULT18s' outputs routed into a two-level adder tree, 10.91 ns at the paper's widths on the ECP5 proxy)
        # (beta_lo is 17 bits of beta_q's two's complement, so the low half is as wide as beta_x S', not beta_q S')
        beta_s_lo = Signal(signed(len(beta_x) + len(S_m) + 2), name="beta_s_lo")
        beta_s_hi = Signal(signed(len(beta_x) + len(S_m) + 2), name="beta_s_hi")
        lo_terms = [r << sh for r, (b, _, sh) in zip(bs_pp, bs_pairs, strict=True) if b is beta_lo]
        hi_terms = [r << (sh - 17) for r, (b, _, sh) in zip(bs_pp, bs_pairs, strict=True) if b is beta_hi]
        ka_r = Signal(mul_const(ys_l, K).shape(), name="ys_k")
        # C Ns as products of C's 17-bit parts (the top part signed), each within one 18x18 multiplier and
        # registered apart; joined in the subtraction of A (timing: the multiplier and the adder joining its parts
        # closed at 102 MHz on the ECP5 proxy)
        c_parts = _mul_parts(m, chan_q.C, "c_part")
        pa_r = [Signal((part * ns_l).shape(), name=f"c_ns{i}", reset_less=True) for i, (part, _) in enumerate(c_parts)]
        v_r = [Signal(signed(w["C"] + 1), name=f"v_thr{i}") for i in range(3)]  # C, C -+ S' 2^Fb
        # their saturation at +-T K: the compares registered every cycle (read in CH2B, a cycle after v_r
        # settles), the saturated value chosen in front of the dividend's add (timing: the compare's carry chain
        # into the clock enable of every bit of v_r, saturated in place, closed at 95.7 MHz at the paper's widths
        # on the ECP5 proxy)
        v_lo = [Signal(name=f"v_thr{i}_lo") for i in range(3)]
        v_hi = [Signal(name=f"v_thr{i}_hi") for i in range(3)]
        m.d.sync += [*(f.eq(v < -TK) for f, v in zip(v_lo, v_r, strict=True)),
                     *(f.eq(v > TK) for f, v in zip(v_hi, v_r, strict=True))]

        def clamp(i):
            return Mux(v_lo[i], -TK, Mux(v_hi[i], TK, v_r[i]))

        # eval threshold ceil(C' / 2^(Fr+Fb)) saturated to [-T, T] (bn_forward_eval): ceil(C' / 2^(Fr+Fb)) into a
        # register every cycle (read a cycle after C' settles), then saturated at +-T (the same: ceil is monotone
        # and +-T 2^(Fr+Fb) are multiples of 2^(Fr+Fb)). Timing: C' saturated at +-T 2^(Fr+Fb) into a register
        # (two compares of C' into its set / reset) closed at 88.5 MHz at the paper's widths on the ECP5 proxy;
        # compare, add and shift into the threshold memory's write port in one cycle at 70 MHz
        # The saturation's compares are registered beside t_raw, from C' itself (ceil(C' / 2^fe) < -T exactly when
        # C' <= -(T + 1) 2^fe, > T exactly when C' > T 2^fe; timing: t_raw's two compares and the choice into the
        # threshold word's register closed at 91.6 MHz at the paper's widths on the ECP5 proxy)
        fe = p.running_frac + fb
        t_eval = Signal(signed(w["theta"]), name="t_eval")
        t_raw = Signal(signed(max(lay.c_width + 1 - fe, T.bit_length() + 2)), name="t_eval_raw")
        t_lo, t_hi = Signal(name="t_eval_lo"), Signal(name="t_eval_hi")
        m.d.sync += [t_raw.eq((c_r + ((1 << fe) - 1)) >> fe),
                     t_lo.eq(c_r <= -((T + 1) << fe)), t_hi.eq(c_r > (T << fe))]
        m.d.comb += t_eval.eq(Mux(t_lo, -T, Mux(t_hi, T, t_raw)))

        m.d.comb += [
            chan_rd.addr.eq(walk.ch),
            chan_rd.en.eq((phase == Phase.EPI3) & (est == CH0)),
            chan_wr.addr.eq(walk.ch),
            chan_wr.data.S_eff.eq(s_eff),
            chan_wr.data.zero.eq(S_r == 0),
            chan_wr.data.C.eq(c_r),
        ]
        # EPI3 overlaps channels as EPI1 / EPI2 do: ``walk`` issues a channel's division (eval: no division) and
        # queues the channel's other stats fields, ``rwalk`` sends a stats beat per response (eval: per queued
        # entry) with alpha_q from the divider. The queue holds more entries than the divider holds divisions.
        stats = self.stats.payload
        s_fields = {k: v for k, v in lay.stats_layout.members.items() if k not in ("alpha_q", "last")}
        m.submodules.stats_queue = s_queue = SyncFIFOBuffered(width=data.StructLayout(s_fields).size,
                                                              depth=STATS_QUEUE_DEPTH)
        s_in = data.View(data.StructLayout(s_fields), s_queue.w_data)
        s_out = data.View(data.StructLayout(s_fields), s_queue.r_data)
        # the channel's lanes of sum_y and the thresholds registered every cycle before the queue's write (they
        # hold from the channel's first cycle, CH0, to its queue write, CH1 in eval mode, CH3 otherwise; timing:
        # the lane index's fan-out into the multiplexers, then the queue's LUT RAM write data, closed at 72.7 MHz
        # at the paper's widths on the ECP5 proxy)
        # Ns's lane too, as the multipliers' operand (EPI2's sum_y Ns, EPI3's C Ns): the lane index into the lane
        # multiplexers, then the route to a MULT18's operand register, 10.81 ns with 9.3 of it routing at the
        # paper's widths on the ECP5 proxy
        sum_q = Signal(sum_shape, name="sum_lane_q", reset_less=True)
        thr_q = Signal(lay.thr_layout, name="thr_lane_q", reset_less=True)
        ns_q = Signal(cnt_shape, name="ns_lane_q", reset_less=True)
        m.d.sync += [sum_q.eq(sum_l), thr_q.eq(thr_l), ns_q.eq(ns_l)]
        m.d.comb += [
            s_in.sum_y.eq(sum_q),
            s_in.S.eq(Mux(chan_l.zero, 0, chan_l.S_eff)),
            s_in.S_eff.eq(chan_l.S_eff),
            s_in.theta.eq(thr_q.theta),
            s_in.theta_lo.eq(thr_q.lo),
            s_in.theta_hi.eq(thr_q.hi),
            s_in.C.eq(chan_l.C),
            *(getattr(stats, k).eq(getattr(s_out, k)) for k in s_fields),
            stats.alpha_q.eq(q_now),
            stats.last.eq(rwalk.ch == ch.m1),
        ]

        with m.If(~in_pass_seq):
            with m.If(est == RD):
                m.d.sync += set_est(CH0)
            with m.Switch(phase):
                with m.Case(Phase.EPI1):
                    # t_mu + Ymax = floor((sum_y + B Ymax + B - 1) / B), in [0, 2 Ymax].
                    m.d.comb += [
                        c_req.eq(est == CH0),
                        thr_word.theta.eq(q1 - ymax),
                        thr_en.eq(Mux(c_resp, 1 << rwalk.l, 0)),
                    ]
                    with m.If(est == CH0):
                        channel_issued()
                    with m.If(c_resp):
                        channel_answered(Phase.PASS2)
                with m.Case(Phase.EPI2):
                    with m.Switch(est):
                        with m.Case(CH0):  # beta in (eval: s_r' = max(s_r, 1), mu_r); the channel's lane
                            # The registers load in every cycle of CH0, the last load the one with beta's transfer
                            # (none of them is read again once the channel has left CH2): ``beta.valid``, from the
                            # parameter unit across the die, only moves ``est`` (timing: it was the clock enable of
                            # all of them, 12.7 ns in context on the ECP5 proxy). The multipliers' sum_y and Ns
                            # come from the lane registers, a cycle behind the lane: in training beta is taken
                            # from CH0's second cycle on (``beta_rdy``)
                            m.d.sync += [
                                beta_r.eq(self.beta.payload), beta_m.eq(self.beta.payload),
                                S_r.eq(Mux(self.run.s < 1, 1, self.run.s)),  # eval (no products)
                                S_m.eq(Mux(self.run.s < 1, 1, self.run.s)),
                                mu_r.eq(self.run.mu),
                                ys_r.eq(ys_l), sum_r.eq(sum_q), ns_r.eq(ns_q),
                                beta_rdy.eq(1),
                            ]
                            with m.If(self.beta.valid & beta_rdy):
                                m.d.sync += set_est(Mux(self.eval_mode, CH1, CH0C))
                        with m.Case(CH0C):  # B Ys, sum_y Ns
                            m.d.sync += [ysb_r.eq(mul_const(ys_r, B)), psn_r.eq(sum_r * ns_r), *set_est(CH0B)]
                        with m.Case(CH0B):  # S = B Ys - sum_y Ns
                            m.d.sync += [S_r.eq(ysb_r - psn_r), S_m.eq(ysb_r - psn_r), *set_est(CH1)]
                        with m.Case(CH1):  # S' = max(S, 1); B 2^Fb sum_y (eval: mu_r 2^Fb)
                            m.d.sync += [s_eff.eq(Mux(S_r == 0, 1, S_r)), s_zero.eq(S_r == 0),
                                         *(r.eq(b * sp) for r, (b, sp, _) in zip(bs_pp, bs_pairs, strict=True)),
                                         cterm_r.eq(Mux(self.eval_mode, mu_r << fb, mul_const(sum_r, B << fb))),
                                         *set_est(CH1B)]
                        with m.Case(CH1B):  # beta_q S' (beta_q where S' = 1)
                            m.d.sync += [beta_s_lo.eq(Mux(s_zero, beta_r, _sum_tree(lo_terms))),
                                         beta_s_hi.eq(Mux(s_zero, 0, _sum_tree(hi_terms))), *set_est(CH1C)]
                        with m.Case(CH1C):  # C = B 2^Fb sum_y - beta_q S' (eval: C' = mu_r 2^Fb - beta_q s_r')
                            m.d.sync += [c_r.eq(cterm_r - beta_s_lo - (beta_s_hi << 17)), *set_est(CH2)]
                        with m.Case(CH2):  # C - S' 2^Fb, C + S' 2^Fb
                            m.d.comb += chan_wr.en.eq(1)
                            m.d.sync += [v_r[0].eq(c_r), v_r[1].eq(c_r - (s_eff << fb)),
                                         v_r[2].eq(c_r + (s_eff << fb)), *set_est(CH2A)]
                        with m.Case(CH2A):  # their saturation's compares (timing: one carry chain a cycle)
                            with m.If(self.eval_mode):  # theta = ceil(C' / 2^(Fr+Fb)), saturated: a shift, no division
                                m.d.comb += [thr_word.theta.eq(t_eval), thr_word.lo.eq(t_eval), thr_word.hi.eq(t_eval),
                                             thr_en.eq(1 << walk.l)]
                                channel_done(Phase.PASS3)
                            with m.Else():
                                m.d.sync += set_est(CH2B)
                        with m.Case(CH2B):  # offset dividends of the three saturated values over B^2 (they hold
                            # until the next channel's, ten cycles on, past their quotients)
                            m.d.sync += [
                                n2[0].eq((clamp(0) + (TK + K - 1)) >> fb),  # ceil(C / K)
                                n2[1].eq((clamp(1) + (TK + K - 1)) >> fb),  # ceil((C - S' 2^Fb) / K)
                                n2[2].eq((clamp(2) + TK) >> fb),  # floor((C + S' 2^Fb) / K)
                                *set_est(CH3),
                            ]
                        with m.Case(CH3):
                            m.d.comb += c_req.eq(1)
                            channel_issued()
                    with m.If(~self.eval_mode):  # the three quotients of a channel together, in channel order
                        m.d.comb += [thr_word.theta.eq(q2[0] - T), thr_word.lo.eq(q2[1] - T), thr_word.hi.eq(q2[2] - T)]
                        with m.If(c_resp):
                            m.d.comb += thr_en.eq(1 << rwalk.l)
                            channel_answered(Phase.PASS3)
                with m.Case(Phase.EPI3):
                    with m.Switch(est):
                        with m.Case(CH0):  # chan_mem read; the channel's lane
                            m.d.sync += [ys_r.eq(ys_l), *set_est(CH1)]
                        with m.Case(CH1):  # A = K sum(x_hat y) - C sum(x_hat); B S'
                            with m.If(self.eval_mode):  # the eval constants C', s_r' go out as they are (no alpha)
                                m.d.comb += s_queue.w_en.eq(s_queue.w_rdy)
                                with m.If(s_queue.w_rdy):
                                    channel_issued()
                            with m.Else():
                                m.d.sync += [ka_r.eq(mul_const(ys_r, K)), chan_q.eq(chan_l), ns_r.eq(ns_q),
                                             *set_est(CH1R)]
                        with m.Case(CH1R):  # the products of the registered channel word
                            m.d.sync += [
                                *(r.eq(part * ns_r) for r, (part, _) in zip(pa_r, c_parts, strict=True)),
                                bs_r.eq(mul_const(chan_q.S_eff, B)),
                                *set_est(CH1B),
                            ]
                        with m.Case(CH1B):
                            m.d.sync += [a_r.eq(_sum_tree([ka_r, *(-(r << sh) for r, (_, sh) in
                                                                  zip(pa_r, c_parts, strict=True))])),
                                         *set_est(CH2)]
                        with m.Case(CH2):  # alpha_q = floor(floor((A 2^(Fa+1) + B S' 2^Fb) / 2^(Fb+1)) / (B S'))
                            m.d.sync += [
                                alpha_n.eq(((a_r << (fa + 1)) + (bs_r << fb)) >> (fb + 1)),
                                *set_est(CH3),
                            ]
                            m.d.sync += divisor.eq(bs_r)
                        with m.Case(CH3):  # the request and the queue entry together
                            m.d.comb += [self.div_req.valid.eq(s_queue.w_rdy), s_queue.w_en.eq(req_fire)]
                            with m.If(req_fire):
                                channel_issued()
        # EPI3's response side: a stats beat per queued channel (with its division's response), under a flag of
        # its own a cycle behind the phase (the queue is empty in EPI3's first cycle and in the cycle after it;
        # timing: the phase's decode into the stats output slice's clock enables, 11.0 ns at the paper's widths on
        # the ECP5 proxy, nearly all routing)
        epi3_q = Signal(name="epi3_q")
        m.d.sync += epi3_q.eq(~in_pass & (phase == Phase.EPI3))
        with m.If(epi3_q):
            s_go = Signal()
            m.d.comb += [
                self.stats.valid.eq(s_queue.r_rdy & (self.eval_mode | self.div_resp.valid)),
                self.div_resp.ready.eq(~self.eval_mode & s_queue.r_rdy & self.stats.ready),
                s_go.eq(self.stats.valid & self.stats.ready),
                s_queue.r_en.eq(s_go),
            ]
            with m.If(s_go):
                channel_answered(Phase.PASS1)
        with m.If(thr_fin):  # EPI1 -> PASS2, EPI2 -> PASS3 (nothing else moves in this cycle: est is RD)
            m.d.sync += [phase.eq(phase + 1), *set_in_pass(1), *set_est(RD), thr_fin.eq(0)]
        return m


class BnForwardUnit(wiring.Component):
    """:class:`BnForwardCore` with its own :class:`rtl_gen.divider.Divider`.

    Parameters (keyword-only): ``layer`` (:class:`BnLayer`), ``div_steps`` (divider quotient bits per cycle).
    Ports: as :class:`BnForwardCore` without the divider ports.

    Cycle model (:meth:`cycles`, :func:`forward_cycles`), counted from the first ``y`` transfer to the last
    ``stats`` transfer, both included: the three passes (``B G + 1`` each, ``2 B`` for a layer of one group,
    :func:`pass_cycles`, then :data:`BN_FWD_ACC_STAGES` more for the accumulators' write); EPI1 and EPI2 from
    :func:`rtl_gen.divider.ring_schedule` (one request a channel a cycle apart, the group's read between groups;
    three a channel ten cycles apart), about ``M I`` and ``3 M I`` once the divider's ring is the bound
    (``I = ceil(Wq / div_steps)``); EPI3 from :func:`epi3_responses` (one request a channel EPI3_ISSUE cycles apart,
    the group's read between groups), about ``max(EPI3_ISSUE, I) M``.
    """

    def __init__(self, *, layer: BnLayer, div_steps: int = 1, channels=None):
        if not isinstance(layer, BnLayer):
            raise TypeError(f"layer must be a BnLayer, not {layer!r}")
        self._layer = layer
        self._channels = _check_channels(layer, channels)
        self._div_steps = _check_int("div_steps", div_steps, 1, divider_widths(layer)[2])
        super().__init__(
            {
                **layer_port(len(self._channels)),
                "y": In(stream.Signature(layer.y_layout)),
                "y_replay": In(stream.Signature(layer.y_layout)),
                "beta": In(stream.Signature(signed(layer.beta_width))),
                "eval_mode": In(1),
                "run": In(layer.run_layout),
                "x": Out(stream.Signature(layer.x_layout)),
                "stats": Out(stream.Signature(layer.stats_layout)),
                "phase": Out(3),
            }
        )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes: int, div_steps: int = 1) -> BnForwardUnit:
        return cls(layer=BnLayer.from_config(cfg, layer_index, lanes=lanes), div_steps=div_steps)

    @property
    def bn_layer(self) -> BnLayer:
        return self._layer

    @property
    def div_steps(self) -> int:
        return self._div_steps

    @property
    def div_widths(self) -> tuple[int, int, int]:
        """``(dividend_width, divisor_width, quotient_width)`` of the unit's divider."""
        return divider_widths(self._layer)

    @property
    def div_iterations(self) -> int:
        return -(-self.div_widths[2] // self._div_steps)

    def cycles(self) -> dict[str, int]:
        return forward_cycles(self._layer, self._div_steps)

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = BnForwardCore(layer=self._layer, div_steps=self._div_steps,
                                                 channels=self._channels)
        if len(self._channels) > 1:
            m.d.comb += core.layer.eq(self.layer)
        m.submodules.divider = div = core.make_divider()
        wiring.connect(m, core.div_req, div.req)
        wiring.connect(m, div.resp, core.div_resp)
        for name in ("y", "y_replay", "beta"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(core, name))
        # eval_mode through a register of the unit's own: it is read from EPI2 on, many cycles after the batch's
        # first beat, so the register's cycle of delay changes nothing, and the top level's phase logic ends at
        # this flip-flop instead of reaching the epilogue's clock enables (the SMALL design's routed critical path
        # at one nextpnr seed: the infer phase's register -> the enable chain -> the EPI3 accumulators' CE,
        # 13.45 ns, 11.7 of it routing)
        eval_q = Signal(name="eval_q")
        m.d.sync += eval_q.eq(self.eval_mode)
        m.d.comb += [core.eval_mode.eq(eval_q), core.run.eq(self.run)]
        wiring.connect(m, core.x, wiring.flipped(self.x))
        # the per-channel stats leave through a registered slice (STATS_OUT_STAGE; timing: the consumers' ready,
        # through the top level's fork, into the stats queue's read enable, 13.9 ns in context on the ECP5 proxy)
        m.submodules.stats_out = so = SkidBuffer(shape=self._layer.stats_layout)
        wiring.connect(m, core.stats, so.i)
        wiring.connect(m, so.o, wiring.flipped(self.stats))
        m.d.comb += self.phase.eq(core.phase)
        return m



BN_BWD_Q_STAGES = 5
"""Pipeline stages of :class:`BnBackwardUnit`'s pass-2 ``Q`` datapath between the beat register and the ``q``
output register: the part's dx operands; its memory words; the products of ``alpha_q`` and ``P2``'s 17-bit parts;
their sum ``alpha_q P2``; the ``pend`` queue (ECP5 timing proxy, docs/results/timing.md)."""

BN_BWD_PEND_DEPTH = 8
"""Beats of :class:`BnBackwardUnit`'s ``pend`` FIFO in front of its ``q`` output: a beat takes a credit as its
first part enters the ``Q`` pipeline, which never stalls, and returns it as it leaves ``pend``; one part a cycle
needs a credit for each beat in the loop (``BN_BWD_Q_STAGES + 1`` cycles and the beat's own parts)."""


def backward_cycles(layer: BnLayer, pass2_lanes: int | None = None) -> dict[str, int]:
    """Cycles of every phase of :class:`BnBackwardUnit` and their ``total`` for one batch with no stalls (pass 2:
    ``lanes / pass2_lanes`` cycles per beat)."""
    pl = layer.lanes if pass2_lanes is None else pass2_lanes
    if pl < 1 or layer.lanes % pl:
        raise ValueError(f"pass2_lanes ({pass2_lanes}) must divide the lanes ({layer.lanes})")
    out = {"pass1": pass_cycles(layer), "epi": layer.groups + layer.channels,
           "pass2": layer.beats * (layer.lanes // pl) + 2 + BN_BWD_Q_STAGES}
    out["total"] = sum(out.values())
    return out


class BnBackwardUnit(wiring.Component):
    """:func:`sim.hw.arith.bn_backward` for one layer: ``P1 = sum dx``, ``P2 = sum dx x_hat`` per channel and
    ``Q_b = 2^Fa (B dx_b - P1) - alpha_q P2 x_hat_b`` per element, and ``Q_b = 0`` for a channel whose ``alpha``
    beat carries the zero-scale flag (``S = 0``; the ``zero`` argument of the golden function).

    Parameters (keyword-only): ``layer`` (:class:`BnLayer`; the ``dx`` width is the layer's
    ``sim.hw.widths`` bound: the loss gradient for the output layer, ``dX`` above times the mask otherwise);
    ``pass2_lanes`` (lanes of the pass-2 ``Q`` datapath, dividing ``layer.lanes``; default all): a pass-2 beat
    takes ``lanes / pass2_lanes`` cycles, its parts joined into one ``q`` beat. The po2 unit's first pass, which
    takes ``q``, runs at its own ``pass1_lanes`` per cycle, so the same number here costs no cycles.

    Ports:
        dx: ``In(stream.Signature(layer.dx_layout))`` pass 1: ``dx`` and the retained ``x_hat`` bits.
        dx_replay: ``In(stream.Signature(layer.dx_layout))`` pass 2: the same beats again.
        alpha: ``In(stream.Signature(layer.alpha_layout))`` per channel, consumed in EPI: ``alpha_q`` and above
            it the ``zero`` flag (the forward pass had ``S = 0``).
        p1: ``Out(stream.Signature(layer.p1_layout))`` ``P1`` (= dbeta) per channel, in EPI.
        q: ``Out(stream.Signature(layer.q_layout))`` pass 2 (padding lanes 0).
        phase: ``Out(2)``: 0 PASS1, 1 EPI, 2 PASS2.

    Cycle model (:meth:`cycles`), from the first ``dx`` transfer to the last ``q`` transfer, both included::

        (B G + 1) + (G + M) + (B G + 2 + BN_BWD_Q_STAGES)

    (pass 1, ``2 B`` for a layer of one group (:func:`pass_cycles`); per group one read cycle and per channel one
    cycle; pass 2 with its drain through the ``Q`` pipeline).
    """

    PASS1, EPI, PASS2 = range(3)

    def __init__(self, *, layer: BnLayer, channels=None, pass2_lanes=None):
        if not isinstance(layer, BnLayer):
            raise TypeError(f"layer must be a BnLayer, not {layer!r}")
        self._layer = layer
        self._channels = _check_channels(layer, channels)
        backward_cycles(layer, pass2_lanes)  # checks pass2_lanes
        self._pass2_lanes = layer.lanes if pass2_lanes is None else pass2_lanes
        super().__init__(
            {
                **layer_port(len(self._channels)),
                "dx": In(stream.Signature(layer.dx_layout)),
                "dx_replay": In(stream.Signature(layer.dx_layout)),
                "alpha": In(stream.Signature(layer.alpha_layout)),
                "p1": Out(stream.Signature(layer.p1_layout)),
                "q": Out(stream.Signature(layer.q_layout)),
                "phase": Out(2),
            }
        )

    @classmethod
    def from_config(cls, cfg, layer_index: int, *, lanes: int) -> BnBackwardUnit:
        return cls(layer=BnLayer.from_config(cfg, layer_index, lanes=lanes))

    @property
    def bn_layer(self) -> BnLayer:
        return self._layer

    def cycles(self) -> dict[str, int]:
        return backward_cycles(self._layer, self._pass2_lanes)

    def elaborate(self, platform):
        from amaranth.lib.fifo import SyncFIFO

        lay = self._layer
        w = lay.widths
        m = Module()
        ch = _Channels(m, lay, self._channels, self.layer if len(self._channels) > 1 else None)
        B, G, L = lay.batch, ch.max_groups, lay.lanes
        fa = lay.params.alpha_frac
        PASS1, EPI, PASS2 = self.PASS1, self.EPI, self.PASS2

        phase = Signal(range(3), name="phase_r")
        m.d.comb += self.phase.eq(phase)
        in_pass = Signal()
        m.d.comb += in_pass.eq(phase != EPI)

        p_shape = signed(w["P"])
        k_shape = signed(lay.k2_width)  # alpha_q P2, formed in pass 2 from the stored P2 and alpha_q
        a_shape = lay.alpha_layout  # alpha_q and the zero-scale flag
        q_shape = signed(w["Q"])
        # P1 and P2 per channel; alpha_q and the zero flag per channel, written lane by lane in EPI, read with the
        # group's P1 / P2 words in pass 2. Each cut into slices of lanes (BN_MEM_SLICE)
        p1_mem = _LaneSlices(m, p_shape, L, G, "p1", slice_lanes=BN_BWD_MEM_SLICE)
        p2_mem = _LaneSlices(m, p_shape, L, G, "p2", slice_lanes=BN_BWD_MEM_SLICE)
        a_mem = _LaneSlices(m, a_shape, L, G, "a", granularity=True, slice_lanes=BN_BWD_MEM_SLICE)

        pl = self._pass2_lanes
        parts = L // pl
        adv = Signal()  # the beat register s1 takes the next beat (or empties)
        in_done = Signal()
        accept = Signal()
        s1_valid = Signal()
        s1 = Signal(lay.dx_layout)
        s1_last = Signal()
        s1_last_group = Signal()
        s1_g = Signal(range(G))
        in_payload = Signal(lay.dx_layout)
        # pass 2: the beat in s1 goes through the Q datapath in ``parts`` parts of ``pl`` lanes (part index pp)
        pp = Signal(range(max(parts, 2)), name="q_part")
        last_pp = Signal()
        m.d.comb += last_pp.eq(pp == parts - 1)
        cnt = _BeatCounter(m, ch, B, accept, "in")
        hazard = _raw_hazard(ch, s1_valid)  # pass 1 only: pass 2 writes no accumulator
        # pass 2's Q pipeline after s1 moves every cycle (no stall enable: timing, ``go`` from the q output's ready
        # into the stages' and the memories' output registers closed at 66-75 MHz at the paper's widths on the ECP5
        # proxy): stage a (the part's dx operands), b (the part's memory words), c (the products of alpha_q and
        # P2's parts, and 2^Fa (B dx - P1)), d (alpha_q P2 joined; Q formed and joined into the beat), then the
        # beat waits in ``pend`` (FIFOs) in front of the q output's skid buffers. A beat's first part enters stage a
        # only while ``pend`` has room for it and for every beat ahead of it (``credit``).
        credit = Signal(range(BN_BWD_PEND_DEPTH + 1), init=BN_BWD_PEND_DEPTH, name="q_credit")
        take = Signal()  # a part of the beat in s1 enters stage a
        m.d.comb += [
            take.eq(s1_valid & (phase == PASS2) & ((pp != 0) | (credit != 0))),
            adv.eq(~(s1_valid & (phase == PASS2)) | (take & last_pp)),
            self.dx.ready.eq((phase == PASS1) & ~in_done & adv & ~hazard),
            self.dx_replay.ready.eq((phase == PASS2) & ~in_done & adv),
            accept.eq((self.dx.valid & self.dx.ready) | (self.dx_replay.valid & self.dx_replay.ready)),
            in_payload.eq(Mux(phase == PASS1, self.dx.payload, self.dx_replay.payload)),
        ]
        if parts > 1:
            with m.If(adv):
                m.d.sync += pp.eq(0)
            with m.Elif(take):
                m.d.sync += pp.eq(pp + 1)
        with m.If(accept & cnt.last):
            m.d.sync += in_done.eq(1)
        with m.If(adv):
            m.d.sync += [
                s1_valid.eq(accept),
                s1.last.eq(in_payload.last),
                s1_last.eq(cnt.last),
                s1_last_group.eq(cnt.last_group),
                s1_g.eq(cnt.g),
            ]
        # the beat's lanes move in slices of BN_MEM_SLICE lanes, each under an enable of its own from a copy of
        # s1_valid (the copies step alike; the synthesis keeps them apart: each enable depends on its own copy;
        # timing: one enable, from s1_valid, reached the clock enable of every payload flip-flop of s1, 10.5 ns
        # with 90 % routing at the paper's widths on the ECP5 proxy)
        # Each slice takes its lanes from dx or dx_replay by a flag of its own, phase == PASS1 kept as a register
        # that toggles where the phase leaves or enters PASS1 (each copy from its own value: the synthesis keeps them
        # apart; timing: the phase register chose the payload of every lane of s1, 10.0 ns with 90 % routing at the
        # paper's widths on the ECP5 proxy)
        p1_flags = []
        for k, lo in enumerate(range(0, L, BN_MEM_SLICE)):
            hi = min(L, lo + BN_MEM_SLICE)
            v_k, adv_k = Signal(name=f"s1_valid{k}"), Signal(name=f"s1_adv{k}")
            p1_k = Signal(init=1, name=f"s1_from_dx{k}")  # phase == PASS1 (PASS1 is the reset phase)
            p1_flags.append(p1_k)
            m.d.comb += adv_k.eq(~(v_k & (phase == PASS2)) | (v_k & ((pp != 0) | (credit != 0)) & last_pp))
            src = [Mux(p1_k, a, b) for a, b in ((self.dx.payload.x_hat[lo:hi], self.dx_replay.payload.x_hat[lo:hi]),
                                               *((self.dx.payload.dx[lane], self.dx_replay.payload.dx[lane])
                                                 for lane in range(lo, hi)))]
            with m.If(adv_k):
                m.d.sync += [v_k.eq(accept), s1.x_hat[lo:hi].eq(src[0]),
                             *(s1.dx[lane].eq(src[1 + lane - lo]) for lane in range(lo, hi))]
        # pass 1's write of the beat in s1 (s1_valid & adv & phase == PASS1: adv is 1 in pass 1, and the beat that
        # ends a pass 2 or pass 1 is the last one taken) as a register: the write enable of every LUT-RAM cell of
        # the P1 and P2 memories comes from a flip-flop (timing: phase -> the enable -> every cell's WRE, 12.1 ns
        # with 89 % routing at the paper's widths on the ECP5 proxy)
        writes = Signal(name="p_wen")
        m.d.sync += writes.eq(accept & (phase == PASS1))
        # the first row's clear of the read words, one copy per lane, each from a batch-row counter of its own
        # (copies with equal inputs would be merged by the synthesis). Timing: one s1_first into the adders of
        # every lane, 960 inputs at the paper's widths, closed at 88.2 / 92.6 MHz on the ECP5 proxy (nextpnr seeds
        # 1 / 2). A counter counts the pass-1 rows whose last beat has been in s1 (its enable from registers:
        # counting the beats taken, ``accept`` -> every lane's counter enable closed at 96.9 MHz at the paper's
        # widths); a beat taken now is of the first row when those rows and the one ending in s1 make 0 mod B
        lane_first = []
        row_end = Signal(name="s1_row_end")  # the beat in s1 ends a pass-1 row
        m.d.comb += row_end.eq(s1_valid & s1_last_group & (phase == PASS1))
        for lane in range(L):
            row = Signal(range(B), name=f"in_b{lane}")
            with m.If(row_end):
                m.d.sync += row.eq(Mux(row == B - 1, 0, row + 1))
            first = Signal(name=f"s1_first{lane}")
            with m.If(adv):
                m.d.sync += first.eq(Mux(row_end, row == B - 1, row == 0))
            lane_first.append(first)
        # P2 is bounded like P1 (both at most sum |dx|)
        p1_new = Signal(data.ArrayLayout(p_shape, L))
        p2_new = Signal(data.ArrayLayout(p_shape, L))
        for lane in range(L):  # P2 + dx and P2 - dx side by side, then the choice (timing: dx's negation and the
            # addition chained closed at 93.7 MHz at the paper's widths on the ECP5 proxy)
            dx = s1.dx[lane]
            xh = s1.x_hat[lane]
            p2_acc = Signal(p_shape, name=f"p2_acc{lane}")
            m.d.comb += [
                p1_new[lane].eq(Mux(lane_first[lane], 0, p1_mem.rd_data[lane]) + dx),
                p2_acc.eq(Mux(lane_first[lane], 0, p2_mem.rd_data[lane])),
                p2_new[lane].eq(Mux(xh, p2_acc + dx, p2_acc - dx)),
            ]

        # The memories read every cycle (no read enable: timing, above) at an address register of their own with
        # no multiplexer behind it (timing: the phase's choice between the pass and EPI addresses drove about 300
        # LUT-RAM cells, 15.3 ns): the group of the beat being accepted in pass 1 (its words are in the read
        # register with the beat in s1), the group the EPI walker reads, and in pass 2 the group of the beat in s1,
        # so that a part's words are in the read register while the part is in stage a. Each copy counts from its
        # own value (the synthesis keeps them apart, one per memory and slice).
        walk = _LaneWalker(m, ch, "epi")
        fire = Signal()
        reads = [(name, port, sfx) for mem, name in ((p1_mem, "p1"), (p2_mem, "p2"), (a_mem, "a"))
                 for _lo, _n, port, _wr, sfx in mem.slices]
        for name, port, sfx in reads:
            rd_g = Signal(range(G), name=f"{name}_rd_g{sfx}")
            step = Mux(rd_g == ch.g1, 0, rd_g + 1)
            with m.Switch(phase):
                with m.Case(PASS1):
                    with m.If(accept):
                        m.d.sync += rd_g.eq(step)
                with m.Case(EPI):
                    with m.If(fire & walk.last_lane):
                        m.d.sync += rd_g.eq(step)
                with m.Default():
                    with m.If(adv):
                        m.d.sync += rd_g.eq(cnt.g)
            m.d.comb += [port.addr.eq(rd_g), port.en.eq(1)]

        dx_shape = lay.dx_layout["dx"].shape.elem_shape
        part_dx = Signal(data.ArrayLayout(dx_shape, pl))
        part_xh = Signal(pl)
        part_real = Signal(pl)
        real_all = Signal(L)
        m.d.comb += real_all.eq(Cat(ch.real(lane, s1_last_group) for lane in range(L)))
        with m.Switch(pp):
            for pi in range(parts):
                with m.Case(pi):
                    m.d.comb += [
                        part_xh.eq(s1.x_hat.word_select(pi, pl)),
                        part_real.eq(real_all.word_select(pi, pl)),
                    ]
        # each lane of the part picks its dx by a part counter of its own, stepping as pp does (copies with equal
        # inputs would be merged by the synthesis; timing: pp into every lane's dx multiplexer, then B dx, closed at
        # 96.6 MHz at the paper's widths on the ECP5 proxy)
        lane_pps = []
        for lane in range(pl):
            lane_pp = Signal.like(pp, name=f"q_part_l{lane}")
            lane_pps.append(lane_pp)
            if parts > 1:
                with m.If(adv):
                    m.d.sync += lane_pp.eq(0)
                with m.Elif(take):
                    m.d.sync += lane_pp.eq(lane_pp + 1)
            with m.Switch(lane_pp):
                for pi in range(parts):
                    with m.Case(pi):
                        m.d.comb += part_dx[lane].eq(s1.dx[pi * pl + lane])
        # stage a: the part's dx operands, its lanes' padding flags, framing. B dx formed into stage b, from the
        # part's registered dx (timing: dx's product by B over two MULT18s, their join and the subtraction of P1
        # in one cycle closed at 91 MHz at the paper's widths on the ECP5 proxy; the lane's dx choice and B dx's
        # two adder levels in one cycle at 99.5 MHz)
        a_valid, a_last_pp, a_last_group = Signal(), Signal(), Signal()
        a_pp = Signal.like(pp)
        # stage b's choice of the part's P1, P2 and alpha words, a part register per lane, each loaded from that
        # lane's part counter (timing: one a_pp picked the part of every lane's words, 10.5 ns, 9.5 routing, at
        # the paper's widths on the ECP5 proxy)
        a_pp_l = [Signal.like(pp, name=f"a_part_l{lane}") for lane in range(pl)]
        a_dx = [Signal.like(part_dx[0], name=f"a_dx{lane}") for lane in range(pl)]
        a_xh = Signal.like(part_xh)
        a_real = Signal.like(part_real)
        m.d.sync += [
            a_valid.eq(take),
            a_pp.eq(pp),
            *(a_pp_l[lane].eq(lane_pps[lane]) for lane in range(pl)),
            a_last_pp.eq(last_pp),
            a_last_group.eq(s1_last_group),
            *(a_dx[lane].eq(part_dx[lane]) for lane in range(pl)),
            a_xh.eq(part_xh),
            a_real.eq(part_real),
        ]
        # stage b: the part's P1, P2 and alpha words from the memories' read registers; the lanes whose Q is 0
        # (padding, or a channel of zero scale)
        part_p1 = Signal(data.ArrayLayout(p_shape, pl))
        part_p2 = Signal(data.ArrayLayout(p_shape, pl))
        part_a = Signal(data.ArrayLayout(a_shape, pl))
        for lane in range(pl):
            with m.Switch(a_pp_l[lane]):
                for pi in range(parts):
                    with m.Case(pi):
                        m.d.comb += [
                            part_p1[lane].eq(p1_mem.rd_data[pi * pl + lane]),
                            part_p2[lane].eq(p2_mem.rd_data[pi * pl + lane]),
                            part_a[lane].eq(a_mem.rd_data[pi * pl + lane]),
                        ]
        b_valid, b_last_pp, b_last_group = Signal(), Signal(), Signal()
        b_pp = Signal.like(pp)
        b_bdx = [Signal(mul_const(part_dx[0], B).shape(), name=f"b_bdx{lane}") for lane in range(pl)]
        b_xh = Signal.like(part_xh)
        b_p1 = Signal.like(part_p1)
        b_p2 = Signal.like(part_p2)
        b_aq = [Signal.like(part_a[lane].alpha_q, name=f"b_aq{lane}") for lane in range(pl)]
        b_clear = Signal(pl)
        m.d.sync += [
            b_valid.eq(a_valid),
            b_pp.eq(a_pp),
            b_last_pp.eq(a_last_pp),
            b_last_group.eq(a_last_group),
            *(b_bdx[lane].eq(mul_const_fabric(a_dx[lane], B)) for lane in range(pl)),
            b_xh.eq(a_xh),
            b_p1.eq(part_p1),
            b_p2.eq(part_p2),
            *(b_aq[lane].eq(part_a[lane].alpha_q) for lane in range(pl)),
            b_clear.eq(~a_real | Cat(part_a[lane].zero for lane in range(pl))),
        ]
        # stage c: alpha_q times each 17-bit part of P2 (a multiplier per part and lane, DSP48) and
        # 2^Fa (B dx - P1); stage d: the parts joined into alpha_q P2 (timing: the 30-bit P2's two multipliers
        # and their join in one cycle closed at 94 MHz at the paper's widths on the ECP5 proxy); then Q
        c_valid, c_last_pp, c_last_group = Signal(), Signal(), Signal()
        c_pp = Signal.like(pp)
        c_xh = Signal.like(part_xh)
        c_clear = Signal(pl)
        c_base = [Signal(q_shape, name=f"c_base{lane}") for lane in range(pl)]
        c_k2p = []  # per lane: (product of a part, its shift)
        for lane in range(pl):
            prods = []
            for i, (part, shift) in enumerate(_mul_parts(m, b_p2[lane], f"p2_part{lane}_")):
                r = Signal((b_aq[lane] * part).shape(), name=f"k2_{lane}_{i}")
                m.d.sync += r.eq(b_aq[lane] * part)
                prods.append((r, shift))
            c_k2p.append(prods)
        m.d.sync += [
            c_valid.eq(b_valid),
            c_pp.eq(b_pp),
            c_last_pp.eq(b_last_pp),
            c_last_group.eq(b_last_group),
            c_xh.eq(b_xh),
            c_clear.eq(b_clear),
            *(c_base[lane].eq((b_bdx[lane] - b_p1[lane]) << fa) for lane in range(pl)),
        ]
        d_valid, d_last_group = Signal(), Signal()
        # the beat's last part: the beat is pushed. A register per slice of BN_MEM_SLICE lanes, each loading
        # under an enable of its own (its value or the new one: so the synthesis keeps the copies apart), each
        # driving only its slice's pend FIFOs (timing: one flip-flop drove the write enable of every lane's
        # LUT-RAM FIFO, 11.2 ns at the paper's widths on the ECP5 proxy)
        push_n = Signal()
        d_push = [Signal(name=f"d_push{k}") for k in range(-(-L // BN_MEM_SLICE))]
        m.d.comb += push_n.eq(c_valid & c_last_pp)
        for push_k in d_push:
            with m.If(push_n | push_k):
                m.d.sync += push_k.eq(push_n)
        d_pp = Signal.like(pp)
        d_xh = Signal.like(part_xh)
        d_clear = Signal(pl)
        d_k2 = [Signal(k_shape, name=f"k2_{lane}") for lane in range(pl)]
        d_base = [Signal(q_shape, name=f"q_base{lane}") for lane in range(pl)]
        m.d.sync += [
            d_valid.eq(c_valid),
            d_pp.eq(c_pp),
            d_last_group.eq(c_last_group),
            d_xh.eq(c_xh),
            d_clear.eq(c_clear),
            *(d_base[lane].eq(c_base[lane]) for lane in range(pl)),
            *(d_k2[lane].eq(_sum_tree([r << sh if sh else r for r, sh in c_k2p[lane]])) for lane in range(pl)),
        ]
        q_part = Signal(data.ArrayLayout(q_shape, pl))
        for lane in range(pl):  # base - k2 and base + k2 side by side, then the choice (timing: the negation of
            # k2 and the subtraction chained closed at 90 MHz at the paper's widths on the ECP5 proxy); a padding
            # lane or a channel of zero scale (S = 0) gives Q = 0
            q_sub, q_add = Signal(q_shape, name=f"q_sub{lane}"), Signal(q_shape, name=f"q_add{lane}")
            m.d.comb += [q_sub.eq(d_base[lane] - d_k2[lane]), q_add.eq(d_base[lane] + d_k2[lane]),
                         q_part[lane].eq(Mux(d_clear[lane], 0, Mux(d_xh[lane], q_sub, q_add)))]
        # the beat's parts so far (the last part joins them as the beat is pushed)
        part_bits = pl * q_shape.width
        beat = Signal(lay.q_layout)
        if parts > 1:
            q_held = Signal((parts - 1) * part_bits, name="q_held")
            for pi in range(parts - 1):
                with m.If(d_valid & (d_pp == pi)):
                    m.d.sync += q_held.word_select(pi, part_bits).eq(q_part.as_value())
            m.d.comb += beat.q.as_value().eq(Cat(q_held, q_part.as_value()))
        else:
            m.d.comb += beat.q.as_value().eq(q_part.as_value())
        m.d.comb += beat.last.eq(d_last_group)
        # one pend FIFO and one registered slice per lane, each with its own pointers and valid bits (all move
        # together; lane 0's carry ``last``): timing, one skid buffer's output enable reached all 705 payload
        # flip-flops of the beat (17 ns at the paper's widths on the ECP5 proxy), one FIFO's pointers all its
        # LUT-RAM cells. The slices are rings (:meth:`SkidBuffer._elaborate_ring`): the payload registers' enables
        # come from the FIFO's level and the slice's own flip-flops, never from ``q.ready`` (timing: in the skid
        # form the consumer's ready reached every lane's 34 payload clock enables, 13.6 ns in the SMALL design in
        # context on the ECP5 proxy)
        pop = Signal()
        start = Signal()  # a beat's first part enters stage a: it takes a credit
        m.d.comb += start.eq(take & (pp == 0))
        for lane in range(L):
            shape = unsigned(q_shape.width + (lane == 0))
            pend = m.submodules[f"q_pend{lane}"] = SyncFIFO(width=shape.width, depth=BN_BWD_PEND_DEPTH)
            queue = m.submodules[f"q_queue{lane}"] = SkidBuffer(shape=shape, ring=True)
            m.d.comb += [
                pend.w_en.eq(d_push[lane // BN_MEM_SLICE]),
                pend.w_data.eq(Cat(beat.q[lane], beat.last) if lane == 0 else beat.q[lane]),
                queue.i.valid.eq(pend.r_rdy),
                queue.i.payload.eq(pend.r_data),
                pend.r_en.eq(queue.i.ready),
                queue.o.ready.eq(self.q.ready),
                self.q.payload.q[lane].eq(queue.o.payload[: q_shape.width]),
            ]
            if lane == 0:
                m.d.comb += [
                    pop.eq(pend.r_rdy & queue.i.ready),
                    self.q.valid.eq(queue.o.valid),
                    self.q.payload.last.eq(queue.o.payload[-1]),
                ]
        with m.If(start & ~pop):
            m.d.sync += credit.eq(credit - 1)
        with m.Elif(pop & ~start):
            m.d.sync += credit.eq(credit + 1)
        with m.If(in_pass & s1_valid & s1_last & adv):  # PASS1 -> EPI or PASS2 -> PASS1
            m.d.sync += [phase.eq(Mux(phase == PASS1, EPI, PASS1)), in_done.eq(0)]
            m.d.sync += [p1_k.eq(~p1_k) for p1_k in p1_flags]

        # Per-channel sequencer: one read cycle per group, then one cycle per channel (alpha in, P1 out).
        rd_cycle = Signal()  # the group's words have been read
        epi_rd = Signal()
        m.d.comb += epi_rd.eq((phase == EPI) & ~rd_cycle)
        p1_l = _lane(m, p1_mem.rd_data, walk.l, p_shape, "p1_l")
        a_en = Signal(L)  # the lane of alpha's write (EPI)
        m.d.comb += [
            self.p1.payload.p1.eq(p1_l),
            self.p1.payload.last.eq(walk.ch == ch.m1),
            p1_mem.wr_data.eq(p1_new),
            p2_mem.wr_data.eq(p2_new),
        ]
        for mem in (p1_mem, p2_mem):
            for _lo, _n, _rd, wr, _sfx in mem.slices:
                m.d.comb += [wr.addr.eq(s1_g), wr.en.eq(writes)]
        for lo, n, _rd, wr, _sfx in a_mem.slices:
            m.d.comb += [wr.addr.eq(walk.g), wr.en.eq(a_en[lo:lo + n])]
        for lane in range(L):
            m.d.comb += a_mem.wr_data[lane].eq(self.alpha.payload)
        with m.If((phase == EPI) & ~epi_rd):
            m.d.comb += [
                self.p1.valid.eq(self.alpha.valid),
                self.alpha.ready.eq(self.p1.ready),
                fire.eq(self.alpha.valid & self.p1.ready),
                a_en.eq(Mux(fire, 1 << walk.l, 0)),
            ]
        with m.If(epi_rd):
            m.d.sync += rd_cycle.eq(1)
        with m.If(fire):
            walk.next_channel(m)
            with m.If(walk.last_lane):
                m.d.sync += rd_cycle.eq(0)
                with m.If(walk.last_group):
                    m.d.sync += phase.eq(PASS2)
        return m
