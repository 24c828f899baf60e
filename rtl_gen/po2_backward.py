"""po2 backward engine of one dense layer: ``dX = dY_po2 W_hat^T`` and ``sgn(dW)``, ``dW = X^T dY_po2``
(docs/arithmetic.md 5.4; golden functions :func:`sim.hw.arith.po2_backward_dx` / ``po2_backward_dw``).

Operands: a po2 code (:attr:`Po2Geometry.code_layout`) is an exponent ``field`` (``k - 1`` bits, 0 = zero)
and a sign bit ``neg``; its value is ``(-1)^neg 2^(field - 1)`` in the layer's unit. Weights and binary
activations are bits (1 = +1); the first layer's activations are signed 8-bit values (``x_max = 128``).

Arithmetic, no multipliers. With binary operands every addend is ``+v`` or ``-v``, ``v = (-1)^neg 2^(f-1)``
(a shifted one-hot, 0 for a zero code): ``+v`` where the weight (dX) or activation (dW) bit is 1. A sum of
such addends is ``2 Q - T`` with ``Q`` the sum of ``v`` over the 1 bits and ``T`` over all of them. The
outputs need no per-output arithmetic in front of the adders: they pick among sums of the shared ``v`` values
by their bits.

- dX: the ``lanes_out`` codes of a cycle are paired; each pair's four signed sums ``+-v_a +-v_b`` are formed
  once, each input picks one per pair by its two weight bits, and the picks are added (the signs are in the
  shared sums, so no input needs a ``- T`` correction).
- dW: each weight accumulates ``2 Q`` over the batch: with one sample per beat the addend is the lane's
  ``2 v`` and the activation bit is the accumulator's clock enable; with ``lanes_b`` samples per beat the
  weight picks among the lane's ``2^lanes_b`` subset sums. ``T`` is one accumulator per lane; a finish
  cycle after the tile's beats adds ``-T`` (the lane's operand in that cycle), takes the sign and clears
  the accumulators through their synchronous reset.

For the first layer's 8-bit activations each addend is the sign-flipped 8-bit value shifted by ``f - 1`` (one
shifter per sample and weight), and the ``lanes_b`` addends of a beat are added.

dX unit (layers above the first): the weight banks of :class:`~rtl_gen.xnor_engine.XnorEngine`'s layout are
read through ``weights`` (:class:`~rtl_gen.xnor_engine.WeightReadSignature`, e.g. from
:class:`rtl_gen.weight_memory.WeightMemory`). Per row ``b`` of ``dY``: for each input word ``k``, for each
output group ``g``, bank row ``g * words + k`` (a ``lanes_in x lanes_out`` tile of ``W``) meets the group's
``lanes_out`` codes; each input sums ``lanes_out`` addends, accumulated over the groups. The codes arrive on
``dy`` (``groups`` beats per row) during the first word and are replayed from a one-row buffer for the others.
With ``dx_passes`` ``P`` (``hw.dx_passes``) the word's inputs are taken ``lanes_in / P`` at a time, one pass
over the groups each (the weight rows are read again), so the unit holds ``lanes_in / P`` adder trees and
accumulators, and each pass's ``lanes_in / P`` sums leave as one beat (``P`` beats per word, in input
order) through a one-entry output register (flip-flops, no distributed RAM). ``rows * depth * P`` cycles.

dW unit: the tile of bank row ``g * words + k`` (``lanes_in x lanes_out`` weights, rows in increasing
order) is computed in ``dw_passes`` passes (``P``, ``hw.dw_passes``) over the batch, pass ``p`` for inputs
``p * lanes_in / P .. (p + 1) * lanes_in / P - 1`` of the word, so the unit holds only
``lanes_in / P x lanes_out`` accumulators. Each pass takes ``lanes_b`` samples per cycle (input word ``k`` of
``X`` and group ``g`` of ``dY``), ``ceil(batch / lanes_b)`` beats, and every pass reads them from ``xdy``
again (the source repeats each tile ``P`` times: :class:`rtl_gen.buffers.TileReader` re-reads the sample-banked
buffers, which costs no storage; a replay memory here took 2 RAMB36). The signs of passes
``0 .. P-2`` are held until the last pass ends; then ``sgn(dW)`` of the tile leaves as one
:func:`rtl_gen.weight_memory.grad_layout` beat, the weight memory's gradient input.
``depth * (ceil(batch / lanes_b) + 1) * P`` cycles. ``P`` trades cycles for LUTs: the accumulators are
the largest part of the unit at ``P = 1``.

Padding (bits past ``n_in``, lanes past ``n_out``, samples past ``batch`` in a tile's last beat) is masked;
its input values do not matter and padded outputs are 0. The units go by their counters; ``last`` flags on
the inputs are not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from amaranth import Cat, Const, Module, Mux, ResetSignal, Shape, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.hw.arith import ArithParams
from sim.hw.widths import layer_bounds

from .streams import KEEP, SkidBuffer, StreamFIFO, credit, replicas
from .weight_memory import grad_layout
from .xnor_engine import WeightReadSignature, XnorGeometry, _check_int

__all__ = [
    "ARRAY_FIELD", "CodeReadSignature", "DW_LATENCY", "DX_LATENCY", "Po2Backward", "Po2Geometry", "array_mode",
    "envelope", "passes_for",
]  # fmt: skip

DX_LATENCY = 7
"""dX: cycles beyond one per tile read, from the first ``dy`` transfer to the last ``dx`` transfer (both
included): weight read, the addends' decode, pair sums, picks and their sums by twos, the rest of the adder tree,
accumulate, ``pend`` and queue."""

DX_PEND_DEPTH = 8
"""Entries of the fabric dX unit's ``pend`` FIFO (its stages never stall; a step that ends a word's pass issues
only with a credit for its entry): the credit loop, from an issue to the return of its credit when the entry
leaves, is the five stages, the FIFO and the credit's register, so eight let a pass of one group push a word a
cycle."""

PICK_GROUP = 4
"""Inputs of the fabric dX unit whose picks read one copy of the registered pair sums."""

DW_LATENCY = 7
"""dW: cycles beyond one per input beat, from the first ``xdy`` transfer to the last ``dw`` transfer: operand
register, the codes decoded into powers of two, addends, accumulate, the signs registered, push into ``pend``, the
queue."""

DW_PEND = 2
"""Tiles the dW unit's ``pend`` queue holds (its stages never stall: a tile starts only while ``pend`` has room for
it and for every tile started before it that has not left ``pend``). ``pend`` is a
:class:`~rtl_gen.streams.SkidBuffer` (flip-flops: as distributed RAM its one write enable into every RAM cell of a
tile closed at 82 MHz on the ECP5 proxy)."""

ARRAY_STAGES = 4
"""Pipeline stages of the array's slices between stage 1 and the accumulators (stage c, where each lane's chosen
code waits before its decode, two A / B operand registers, A1 A2 and B1 B2 of a DSP48 with AREG = BREG = 2, and
the product's M register): a pass's or block's sums are captured this many cycles after its finish cycle leaves
stage 1, which it leaves only when the drain will be free by then. The second operand registers are the
multiplier's own (on the ECP5 proxy boards/ecp5_dsp.py moves them into the MULT18), so the first ones reach them
over a cycle of their own: with one operand register, inside the MULT18, stage 1's code choice and decode ended
at the MULT18's input across the die (58.1 MHz for a quarter array). Stage c registers each lane's code after
its choice, so B1 takes the decode alone (the window's buffer select -> the code choice -> the decode -> B1,
14.06 ns, 71.1 MHz for a quarter array at 2319ec1)."""

ARRAY_DX_LATENCY = 4 + ARRAY_STAGES
"""Array dX: cycles beyond the windows, finish cycles and drain lanes (see :meth:`Po2Geometry.array_dx_cycles`):
the slices' stages, the capture, the drain's head row and its output register (stage V)."""

ARRAY_DW_LATENCY = 4 + ARRAY_STAGES
"""Array dW: cycles beyond the passes and the last drain (see :meth:`Po2Geometry.array_dw_cycles`): the slices'
stages, the capture, the drain's stage V, the push and the queue."""

DSP_A_BITS, DSP_B_BITS, DSP_P_BITS = 25, 18, 48
"""Multiplier operand and accumulator widths of a Xilinx 7-series DSP48E1 slice (signed): the dW unit's
packed multiply-accumulates (:attr:`Po2Geometry.dsp_fields`) stay within them so synthesis maps each to one
slice."""


ARRAY_FIELD = DSP_A_BITS - 1
"""Bits of each of the two sums a DSP48 slice of the array accumulates (:func:`array_mode`)."""


def passes_for(cfg, unit: str, lanes_in: int) -> int:
    """Passes of the ``"dw"`` or ``"dx"`` unit of a layer with ``lanes_in`` input bits per word:
    ``hw.dw_passes`` / ``hw.dx_passes``, at most ``lanes_in`` (both are powers of two, or ``lanes_in`` is a
    multiple of 32 >= the passes)."""
    return min(getattr(cfg.hw, f"{unit}_passes"), lanes_in)


def _tree_sum(values):
    values = list(values)
    if not values:
        return Const(0, 1)
    while len(values) > 1:
        values = [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)] + (
            [values[-1]] if len(values) % 2 else []
        )
    return values[0]


@dataclass(frozen=True, kw_only=True)
class Po2Geometry:
    """Sizes of the po2 backward engine of one dense layer.

    ``bank``: :class:`XnorGeometry` (``n_in``, ``n_out``, ``lanes_in``, ``lanes_out``: the weight-bank layout
    and the dX/dW tile); ``batch``; ``dy_bits`` (k); ``x_max`` (1 binary, 128 int8 activations);
    ``lanes_b`` (samples per dW beat); ``dx_width`` (dX register bits, 0 = no dX unit, the first layer);
    ``dw_width`` (dW accumulator bits); ``dw_passes`` (dW passes per tile) and ``dx_passes`` (dX passes per
    word), both dividing ``lanes_in``; ``dw_dsp``: build the dW accumulators as multiply-accumulates that
    synthesis maps to DSP48 slices, two weights per slice where the widths allow (:attr:`dsp_fields`);
    ``dx_dsp``: compute dX on those slices too where the layers allow it (:func:`array_mode`); ``dw_ternary``:
    the dW codes are ternary (``hw.dw_window``: field 0 or 1, any nonzero field counts as +-1), which lets the
    array pack four weights into a slice (:attr:`dw_pairs`).
    :meth:`Po2Backward.from_config` takes the widths from :mod:`sim.hw.widths`.
    """

    bank: XnorGeometry
    batch: int
    dy_bits: int
    x_max: int
    lanes_b: int
    dx_width: int
    dw_width: int
    dw_passes: int = 1
    dx_passes: int = 1
    dw_dsp: bool = False
    dx_dsp: bool = False
    dw_ternary: bool = False

    def __post_init__(self):
        if not isinstance(self.bank, XnorGeometry):
            raise TypeError(f"bank must be an XnorGeometry, not {self.bank!r}")
        _check_int("batch", self.batch, 1, 1 << 20)
        _check_int("dy_bits", self.dy_bits, 2, 8)
        if self.x_max not in (1, 128):
            raise ValueError(f"x_max must be 1 (binary input) or 128 (int8 input), not {self.x_max!r}")
        _check_int("lanes_b", self.lanes_b, 1, 4096)
        _check_int("dx_width", self.dx_width, 0, 64)
        _check_int("dw_width", self.dw_width, 2, 64)
        _check_int("dw_passes", self.dw_passes, 1, self.bank.lanes_in)
        _check_int("dx_passes", self.dx_passes, 1, self.bank.lanes_in)
        for name in ("dw_passes", "dx_passes"):
            if self.bank.lanes_in % getattr(self, name):
                raise ValueError(f"{name} ({getattr(self, name)}) must divide lanes_in ({self.bank.lanes_in})")

    @classmethod
    def from_config(
        cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, lanes_b: int, dw_passes: int | None = None,
        dx_passes: int | None = None, dx_dsp: bool | None = None,
    ) -> Po2Geometry:
        """Weight layer ``layer_index`` of ``cfg``: shape, batch, ``x_max`` and the dX / dW register widths from
        :func:`sim.hw.widths.layer_bounds`, ``k`` from ``approx.dy_bits``. The first layer has no dX unit (its
        dX is not computed). ``dx_dsp`` defaults to ``hw.dx_dsp`` (a system passes false where the layer below
        cannot take the array's dX words)."""
        bounds = layer_bounds(cfg)
        _check_int("layer_index", layer_index, 0, len(bounds) - 1)
        b = bounds[layer_index]
        widths = b.widths()
        return cls(
            bank=XnorGeometry(n_in=b.fan_in, n_out=b.fan_out, lanes_in=lanes_in, lanes_out=lanes_out),
            batch=b.n,
            dy_bits=ArithParams.from_config(cfg).k,
            x_max=b.x_max,
            lanes_b=lanes_b,
            dx_width=widths["dX"] if layer_index > 0 else 0,
            dw_width=widths["dW"],
            dw_passes=passes_for(cfg, "dw", lanes_in) if dw_passes is None else dw_passes,
            dx_passes=passes_for(cfg, "dx", lanes_in) if dx_passes is None else dx_passes,
            dw_dsp=cfg.hw.dw_dsp,
            dx_dsp=cfg.hw.dx_dsp if dx_dsp is None else dx_dsp,
            dw_ternary=bool(cfg.hw.dw_window),
        )

    @property
    def dsp_fields(self) -> int:
        """Weights per DSP48 multiply-accumulate in the dW unit: 0 (fabric accumulators), 1 or 2.

        Only for binary activations and one sample per beat, with ``dw_dsp``. Each slice computes
        ``P = (first ? K : P) + A v`` (``K`` a constant bias, see ``_Dw._dsp_accumulators``): ``v`` the lane's
        signed addend (``B`` port, at most :data:`DSP_B_BITS` bits), ``A = sum_f (+-1) 2^(f F)`` the weights'
        activation signs packed ``F = dw_width`` bits apart (``A`` port, :data:`DSP_A_BITS` bits signed), ``P``
        :data:`DSP_P_BITS` bits. Two fields fit when ``F <= DSP_A_BITS - 2`` and ``2 F <= DSP_P_BITS``."""
        if not self.dw_dsp or self.x_max != 1 or self.lanes_b != 1 or self.span + 2 > DSP_B_BITS:
            return 0
        F = self.dw_width
        if F <= DSP_A_BITS - 2 and 2 * F <= DSP_P_BITS:
            return 2
        return 1 if F <= DSP_P_BITS else 0

    @property
    def ternary_field(self) -> int:
        """Bits of a signed ternary dW sum, ``|X^T t| <= batch x_max``."""
        return (self.batch * self.x_max).bit_length() + 1

    @property
    def dw_pairs(self) -> bool:
        """On the array (:func:`array_mode`), ternary dW codes go two lanes to a slice: ``P += A v`` with ``A =
        s_0 + s_1 2^Ft`` (two activation signs) and ``v = t_a + t_b 2^(2 Ft)`` (the ternary codes of lanes ``a``
        and ``b = a + lanes_out / 2``), ``Ft`` = :attr:`ternary_field`: four weights a slice instead of two, so
        the array runs the passes of a tile in pairs (:attr:`dw_reads`). Needs ``v`` within the B port (``2 Ft +
        2 <= 18``: batch <= 127 for binary activations) and an even number of passes."""
        ft = self.ternary_field
        return (self.dw_ternary and self.x_max == 1 and self.lanes_b == 1 and self.dw_passes % 2 == 0
                and self.bank.lanes_out % 2 == 0 and 2 * ft + 2 <= DSP_B_BITS)

    @property
    def dw_reads(self) -> int:
        """Times an array (:func:`array_mode`) reads each dW tile: ``dw_passes``, half of it with :attr:`dw_pairs`
        (the fabric dW unit always reads ``dw_passes`` times)."""
        return self.dw_passes // 2 if self.dw_pairs else self.dw_passes

    @property
    def planes(self) -> int:
        """Exponent planes: fields ``1 .. 2^(k-1) - 1``."""
        return (1 << (self.dy_bits - 1)) - 1

    @property
    def span(self) -> int:
        """Largest shift of an addend, ``planes - 1`` (= ``ArithParams.span``)."""
        return self.planes - 1

    @property
    def code_layout(self) -> data.StructLayout:
        return data.StructLayout({"field": self.dy_bits - 1, "neg": 1})

    @property
    def x_shape(self) -> Shape:
        return unsigned(1) if self.x_max == 1 else signed(8)

    @property
    def dy_layout(self) -> data.StructLayout:
        """dX input, one beat per output group: ``codes`` (``lanes_out`` codes of row ``b``), ``last``."""
        return data.StructLayout({"codes": data.ArrayLayout(self.code_layout, self.bank.lanes_out), "last": 1})

    @property
    def dx_layout(self) -> data.StructLayout:
        """dX output, one beat per pass of an input word: ``dx`` (the pass's ``lanes_in / dx_passes`` signed
        values, inputs in order), ``last`` (the row's last beat)."""
        return data.StructLayout(
            {"dx": data.ArrayLayout(signed(max(self.dx_width, 1)), self.dx_lanes), "last": 1}
        )

    @property
    def dx_lanes(self) -> int:
        """dX values per output beat: the inputs of one pass, ``lanes_in / dx_passes``."""
        return self.bank.lanes_in // self.dx_passes

    @property
    def xdy_layout(self) -> data.StructLayout:
        """dW input, ``lanes_b`` samples of one tile: ``x[s][i]`` and ``dy[s][l]``, ``last`` (tile's last beat)."""
        b = self.bank
        return data.StructLayout(
            {
                "x": data.ArrayLayout(data.ArrayLayout(self.x_shape, b.lanes_in), self.lanes_b),
                "dy": data.ArrayLayout(data.ArrayLayout(self.code_layout, b.lanes_out), self.lanes_b),
                "last": 1,
            }
        )

    @property
    def beats_per_tile(self) -> int:
        return -(-self.batch // self.lanes_b)

    def dx_cycles(self, rows: int) -> int:
        """dX cycles for ``rows`` rows with no stalls (see :data:`DX_LATENCY`)."""
        return rows * self.bank.depth * self.dx_passes + DX_LATENCY if rows else 0

    def dw_cycles(self) -> int:
        """dW cycles for one batch with no stalls (see :data:`DW_LATENCY`): per tile and pass, one cycle per
        beat and one finish cycle."""
        return self.bank.depth * (self.beats_per_tile + 1) * self.dw_passes + DW_LATENCY

    # --- the array (dX and dW on the same DSP48 slices: array_mode) ---

    @property
    def array_samples(self) -> int:
        """Samples of one dX block of the array: ``lanes_out / dw_passes`` (each DSP lane holds one sample and
        one ``lanes_in / dw_passes``-input part of the word)."""
        return max(1, self.bank.lanes_out // self.dw_passes)

    @property
    def array_dx_layout(self) -> data.StructLayout:
        """dX output of the array, one word of the layer below's buffer per beat: ``dx`` (``lanes_in /
        dw_passes`` signed values, one sample's inputs in order) and ``addr`` (``sample * words_below + part``,
        ``words_below = n_in / (lanes_in / dw_passes)``)."""
        b = self.bank
        words = self.batch * b.words * self.dw_passes
        return data.StructLayout(
            {"dx": data.ArrayLayout(signed(max(self.dx_width, 1)), b.lanes_in // self.dw_passes),
             "addr": unsigned(max(1, (words - 1).bit_length()))}
        )

    def array_dx_words(self) -> int:
        """dX words the array writes for this layer: ``batch * n_in / (lanes_in / dw_passes)``."""
        return self.batch * (self.bank.n_in // (self.bank.lanes_in // self.dw_passes))

    def array_dx_cycles(self) -> int:
        """Array dX cycles with no stalls, from the ``dx_start`` cycle to the last ``dx`` transfer (both
        included): a window of ``lanes_out`` cycles that loads the first codes, then per block (``NS`` samples,
        one word) ``groups`` windows of ``lanes_out`` cycles and a finish cycle, but at least the drain of the
        block before (``lanes_out + ARRAY_STAGES`` cycles, :data:`ARRAY_STAGES`), then the last block's drain up
        to its last real word."""
        b, NS, P = self.bank, self.array_samples, self.dw_passes
        blocks = -(-self.batch // NS)
        s_last = self.batch - (blocks - 1) * NS
        parts_last = self.bank.n_in // (b.lanes_in // P) - (b.words - 1) * P  # real parts of the last word
        last_lane = max(q * NS + s for q in range(parts_last) for s in range(s_last))
        n, block = blocks * b.words, b.groups * b.lanes_out + 1
        wait = max(0, b.lanes_out + ARRAY_STAGES - block)  # a block's finish cycle waits for the drain before
        return b.lanes_out + n * block + (n - 1) * wait + ARRAY_DX_LATENCY + last_lane

    def array_dw_cycles(self) -> int:
        """Array dW cycles for one batch with no stalls, from the first ``xdy`` transfer to the last ``dw``
        transfer: per pass the beats and a finish cycle, but at least the drain of the previous pass
        (``lanes_out + ARRAY_STAGES`` cycles, :data:`ARRAY_STAGES`)."""
        LO, P, NB = self.bank.lanes_out, self.dw_reads, self.beats_per_tile
        n = self.bank.depth * P
        return NB + 1 + (n - 1) * max(NB + 1, LO + ARRAY_STAGES) + LO + ARRAY_DW_LATENCY

    # --- host-side packing (controller model and tests) ---

    def _codes(self, neg, field) -> np.ndarray:
        field = np.asarray(field, dtype=np.int64)
        if field.min(initial=0) < 0 or field.max(initial=0) > self.planes:
            raise ValueError(f"po2 fields must be in 0..{self.planes}")
        return field | (np.asarray(neg, dtype=np.int64) << (self.dy_bits - 1))

    def dy_beats(self, neg, field) -> list[int]:
        """``dy`` payloads for codes ``[rows, n_out]``: per row, ``groups`` beats."""
        b = self.bank
        codes = self._codes(neg, field)
        rows = codes.shape[0]
        padded = np.zeros((rows, b.groups * b.lanes_out), dtype=np.int64)
        padded[:, : b.n_out] = codes
        beats = padded.reshape(rows * b.groups, b.lanes_out)
        last = np.tile(np.arange(b.groups) == b.groups - 1, rows).astype(np.int64)
        return _pack(np.concatenate([beats, last[:, None]], axis=1), [self.dy_bits] * b.lanes_out + [1])

    def unpack_dx(self, beats: list[int]) -> np.ndarray:
        """``dX [rows, n_in]`` from ``dx`` payloads (checks ``last``)."""
        b = self.bank
        per_row = b.words * self.dx_passes
        vals = _unpack(beats, [self.dx_width] * self.dx_lanes + [1], signed_fields=self.dx_lanes)
        if len(vals) % per_row:
            raise ValueError(f"{len(vals)} dx beats is not a whole number of rows of {per_row}")
        last = vals[:, -1].reshape(-1, per_row)
        if not (last == (np.arange(per_row) == per_row - 1)).all():
            raise AssertionError("dx last flags do not mark each row's last beat")
        return vals[:, :-1].reshape(-1, b.words * b.lanes_in)[:, : b.n_in]

    def xdy_beats(self, x, neg, field, reads: int | None = None) -> list[int]:
        """``xdy`` payloads for activations ``x [batch, n_in]`` (bits or int8) and codes ``[batch, n_out]``:
        tiles in bank-row order, each ``reads`` (default ``dw_passes``; an array with :attr:`dw_pairs` reads
        :attr:`dw_reads`) times ``beats_per_tile`` beats, padding samples zero."""
        b = self.bank
        B, S, nb = self.batch, self.lanes_b, self.beats_per_tile
        x = np.asarray(x, dtype=np.int64)
        if x.shape != (B, b.n_in):
            raise ValueError(f"x must have shape {(B, b.n_in)}, not {x.shape}")
        codes = self._codes(neg, field)
        xw = 1 if self.x_max == 1 else 8
        xp = np.zeros((nb * S, b.words * b.lanes_in), dtype=np.int64)
        xp[:B, : b.n_in] = x & ((1 << xw) - 1)
        cp = np.zeros((nb * S, b.groups * b.lanes_out), dtype=np.int64)
        cp[:B, : b.n_out] = codes
        xs = xp.reshape(nb, S, b.words, b.lanes_in)  # beat, sample, word, bit
        cs = cp.reshape(nb, S, b.groups, b.lanes_out)
        rows = []
        for g in range(b.groups):
            for k in range(b.words):
                xt = xs[:, :, k, :].reshape(nb, S * b.lanes_in)
                ct = cs[:, :, g, :].reshape(nb, S * b.lanes_out)
                last = (np.arange(nb) == nb - 1).astype(np.int64)[:, None]
                rows.extend([np.concatenate([xt, ct, last], axis=1)] * (reads or self.dw_passes))
        widths = [xw] * (S * b.lanes_in) + [self.dy_bits] * (S * b.lanes_out) + [1]
        return _pack(np.concatenate(rows, axis=0), widths)

    def unpack_dw(self, beats: list[int]) -> np.ndarray:
        """``sgn(dW) [n_in, n_out]`` (int8) from ``dw`` payloads (checks ``last`` and that padding is 0)."""
        b = self.bank
        n = b.lanes_in * b.lanes_out
        vals = _unpack(beats, [2] * n + [1], signed_fields=n)
        if len(vals) != b.depth:
            raise ValueError(f"{len(vals)} dw beats; expected {b.depth}")
        if not (vals[:, -1] == (np.arange(b.depth) == b.depth - 1)).all():
            raise AssertionError("dw last flag does not mark the last tile")
        t = vals[:, :-1].reshape(b.groups, b.words, b.lanes_out, b.lanes_in)  # g, k, lane, bit
        full = t.transpose(1, 3, 0, 2).reshape(b.words * b.lanes_in, b.groups * b.lanes_out)
        if full[b.n_in :, :].any() or full[:, b.n_out :].any():
            raise AssertionError("dw padding positions are not 0")
        return full[: b.n_in, : b.n_out].astype(np.int8)


def _pack(vals: np.ndarray, widths: list[int]) -> list[int]:
    out = np.zeros(vals.shape[0], dtype=object)
    shift = 0
    for j, w in enumerate(widths):
        out += (vals[:, j] & ((1 << w) - 1)).astype(object) << shift
        shift += w
    return out.tolist()


def _unpack(words: list[int], widths: list[int], signed_fields: int) -> np.ndarray:
    out = np.zeros((len(words), len(widths)), dtype=np.int64)
    for i, word in enumerate(words):
        word = int(word)
        for j, w in enumerate(widths):
            v = word & ((1 << w) - 1)
            word >>= w
            if j < signed_fields and w and v >> (w - 1):
                v -= 1 << w
            out[i, j] = v
    return out


def _table(m: Module, layer, name: str, values, width: int):
    """A per-layer constant selected by ``layer`` (a constant when all layers agree)."""
    if len(set(values)) == 1:
        return Const(values[0], width)
    sig = Signal(width, name=name)
    with m.Switch(layer):
        for j, v in enumerate(values):
            with m.Case(j):
                m.d.comb += sig.eq(v)
    return sig


def _signed_power(m: Module, code, real, width: int, name: str):
    """``v = (-1)^neg 2^(field - 1)`` of a po2 code and ``-v`` as ``width``-bit signed signals, 0 where ``real``
    is low (``real`` implies ``field != 0``), decoded without an adder: ``+2^j`` is one-hot at bit ``j`` and
    ``-2^j`` has bits ``j`` and up set. ``real`` gates the bits by AND, not by a multiplexer with a constant 0, which
    Yosys would turn into the synchronous reset of a register loaded with ``v`` (a MULT18's B operand register:
    one with a reset cannot move into the MULT18, boards/ecp5_dsp.py)."""
    v = Signal(signed(width), name=name)
    nv = Signal(signed(width), name=f"n{name}")
    one = Signal(width, name=f"{name}_one")  # 2^(field - 1)
    up = Signal(width, name=f"{name}_up")  # -2^(field - 1)
    m.d.comb += [
        one.eq(Cat(code.field == j + 1 for j in range(width))),
        up.eq(Cat(code.field <= j + 1 for j in range(width))),
        v.eq(Mux(code.neg, up, one) & real.replicate(width)),
        nv.eq(Mux(code.neg, one, up) & real.replicate(width)),
    ]
    return v, nv


class _Sizes:
    """The per-layer sizes of a unit built for ``shapes`` (:class:`Po2Geometry` of one or more layers with the
    same lanes), selected by ``layer`` at run time: ``K`` (words), ``k_last``, ``g_last``, ``lane_ok`` (bit
    ``l``: lane ``l`` of the last group is a real channel) and ``bit_ok`` (bit ``i``: input ``i`` of the last
    word is a real input). Constants when there is one shape or all agree."""

    def __init__(self, m: Module, shapes, layer):
        env = envelope(shapes)
        LI, LO = env.bank.lanes_in, env.bank.lanes_out
        kw = max(1, env.bank.words.bit_length())
        gw = max(1, env.bank.groups.bit_length())

        def table(name, values, width):
            return _table(m, layer, name, values, width)

        banks = [g.bank for g in shapes]
        self.K = table("words", [b.words for b in banks], kw)
        self.k_last = table("k_last", [b.words - 1 for b in banks], kw)
        self.g_last = table("g_last", [b.groups - 1 for b in banks], gw)
        self.lane_ok = table("lane_ok", [(1 << (b.n_out - (b.groups - 1) * LO)) - 1 for b in banks], LO)
        self.bit_ok = table("bit_ok", [(1 << (b.n_in - (b.words - 1) * LI)) - 1 for b in banks], LI)

    def pass_padding(self, m: Module, pas, passes: int):
        """The inputs of pass ``pas`` (``lanes_in / passes`` of them) that are padding in the last word."""
        LS = len(self.bit_ok) // passes
        pad = Signal(LS, name="pass_padding")
        if passes > 1:
            with m.Switch(pas):
                for p in range(passes):
                    with m.Case(p):
                        m.d.comb += pad.eq(~self.bit_ok[p * LS : (p + 1) * LS])
        else:
            m.d.comb += pad.eq(~self.bit_ok)
        return pad


def envelope(shapes) -> Po2Geometry:
    """One geometry that holds every layer of ``shapes`` (the largest words, groups and register widths); the
    layers must agree on lanes, batch, code bits, ``x_max`` and passes."""
    shapes = list(shapes)
    if not shapes or not all(isinstance(g, Po2Geometry) for g in shapes):
        raise TypeError("shapes must be a non-empty list of Po2Geometry")
    first = shapes[0]
    for name in ("batch", "dy_bits", "x_max", "lanes_b", "dw_passes", "dx_passes", "dw_dsp", "dx_dsp", "dw_ternary"):
        values = {getattr(g, name) for g in shapes}
        if len(values) > 1:
            raise ValueError(f"layers sharing a po2 backward engine must agree on {name}, not {sorted(values)}")
    for name in ("lanes_in", "lanes_out"):
        values = {getattr(g.bank, name) for g in shapes}
        if len(values) > 1:
            raise ValueError(f"layers sharing a po2 backward engine must agree on {name}, not {sorted(values)}")
    if len(shapes) == 1:
        return first
    LI, LO = first.bank.lanes_in, first.bank.lanes_out
    bank = XnorGeometry(
        n_in=max(g.bank.words for g in shapes) * LI, n_out=max(g.bank.groups for g in shapes) * LO, lanes_in=LI,
        lanes_out=LO,
    )  # fmt: skip
    return replace(
        first, bank=bank, dx_width=max(g.dx_width for g in shapes), dw_width=max(g.dw_width for g in shapes)
    )


class _Dx(wiring.Component):
    def __init__(self, shapes):
        self._shapes = shapes
        self._geo = geo = envelope(shapes)
        super().__init__(
            {
                "layer": In(range(max(len(shapes), 2))),
                "dy": In(stream.Signature(geo.dy_layout)),
                "dx": Out(stream.Signature(geo.dx_layout)),
                "weights": Out(WeightReadSignature(geo.bank)),
            }
        )

    def elaborate(self, platform):
        geo = self._geo
        bank = geo.bank
        K, G, D, LI, LO = bank.words, bank.groups, bank.depth, bank.lanes_in, bank.lanes_out
        m = Module()
        # layers without a dX unit (the first) never select it: their sizes are don't-cares, so the tables can be
        # constants when the layers with dX agree (no padding masks for the paper's MLP's 256-input layers)
        some = next(g for g in self._shapes if g.dx_width)
        sz = _Sizes(m, [g if g.dx_width else some for g in self._shapes], self.layer)

        # Stage 0: for each word k, for each pass p, for each group g: weight row g * K + k; codes from the stream
        # in the first pass of word 0, from the row buffer after that.
        P = geo.dx_passes
        LS = LI // P  # inputs per pass
        # The stages move every cycle (``adv`` is 1: no stall enable from the output queue's ready fanning out to
        # every stage register, the weights' read enable and the code reader's handshake; timing: s2_valid -> the
        # stall -> the weights' enable -> the code reader's pop -> its credits, 13.25 ns, 11.8 of it routing, in
        # the SMALL design in context at 0d278d2 seed 3). A word's sums wait in ``pend`` (a FIFO in front of the
        # output queue) when the queue is full, and a step that ends a word's pass (its last group) issues only
        # with a credit for its place in ``pend``.
        adv = Const(1)
        issue = Signal()
        pop = Signal()  # an entry leaves pend
        go = Signal()  # the step may issue: it pushes nothing, or there is a credit for its push
        k = Signal(range(K))
        pas = Signal(range(max(P, 2)))
        g = Signal(range(G))
        waddr = Signal(range(D))
        from_stream = Signal()
        last_g = Signal()
        has_credit = credit(m, DX_PEND_DEPTH, take=issue & last_g, give=pop, name="pend")
        m.d.comb += [
            from_stream.eq((k == 0) & (pas == 0)),
            last_g.eq(g == sz.g_last),
            go.eq(~last_g | has_credit),
            self.dy.ready.eq(go & from_stream),
            issue.eq(go & (~from_stream | self.dy.valid)),
            self.weights.addr.eq(waddr),
            self.weights.en.eq(1),
        ]
        with m.If(issue):
            with m.If(last_g):
                m.d.sync += g.eq(0)
                with m.If(pas != P - 1):
                    m.d.sync += [pas.eq(pas + 1), waddr.eq(k)]
                with m.Elif(k == sz.k_last):
                    m.d.sync += [pas.eq(0), k.eq(0), waddr.eq(0)]
                with m.Else():
                    m.d.sync += [pas.eq(0), k.eq(k + 1), waddr.eq(k + 1)]
            with m.Else():
                m.d.sync += [g.eq(g + 1), waddr.eq(waddr + sz.K)]

        # Stage 1: tile and codes; plane sums per input of this pass.
        codes_layout = data.ArrayLayout(geo.code_layout, LO)
        s1_valid = Signal()
        s1_pass = Signal.like(pas)
        s1_first_g = Signal()
        s1_last_g = Signal()
        s1_last_word = Signal()
        c1 = Signal(codes_layout, name="c1", reset_less=True)
        real1 = Signal(LO, name="real1", reset_less=True)  # per lane: a nonzero code of a real output lane
        with m.If(adv):
            m.d.sync += [
                s1_valid.eq(issue),
                s1_pass.eq(pas),
                s1_first_g.eq(g == 0),
                s1_last_g.eq(last_g),
                s1_last_word.eq(k == sz.k_last),
            ]
        # The codes are chosen in stage 0 (the stream's word, or the row buffer's, read without a clock from
        # LUT RAM) and registered with each lane's ``real`` flag, so that stage 1 decodes v and -v straight from
        # registers (timing: the choice between the stream's registered word and the buffer's read register, then
        # ``real`` and the decode, 13.17 ns in context at 427fbc0 seed 1, 11.5 of it routing). The register loads
        # whether or not the stream's word is valid: a junk word goes with s1_valid low, and the stream's valid
        # stays out of the enables (the code reader's handshake into them was 12.98 ns at 9dda79e seed 1).
        code_in = Signal(codes_layout)
        if K > 1 or P > 1:
            m.submodules.row_buffer = buf = Memory(shape=codes_layout, depth=max(G, 2), init=[])
            keep = buf.write_port()
            replay = buf.read_port(domain="comb")
            m.d.comb += [
                keep.addr.eq(g),
                keep.data.eq(self.dy.payload.codes),
                keep.en.eq(issue & from_stream),
                replay.addr.eq(g),
                code_in.eq(Mux(from_stream, self.dy.payload.codes, replay.data)),
            ]
        else:
            m.d.comb += code_in.eq(self.dy.payload.codes)
        with m.If(adv):
            m.d.sync += [
                c1.eq(code_in),
                real1.eq(Cat((~last_g | sz.lane_ok[lane]) & (code_in[lane].field != 0) for lane in range(LO))),
            ]
        codes = c1
        wseg = Signal(data.ArrayLayout(data.ArrayLayout(1, LS), LO))  # this pass's inputs of the tile
        if P > 1:
            with m.Switch(s1_pass):
                for p in range(P):
                    with m.Case(p):
                        m.d.comb += [wseg[lane][i].eq(self.weights.data[lane][p * LS + i])
                                     for lane in range(LO) for i in range(LS)]
        else:
            m.d.comb += [wseg[lane][i].eq(self.weights.data[lane][i]) for lane in range(LO) for i in range(LS)]

        # Signed addend value of each lane, v = (-1)^neg 2^(field - 1) (0 for a zero code or a padding lane),
        # shared by every input: the addend of input i is +v where its weight bit is 1 and -v where it is 0.
        # Both v and -v are decoded from the code without an adder (_signed_power), so each pair sum below is a
        # single adder.
        v_width = geo.span + 2
        vals, nvals = [], []
        for lane in range(LO):
            v, nv = _signed_power(m, codes[lane], real1[lane], v_width, f"v{lane}")
            vals.append(v)
            nvals.append(nv)

        # The pipeline from stage 1 to the accumulate: the control bits and this pass's weight bits move with the
        # operands, one register each per stage (on ``adv``).
        ctl = {"valid": s1_valid, "pass": s1_pass, "first_g": s1_first_g, "last_g": s1_last_g,
               "last_word": s1_last_word}

        def stage(name, sigs):
            out = {k: Signal.like(v, name=f"{name}_{k}") for k, v in sigs.items()}
            with m.If(adv):
                m.d.sync += [out[k].eq(v) for k, v in sigs.items()]
            return out

        # Stage 1v: the decoded v and -v registered (the codes' multiplexer and decode and the pair sums' adders in
        # one cycle closed below 80 MHz in context on the ECP5 proxy, docs/results/timing.md).
        c1v = stage("s1v", ctl)
        w1v = Signal.like(wseg, name="w1v")
        vals_r = [Signal.like(v, name=f"{v.name}_r") for v in vals]
        nvals_r = [Signal.like(v, name=f"{v.name}_r") for v in nvals]
        with m.If(adv):
            m.d.sync += [w1v.eq(wseg), *(r.eq(v) for r, v in zip(vals_r + nvals_r, vals + nvals, strict=True))]

        c_width = (LO << geo.span).bit_length() + 2
        # By lane pairs: each pair's four signed sums (+-v_a +-v_b) are formed once and shared by the inputs,
        # which pick one by their two weight bits and add the picks (no per-input correction term).
        pairs = [list(range(lo, min(lo + 2, LO))) for lo in range(0, LO, 2)]
        sums = []
        for n, pair in enumerate(pairs):
            row = []
            for mask in range(1 << len(pair)):
                ss = Signal(signed(v_width + 1), name=f"pair{n}_{mask}")
                terms = [vals_r[lane] if mask >> b & 1 else nvals_r[lane] for b, lane in enumerate(pair)]
                m.d.comb += ss.eq(_tree_sum(terms))
                row.append(ss)
            sums.append(row)

        # Stage 1b: registered pair sums and weight bits; each input picks and adds the picks by twos (the pair
        # sums' adders and the picks' adder tree in separate cycles: ECP5 timing proxy, docs/results.md).
        # The registered pair sums are copied per group of PICK_GROUP inputs (marked KEEP), so that each copy
        # sits by its inputs' picks: one register per sum fed the picks of every input, and the placer put it far
        # from some (a pair sum's register -> 9.6 ns of routing -> a pick -> the halves' adder, 14.53 ns in the
        # routed SMALL design at one nextpnr seed).
        c1b = stage("s1b", c1v)
        w1b = Signal.like(wseg, name="w1b")
        n_copies = -(-LS // PICK_GROUP)
        sums1b = [[[Signal.like(ss, name=f"{ss.name}_r{q}", attrs=KEEP) for ss in row] for row in sums]
                  for q in range(n_copies)]
        with m.If(adv):
            m.d.sync += w1b.eq(w1v)
            m.d.sync += [r.eq(ss) for copy in sums1b for row, row_r in zip(sums, copy, strict=True)
                         for ss, r in zip(row, row_r, strict=True)]
        # Stage 1c: per input, the sums of the picks by twos, registered; the rest of the tree into c2 (the picks
        # and the whole tree in one cycle closed below 80 MHz in context).
        c1c = stage("s1c", c1b)
        halves = []
        for i in range(LS):
            picks = []
            for n, pair in enumerate(pairs):
                pick = Signal(signed(v_width + 1), name=f"pick{i}_{n}")
                with m.Switch(Cat(w1b[lane][i] for lane in pair)):
                    for mask, ss in enumerate(sums1b[i // PICK_GROUP][n]):
                        with m.Case(mask):
                            m.d.comb += pick.eq(ss)
                picks.append(pick)
            row = []
            for h in range(0, len(picks), 2):
                hs = Signal(signed(v_width + 2), name=f"half{i}_{h // 2}")
                with m.If(adv):
                    m.d.sync += hs.eq(_tree_sum(picks[h:h + 2]))
                row.append(hs)
            halves.append(row)
        contrib = [Signal(signed(c_width), name=f"contrib{i}") for i in range(LS)]
        m.d.comb += [contrib[i].eq(_tree_sum(halves[i])) for i in range(LS)]

        # Stage 2: registered contributions; accumulate over the groups; keep each pass's sums; push word k
        # after the last group of its last pass.
        c2s = stage("s2", c1c)
        s2_valid, s2_pass, s2_first_g, s2_last_g, s2_last_word = (
            c2s["valid"], c2s["pass"], c2s["first_g"], c2s["last_g"], c2s["last_word"])
        c2 = [Signal(signed(c_width), name=f"c2_{i}") for i in range(LS)]
        with m.If(adv):
            m.d.sync += [c2[i].eq(contrib[i]) for i in range(LS)]

        m.submodules.pend = pend = StreamFIFO(shape=geo.dx_layout, depth=DX_PEND_DEPTH)
        m.submodules.queue = queue = SkidBuffer(shape=geo.dx_layout)
        push = Signal()
        m.d.comb += [
            push.eq(s2_valid & s2_last_g),
            pend.i.valid.eq(push),  # the credit keeps room for it
            pend.i.payload.last.eq(s2_last_word & (s2_pass == P - 1)),
            pop.eq(pend.o.valid & queue.i.ready),
        ]
        wiring.connect(m, pend.o, queue.i)
        pad = sz.pass_padding(m, s2_pass, P)  # they leave as 0
        shape = signed(geo.dx_width)
        for i in range(LS):
            acc = Signal(shape, name=f"acc{i}")
            tot = Signal(shape, name=f"sum{i}")
            m.d.comb += tot.eq(Mux(s2_first_g, 0, acc) + c2[i])
            with m.If(s2_valid):
                m.d.sync += acc.eq(tot)
            m.d.comb += pend.i.payload.dx[i].eq(Mux(s2_last_word & pad[i], 0, tot))
        wiring.connect(m, queue.o, wiring.flipped(self.dx))
        return m


class _TileCounters:
    """Stage 0 of a dW unit: per tile (group ``g``, word ``k``, in bank-row order) ``P`` passes of ``NB`` beat slots
    and a finish slot (``fin``); ``take`` advances one slot (a beat taken, or the finish slot)."""

    def __init__(self, m: Module, sz: _Sizes, *, NB: int, P: int, K: int, G: int):
        self.slot = slot = Signal(range(NB + 1))
        self.pas = pas = Signal(range(max(P, 2)))
        self.k = k = Signal(range(K))
        self.g = g = Signal(range(G))
        self.fin = Signal()  # the finish slot
        self.take = Signal()
        m.d.comb += self.fin.eq(slot == NB)
        with m.If(self.take):
            with m.If(self.fin):
                m.d.sync += slot.eq(0)
                with m.If(pas == P - 1):
                    m.d.sync += pas.eq(0)
                    with m.If(k == sz.k_last):
                        m.d.sync += [k.eq(0), g.eq(Mux(g == sz.g_last, 0, g + 1))]
                    with m.Else():
                        m.d.sync += k.eq(k + 1)
                with m.Else():
                    m.d.sync += pas.eq(pas + 1)
            with m.Else():
                m.d.sync += slot.eq(slot + 1)


class _Dw(wiring.Component):
    def __init__(self, shapes, **more_ports):
        self._shapes = shapes
        self._geo = geo = envelope(shapes)
        super().__init__(
            {
                "layer": In(range(max(len(shapes), 2))),
                "xdy": In(stream.Signature(geo.xdy_layout)),
                "dw": Out(stream.Signature(grad_layout(geo.bank))),
                **more_ports,
            }
        )

    def elaborate(self, platform):
        geo = self._geo
        bank = geo.bank
        K, G, LI, S = bank.words, bank.groups, bank.lanes_in, geo.lanes_b
        P = geo.dw_passes
        LS = LI // P  # inputs per pass
        NB = geo.beats_per_tile
        samples_last = geo.batch - (NB - 1) * S
        m = Module()
        sz = _Sizes(m, self._shapes, self.layer)

        # Stage 0: slot, pass and tile counters. A pass has NB beat slots and one finish slot; every pass takes
        # the tile's beats from ``xdy`` (the source repeats them, e.g. TileReader(passes=P)).
        # The stages after it move every cycle (no stall enable fanning out to the accumulators and every stage's
        # registers: the enable and the accumulators' clear were the largest fabric control nets of the design,
        # 1,520 loads each, on the ECP5 proxy, docs/results/timing.md). A tile's signs wait in ``pend`` (a FIFO in
        # front of the output queue) when the queue is full, and a tile starts only while ``pend`` has room for it
        # and every tile already started (``credit``).
        adv = Const(1)
        tc = _TileCounters(m, sz, NB=NB, P=P, K=K, G=G)
        slot, pas, k, g, fin, take = tc.slot, tc.pas, tc.k, tc.g, tc.fin, tc.take
        m.submodules.pend = pend = SkidBuffer(shape=grad_layout(bank))  # DW_PEND tiles, in flip-flops
        credit = Signal(range(DW_PEND + 1), init=DW_PEND, name="pend_credit")
        tile_start = Signal()
        go = Signal()  # the slot may be taken: it is not a tile's first, or there is credit for the tile
        m.d.comb += [
            tile_start.eq((slot == 0) & (pas == 0)),
            go.eq(~tile_start | (credit != 0)),
            self.xdy.ready.eq(go & ~fin),
            take.eq(go & (fin | self.xdy.valid)),
        ]
        operands = data.StructLayout({"x": self.xdy.payload.x.shape(), "dy": self.xdy.payload.dy.shape()})
        incoming = Cat(self.xdy.payload.x.as_value(), self.xdy.payload.dy.as_value())

        # Stage 1: the beat is added into the accumulators; in the finish
        # slot each weight's sign is kept and the accumulators are cleared.
        s1_valid = Signal()
        s1_fin = Signal()
        s1_last = Signal()  # the pass's last beat (its padding samples are masked)
        s1_first = Signal()  # the pass's first beat
        s1_pass = Signal.like(pas)
        s1_last_g = Signal()
        s1_last_k = Signal()
        s1_last_tile = Signal()
        held = Signal(operands.size)
        # Stage 1a: the beat as it arrives; the fabric accumulators decode its codes into powers of two here and
        # register them for stage 1 (the decode and the subset sums' adder in one cycle closed below 80 MHz in
        # context on the ECP5 proxy). Stage 1 is stage 1a a cycle later.
        s1a = [Signal(name=f"s1a_{n}") for n in ("valid", "fin", "last", "first", "last_g", "last_k", "last_tile")]
        s1a_pass = Signal.like(pas)
        held_a = Signal(operands.size)
        m.d.sync += [
            s1a[0].eq(take),
            s1a[1].eq(fin),
            s1a[2].eq(slot == NB - 1),
            s1a[3].eq(slot == 0),
            s1a[4].eq(g == sz.g_last),
            s1a[5].eq(k == sz.k_last),
            s1a[6].eq((g == sz.g_last) & (k == sz.k_last)),
            s1a_pass.eq(pas),
            held_a.eq(incoming),
        ]
        m.d.sync += [
            Cat(s1_valid, s1_fin, s1_last, s1_first, s1_last_g, s1_last_k, s1_last_tile).eq(Cat(*s1a)),
            s1_pass.eq(s1a_pass),
            held.eq(held_a),
        ]
        op = Signal(operands)
        op_a = Signal(operands)
        m.d.comb += [op.as_value().eq(held), op_a.as_value().eq(held_a)]
        d1 = op.dy
        x1 = Signal(data.ArrayLayout(data.ArrayLayout(geo.x_shape, LS), S))  # this pass's inputs
        if P > 1:
            with m.Switch(s1_pass):
                for p in range(P):
                    with m.Case(p):
                        m.d.comb += [x1[s][i].eq(op.x[s][p * LS + i]) for s in range(S) for i in range(LS)]
        else:
            m.d.comb += [x1[s][i].eq(op.x[s][i]) for s in range(S) for i in range(LS)]

        # Stage 1b: the accumulators take the addends that stage 1 formed from the beat and registered (the
        # addends' logic and the accumulate-and-sign in separate cycles: ECP5 timing proxy, docs/results.md).
        # Their enable (``step``) and clear (``finish``) are registers, and so is the padding of the signs.
        s1b_valid = Signal()
        s1b_fin = Signal()
        s1b_first = Signal()
        s1b_pass = Signal.like(pas)
        s1b_last_tile = Signal()
        step = Signal()  # the DSP slices' enable
        # The fabric accumulators' enable and clear, per output lane: copies of their own (``streams.replicas``;
        # one flip-flop for all lanes drove 1,520 clock-enable and 1,520 reset pins of the SMALL design). The
        # clear also covers the units' reset, so the accumulators need none: the copy drives their synchronous
        # reset pins (with a reset of their own they took ``finish | rst`` through a LUT).
        lane_step = replicas(m, s1_valid & ~s1_fin, bank.lanes_out, name="step")
        lane_finish = replicas(m, (s1_valid & s1_fin) | ResetSignal(), bank.lanes_out, name="finish",
                               reset_less=True)
        lane_pad = Signal(bank.lanes_out)  # lanes past n_out in the last group
        bit_pad = Signal(LS)  # inputs past n_in in the last word
        m.d.sync += [
            s1b_valid.eq(s1_valid),
            s1b_fin.eq(s1_fin),
            s1b_first.eq(s1_first),
            s1b_pass.eq(s1_pass),
            s1b_last_tile.eq(s1_last_tile),
            step.eq(s1_valid & ~s1_fin),
            lane_pad.eq(Mux(s1_last_g, ~sz.lane_ok, 0)),
            bit_pad.eq(Mux(s1_last_k, sz.pass_padding(m, s1_pass, P), 0)),
        ]

        # The pass's sum of every weight of the slice, then its sign and zero flag in the finish slot: packed
        # multiply-accumulates (DSP48 slices) or fabric adders (_fabric_accumulators explains their arithmetic).
        if geo.dsp_fields:
            signs = self._dsp_accumulators(m, geo, d1, x1, adv, step, s1b_first)
        else:
            signs = self._fabric_accumulators(m, geo, d1, op_a.dy, s1a[2], x1, adv, lane_step, lane_finish,
                                               s1_fin, s1_last, samples_last)

        # Stage 2: each weight's sign and zero flag registered as they leave the adders and compares (the carry
        # chain's top bit went on into the sign's choice and the kept word's multiplexer in one cycle: the SMALL
        # design's routed dW paths, docs/results/timing.md), with the padding; in the finish slot's stage 2 the
        # signs go into ``kept`` (each lane's enable a copy of its own).
        s2_valid = Signal()
        s2_fin = Signal()
        s2_pass = Signal.like(pas)
        s2_last_tile = Signal()
        lane_pad2 = Signal.like(lane_pad)
        bit_pad2 = Signal.like(bit_pad)
        m.d.sync += [
            s2_valid.eq(s1b_valid),
            s2_fin.eq(s1b_fin),
            s2_pass.eq(s1b_pass),
            s2_last_tile.eq(s1b_last_tile),
            lane_pad2.eq(lane_pad),
            bit_pad2.eq(bit_pad),
        ]
        lane_keep = replicas(m, s1b_valid & s1b_fin, bank.lanes_out, name="keep")
        # Stage 3: the tile goes into ``pend`` after the finish slot of its last pass; ``pend`` feeds the queue.
        s3_valid = Signal()
        s3_fin = Signal()
        s3_pass = Signal.like(pas)
        s3_last_tile = Signal()
        m.d.sync += [
            s3_valid.eq(s2_valid),
            s3_fin.eq(s2_fin),
            s3_pass.eq(s2_pass),
            s3_last_tile.eq(s2_last_tile),
        ]
        m.submodules.queue = queue = SkidBuffer(shape=grad_layout(bank))
        kept = Signal(grad_layout(bank))  # signs of the tile's passes
        pop = Signal()
        m.d.comb += [
            pend.i.valid.eq(s3_valid & s3_fin & (s3_pass == P - 1)),
            pend.i.payload.g.eq(kept.g),
            pend.i.payload.last.eq(s3_last_tile),
            pop.eq(pend.o.valid & queue.i.ready),
        ]
        wiring.connect(m, pend.o, queue.i)
        with m.If(take & tile_start & ~pop):
            m.d.sync += credit.eq(credit - 1)
        with m.Elif(pop & ~(take & tile_start)):
            m.d.sync += credit.eq(credit + 1)
        for (i, lane), (neg, zero) in signs.items():
            neg2 = Signal(name=f"neg{i}_{lane}", reset_less=True)
            zero2 = Signal(name=f"zero{i}_{lane}", reset_less=True)
            m.d.sync += [neg2.eq(neg), zero2.eq(zero)]
            signal = Signal(signed(2), name=f"sign{i}_{lane}")
            m.d.comb += signal.eq(Mux(lane_pad2[lane] | bit_pad2[i] | zero2, 0, Mux(neg2, -1, 1)))
            for p in range(P):
                with m.If(lane_keep[lane] & (s2_pass == p)):
                    m.d.sync += kept.g[lane][p * LS + i].eq(signal)
        wiring.connect(m, queue.o, wiring.flipped(self.dw))
        return m

    def _fabric_accumulators(self, m, geo, d1, d1a, s1a_last, x1, adv, step, finish, s1_fin, s1_last, samples_last):
        """Fabric adders; returns ``(input, lane) -> (neg, zero)`` of the pass's sum, valid in the finish slot.
        Stage 1a (``d1a``, ``s1a_last``) decodes binary activations' codes into powers of two, registered for
        stage 1; stage 1 (``d1``, ``x1``, ``s1_*``) forms the addends and registers them on ``adv``; stage 1b
        (``step``, ``finish``: per output lane, copies of one register) adds them.

        Binary activations: the addend of weight (i, lane) and sample s is +v where x = 1 and -v where x = 0,
        v = (-1)^neg 2^(field - 1) (0 for a zero code or a padding sample). Summed over the pass this is
        2 Q - T, Q the sum of v over the samples with x = 1 and T over all samples. T is one accumulator per
        lane; each weight accumulates 2 Q, choosing among the lane's subset sums of 2 v by its x bits (with
        one sample per beat: 2 v or nothing, i.e. the accumulator's clock enable). The finish slot adds -T: the
        lane's -T accumulator is complete when the finish slot is in stage 1 (the pass's last beat is in stage 1b),
        so stage 1 registers it as the subset sum of all samples and sets the activation bits to ones, and every
        weight picks it like a beat's addend (no negation or finish-slot multiplexer in front of the adders).
        int8 activations: each weight adds the sign-flipped values shifted by field - 1."""
        LO, S = geo.bank.lanes_out, geo.lanes_b
        LS = geo.bank.lanes_in // geo.dw_passes
        binary = geo.x_max == 1
        acc_width = geo.dw_width + 1
        vw = geo.span + 2
        adds = {}  # (input, lane) -> (addend, enable)
        totals = {}  # binary: lane -> T, complete in the finish slot
        # the beat's activations in stage 1b (binary: ones in the finish slot), a copy per output lane: they pick the
        # lane's addends (one register for all lanes: 7.1 ns of routing to a far lane's pick, then its adder, in the
        # SMALL design in context on the ECP5 proxy at seed 3, docs/results/timing.md)
        xbs = [Signal.like(x1, name=f"x1b_l{lane}", attrs=KEEP) for lane in range(LO if binary else 0)]
        with m.If(adv):
            m.d.sync += [xb.as_value().eq(Mux(s1_fin, -1, x1.as_value())) for xb in xbs]
        for lane in range(LO):
            vals, shifts, nonzero = [], [], []
            for s in range(S):
                real = d1[s][lane].field != 0
                if s >= samples_last:
                    real = real & ~s1_last
                nonzero.append(real & ~s1_fin)
                if binary:  # decoded without an adder (the negation's carry chain in front of the subset sums'
                    # adders closed below 80 MHz in context on the ECP5 proxy), in stage 1a, and registered
                    real_a = d1a[s][lane].field != 0
                    if s >= samples_last:
                        real_a = real_a & ~s1a_last
                    va, _ = _signed_power(m, d1a[s][lane], real_a, vw, f"va{s}_{lane}")
                    v = Signal.like(va, name=f"v{s}_{lane}", reset_less=True)
                    m.d.sync += v.eq(va)
                    vals.append(v)
                else:
                    sh = Signal(range(geo.planes), name=f"sh{s}_{lane}")
                    m.d.comb += sh.eq(d1[s][lane].field - 1)
                    shifts.append(sh)
            if binary:
                # subset sums of 2 v, indexed by the samples' x bits, registered for stage 1b; the sum of all
                # samples is -T in the finish slot
                full = (1 << S) - 1
                subsets = []
                nt = Signal(signed(acc_width), name=f"neg_t{lane}", reset_less=True)  # -T of the pass's beats so far
                nt_next = Signal(signed(acc_width), name=f"neg_t_next{lane}")
                for mask in range(1 << S):
                    sr = Signal(signed(acc_width), name=f"sub_r{mask}_{lane}")
                    value = _tree_sum(vals[s] for s in range(S) if mask >> s & 1) << 1
                    with m.If(adv):
                        m.d.sync += sr.eq(Mux(s1_fin, nt_next, value) if mask == full else value)
                    subsets.append(sr)
                m.d.comb += nt_next.eq(nt - (subsets[full] >> 1))
                t = Signal(signed(acc_width), name=f"t{lane}", reset_less=True)  # T itself: the zero test acc == T
                with m.If(finish[lane]):
                    m.d.sync += [nt.eq(0), t.eq(0)]
                with m.Elif(step[lane]):
                    m.d.sync += [nt.eq(nt_next), t.eq(t + (subsets[full] >> 1))]
                totals[lane] = t
            for i in range(LS):
                if binary and S == 1:
                    adds[i, lane] = (subsets[1], xbs[lane][0][i])
                elif binary:
                    sel = Cat(xbs[lane][s][i] for s in range(S))
                    pick = Signal(signed(acc_width), name=f"pick{i}_{lane}")
                    with m.Switch(sel):
                        for mask in range(1 << S):
                            with m.Case(mask):
                                m.d.comb += pick.eq(subsets[mask])
                    adds[i, lane] = (pick, 1)
                else:  # one addend per sample: the sign-flipped 8-bit value shifted by field - 1
                    terms = []
                    for s in range(S):
                        sx = Signal(signed(9), name=f"sx{s}_{i}_{lane}")
                        m.d.comb += sx.eq(Mux(d1[s][lane].neg, -x1[s][i], x1[s][i]))
                        terms.append(Mux(nonzero[s], sx << shifts[s], 0))
                    c = Signal(signed(acc_width), name=f"contrib{i}_{lane}")  # registered for stage 1b
                    with m.If(adv):
                        m.d.sync += c.eq(_tree_sum(terms))
                    adds[i, lane] = (c, 1)

        signs = {}
        shape = signed(acc_width)
        for (i, lane), (addend, enable) in adds.items():
            acc = Signal(shape, name=f"acc{i}_{lane}", reset_less=True)  # cleared by ``finish`` (and the reset)
            tot = Signal(shape, name=f"sum{i}_{lane}")
            m.d.comb += tot.eq(acc + addend)  # in the finish slot: acc - T (binary) or acc
            with m.If(finish[lane]):  # priority over the enable: the flip-flops' synchronous reset
                m.d.sync += acc.eq(0)
            with m.Elif(step[lane] & enable):
                m.d.sync += acc.eq(tot)
            # the zero test from registers (binary: acc == T), not through the adder
            signs[i, lane] = (tot[-1], acc == totals[lane] if binary else tot == 0)
        return signs

    def _dsp_accumulators(self, m, geo, d1, x1, adv, step, s1b_first):
        """Packed multiply-accumulates (:attr:`Po2Geometry.dsp_fields`): the weights ``(i, lane)`` and
        ``(i + 1, lane)`` share one ``P = (first ? K : P) + A v`` with ``v`` the lane's addend ``+-2^(f-1)`` (0 for
        a zero code or a padding sample) and ``A = s_i + s_(i+1) 2^F``, ``s = +1`` where the activation bit is 1
        and ``-1`` where it is 0. With two fields the load value ``K = 2^(F-1)`` biases the lower field into
        ``0 .. 2^F - 1`` (its sum ``S`` has ``|S| < 2^(F-1)``), so it never borrows from the upper one: the lower
        field is ``S + 2^(F-1)`` (negative where its top bit is 0, zero where it is exactly ``2^(F-1)``) and the
        upper field is its sum itself. The sums are complete in the finish slot (a bubble here); the next pass's
        first beat loads ``P`` afresh. ``v`` and the activation bits of stage 1 are registered on ``adv``; the
        slices accumulate in stage 1b (``step``, ``s1b_first``). Returns ``(input, lane) -> (neg, zero)``."""
        LO = geo.bank.lanes_out
        LS = geo.bank.lanes_in // geo.dw_passes
        nf, F = geo.dsp_fields, geo.dw_width
        vw = geo.span + 2
        signs = {}
        xb = Signal.like(x1, name="x1b")
        with m.If(adv):
            m.d.sync += xb.eq(x1)
        for lane in range(LO):
            real = d1[0][lane].field != 0  # one sample per beat: no padding samples
            mag = Signal(unsigned(vw - 1), name=f"mag_{lane}")
            v = Signal(signed(vw), name=f"v_{lane}")
            m.d.comb += mag.eq(Mux(real, Const(1, vw) << d1[0][lane].field >> 1, 0))
            with m.If(adv):
                m.d.sync += v.eq(Mux(d1[0][lane].neg, -mag, mag))
            for i0 in range(0, LS, nf):
                inputs = list(range(i0, min(i0 + nf, LS)))
                a = Signal(signed(DSP_A_BITS), name=f"dsp_a{i0}_{lane}")
                m.d.comb += a.eq(sum(Mux(xb[0][i], 1, -1) << (f * F) for f, i in enumerate(inputs)))
                p = Signal(signed(DSP_P_BITS), name=f"dsp_p{i0}_{lane}")
                bias = 1 << (F - 1) if len(inputs) > 1 else 0
                with m.If(step):
                    m.d.sync += p.eq(Mux(s1b_first, bias, p) + a * v)
                for f, i in enumerate(inputs):
                    field = p[f * F : (f + 1) * F]
                    if f == 0 and bias:
                        neg, zero = ~field[-1], field[-1] & (field[:-1] == 0)
                    else:
                        neg, zero = field[-1], field == 0
                    signs[i, lane] = (neg, zero)
        return signs


def array_mode(shapes) -> bool:
    """Whether the po2 backward engine of ``shapes`` computes dX and dW on one array of DSP48 slices.

    The dW unit's ``lanes_in / dw_passes x lanes_out / 2`` slices (:attr:`Po2Geometry.dsp_fields`) are idle
    while dX runs (the phases never overlap), and dX has the same form: sums of ``+-v`` over the outputs, the
    sign given by a weight bit. So both run there: needs ``dw_dsp`` and ``dx_dsp``, binary activations, one
    sample per dW beat, ``lanes_out`` a multiple of ``dw_passes``, an even ``lanes_in / dw_passes`` that divides
    every dX layer's ``n_in``, and dX and dW bounds that fit :data:`ARRAY_FIELD` bits (signed)."""
    shapes = list(shapes)
    env = envelope(shapes)
    LI, LO, P = env.bank.lanes_in, env.bank.lanes_out, env.dw_passes
    LS = LI // P
    return bool(
        env.dx_width and env.dw_dsp and env.dx_dsp and env.x_max == 1 and env.lanes_b == 1
        and env.span + 2 <= DSP_B_BITS and LO % P == 0 and LS % 2 == 0
        and env.dx_width <= ARRAY_FIELD and env.dw_width <= ARRAY_FIELD
        and all(g.bank.n_in % LS == 0 for g in shapes if g.dx_width)
    )


class CodeReadSignature(wiring.Signature):
    """Read access to the po2 codes of a batch, seen from the array: address ``sample * groups + g`` holds
    the ``lanes_out`` codes of group ``g`` of a sample (the codes buffer of :mod:`rtl_gen.top`).

    Members: ``addr`` Out, ``en`` Out(1), ``data`` In(ArrayLayout(code_layout, lanes_out)); synchronous read
    like :class:`~rtl_gen.xnor_engine.WeightReadSignature` (``data`` holds while ``en`` is low)."""

    def __init__(self, geometry: Po2Geometry):
        rows = geometry.batch * geometry.bank.groups
        super().__init__({
            "addr": Out(unsigned(max(1, (rows - 1).bit_length()))),
            "en": Out(1),
            "data": In(data.ArrayLayout(geometry.code_layout, geometry.bank.lanes_out)),
        })


class _Array(_Dw):
    """dX and sgn(dW) on one array of DSP48 multiply-accumulates (:func:`array_mode`).

    Slice ``(c, l)`` (``c < LS / 2`` with ``LS = lanes_in / dw_passes``, lane ``l < lanes_out``) computes
    ``P = (first ? 2^(F-1) : P) + A v_l`` with ``F = ARRAY_FIELD``, ``A = b_0 - b_1 2^F`` (two sign bits, fits
    the 25-bit A port) and ``v_l`` the lane's addend ``+-2^(field-1)`` (0 for a zero code or padding). The
    lower field then holds ``Q_0 + 2^(F-1)`` (never negative, so it never borrows) and the upper ``-Q_1``, with
    ``Q`` the sum of ``v`` where the bit is 1. One more slice per lane sums ``v_l (2^F - 1)``, whose lower
    field is ``-T_l`` (``T`` the sum of all ``v``). The wanted sums are ``2 Q - T``: ``2 L + (-T)`` and
    ``(-T) - 2 U`` modulo ``2^F`` (exact, the bounds are below ``2^(F-1)``).

    - dW (``xdy`` beats, tiles and passes as in the dW unit): bit = the activation of input ``2 c + f`` of the
      pass, ``v_l`` from the sample's code of output lane ``l``; a pass's sums are weights
      ``(p LS + 2 c + f, l)``.
    - dX (``dx_start``): blocks of ``NS = lanes_out / dw_passes`` samples and one input word ``k``; lane ``l``
      holds sample ``l mod NS`` and inputs ``(l div NS) LS + 2 c + f`` of the word. Per block, for each output
      group ``g`` (weight row ``g words + k``, read once), for each output lane ``o`` of the group, one cycle:
      bit = the weight of (input, ``o``), ``v_l`` from the code of (sample, ``g lanes_out + o``). The codes of
      the ``NS`` samples for a group are read from ``codes`` during the previous window (two buffers).

    Each slice has a DSP48's pipeline registers: stage 1 forms the operands ``A`` and ``v``, which are registered
    twice (``A1 A2`` and ``B1 B2``, AREG = BREG = 2), their product is registered (``M``) and the accumulator ``P``
    adds it, so a beat reaches ``P`` :data:`ARRAY_STAGES` cycles after stage 1 (on the ECP5 proxy the second
    operand registers and ``M`` move into the MULT18s, boards/ecp5_dsp.py).

    After a pass (dW) or a block (dX) a finish cycle copies the sums to capture registers, and the drain takes
    one lane per cycle (``lanes_out`` cycles) while the array goes on: dX writes the lane's ``LS`` values as one
    ``dx`` word (sample, part), dW keeps their signs until the tile's last pass and pushes the tile. The capture
    registers are a chain over the lanes that moves down one lane per drain cycle (the drain reads lane 0), and
    the drained row is registered (stage V) before it leaves as a ``dx`` word or goes into the kept signs. The
    finish cycle leaves stage 1 only when the chain will be free at its capture, so a pass or block lasts at least
    ``lanes_out + ARRAY_STAGES`` cycles.

    Ternary dW codes (:attr:`Po2Geometry.dw_pairs`, ``hw.dw_window``): the sums are at most ``B`` in size, so a
    slice holds four ``Ft``-bit fields. Slice ``(c, l)`` takes ``A = s_(2c) + s_(2c+1) 2^Ft`` (activation signs
    +-1 of pass ``2 p + (l >= H)``, ``H = lanes_out / 2``) and ``v = t_a + t_b 2^(2 Ft)`` (the ternary codes of
    lanes ``a = l mod H`` and ``a + H``), loaded with ``2^(Ft-1)`` in each of the lower three fields, so one run
    over the tile's beats computes two passes: the tile is read ``dw_passes / 2`` times. Draining slice row
    ``l`` keeps the signs of both its lanes for its pass. dX is unchanged (the slices' operands are multiplexed).
    """

    def __init__(self, shapes):
        geo = envelope(shapes)
        super().__init__(
            shapes, dx_start=In(1), codes=Out(CodeReadSignature(geo)), weights=Out(WeightReadSignature(geo.bank)),
            dx=Out(stream.Signature(geo.array_dx_layout)),
        )

    def elaborate(self, platform):
        geo = self._geo
        bank = geo.bank
        K, G, D, LI, LO = bank.words, bank.groups, bank.depth, bank.lanes_in, bank.lanes_out
        P = geo.dw_passes
        LS, NS, F = LI // P, geo.array_samples, ARRAY_FIELD
        pairs, PR, H, FT = geo.dw_pairs, geo.dw_reads, LO // 2, geo.ternary_field  # ternary dW, two lanes a slice
        NB = geo.beats_per_tile
        B = geo.batch
        NSB = -(-B // NS)  # dX sample blocks
        s_last = B - (NSB - 1) * NS  # samples in the last block
        m = Module()
        layer = self.layer
        sz = _Sizes(m, self._shapes, layer)  # dW (every layer)
        some = next(g for g in self._shapes if g.dx_width)
        xs = [g if g.dx_width else some for g in self._shapes]  # dX (layers without dX never select it)
        kw, gw = max(1, K.bit_length()), max(1, G.bit_length())
        x_words = _table(m, layer, "x_words", [g.bank.words for g in xs], kw)
        x_groups = _table(m, layer, "x_groups", [g.bank.groups for g in xs], gw)
        x_k_last = _table(m, layer, "x_k_last", [g.bank.words - 1 for g in xs], kw)
        x_g_last = _table(m, layer, "x_g_last", [g.bank.groups - 1 for g in xs], gw)
        x_lane_ok = _table(m, layer, "x_lane_ok", [(1 << (g.bank.n_out - (g.bank.groups - 1) * LO)) - 1 for g in xs],
                           LO)
        parts = [g.bank.n_in // LS for g in xs]  # dX words per sample in the layer below
        pw = max(1, max(parts).bit_length())
        x_parts = _table(m, layer, "x_parts", parts, pw)
        x_parts_ok = _table(m, layer, "x_parts_ok",
                            [(1 << (n - (g.bank.words - 1) * P)) - 1 for n, g in zip(parts, xs, strict=True)], P)
        addr_w = len(self.dx.payload.addr)
        x_block_stride = _table(m, layer, "x_block_stride", [NS * n for n in parts], addr_w)  # dx words per block
        rows_w = len(self.codes.addr)
        x_code_stride = _table(m, layer, "x_code_stride", [NS * g.bank.groups for g in xs], rows_w + 1)

        adv = Signal()
        xmode = Signal()  # a dX job is issuing

        # ---- Stage 0, dW: slot, pass and tile counters (as the dW unit; with dw_pairs ``pas`` counts pass pairs) ----
        tc = _TileCounters(m, sz, NB=NB, P=PR, K=K, G=G)
        slot, pas, k, g, fin, take_w = tc.slot, tc.pas, tc.k, tc.g, tc.fin, tc.take
        m.d.comb += [self.xdy.ready.eq(adv & ~xmode & ~fin), take_w.eq(adv & ~xmode & (fin | self.xdy.valid))]

        # ---- Stage 0, dX: a prologue window (loads the first codes), then per block (sample block sb, word xk)
        # the windows of the groups xg (one cycle per output lane o) and a finish cycle ----
        pre = Signal()
        xfin = Signal()
        o = Signal(range(LO))
        sb = Signal(range(NSB))
        xk = Signal(range(K))
        xg = Signal(range(G))
        par = Signal()  # buffer of the window's codes
        waddr = Signal(range(D))
        xbase = Signal(addr_w)  # first dx word of sample block sb
        # the window after this one, whose codes load during this one: group ng, word nk, sample block nsb
        n_ok = Signal()
        ng = Signal(range(G))
        nk = Signal(range(K))
        nsb = Signal(range(NSB))
        nbase = Signal(rows_w + 1)  # code row of its first sample
        lsg = Signal(rows_w + 1)  # o * groups: the row offset of sample o of the block
        take_x = Signal()
        load = Signal()
        m.d.comb += [
            take_x.eq(adv & xmode),
            load.eq(~xfin & (o < NS) & n_ok),
            self.codes.addr.eq(nbase + lsg + ng),
            self.codes.en.eq(take_x & load),
            self.weights.addr.eq(waddr),
            self.weights.en.eq(take_x & ~xfin & ~pre & (o == 0)),
        ]
        with m.If(take_x):
            with m.If(xfin):
                m.d.sync += xfin.eq(0)
                with m.If(xk == x_k_last):
                    m.d.sync += [xk.eq(0), waddr.eq(0)]
                    with m.If(sb == NSB - 1):
                        m.d.sync += xmode.eq(0)
                    with m.Else():
                        m.d.sync += [sb.eq(sb + 1), xbase.eq(xbase + x_block_stride)]
                with m.Else():
                    m.d.sync += [xk.eq(xk + 1), waddr.eq(xk + 1)]
            with m.Elif(o == LO - 1):
                m.d.sync += [o.eq(0), par.eq(~par), lsg.eq(0)]
                with m.If(pre):
                    m.d.sync += pre.eq(0)
                with m.Elif(xg == x_g_last):
                    m.d.sync += [xg.eq(0), xfin.eq(1)]
                with m.Else():
                    m.d.sync += [xg.eq(xg + 1), waddr.eq(waddr + x_words)]
                with m.If(ng == x_g_last):
                    m.d.sync += ng.eq(0)
                    with m.If(nk == x_k_last):
                        m.d.sync += nk.eq(0)
                        with m.If(nsb == NSB - 1):
                            m.d.sync += n_ok.eq(0)
                        with m.Else():
                            m.d.sync += [nsb.eq(nsb + 1), nbase.eq(nbase + x_code_stride)]
                    with m.Else():
                        m.d.sync += nk.eq(nk + 1)
                with m.Else():
                    m.d.sync += ng.eq(ng + 1)
            with m.Else():
                m.d.sync += o.eq(o + 1)
                with m.If(o < NS):
                    m.d.sync += lsg.eq(lsg + x_groups)
        with m.If(self.dx_start):
            m.d.sync += [xmode.eq(1), pre.eq(1), xfin.eq(0), o.eq(0), sb.eq(0), xk.eq(0), xg.eq(0), par.eq(1),
                         waddr.eq(0), xbase.eq(0), n_ok.eq(1), ng.eq(0), nk.eq(0), nsb.eq(0), nbase.eq(0),
                         lsg.eq(0)]

        # ---- Stage 1: operands and the multiply-accumulates ----
        s1_valid = Signal()
        s1_fin = Signal()
        s1_first = Signal()
        s1_x = Signal()  # a dX operation
        # the output lane o in stage 1: a copy per sample (its code's choice) and per part (its weights' choice),
        # KEEP, not one register read by every lane's choice (timing: ``s1_o`` -> a lane's code choice and decode
        # -> its B1 register, 13.41 ns, 10.7 of it routing, for a quarter array at the paper's widths on the ECP5
        # proxy)
        s1_o_s = [Signal.like(o, name=f"s1_o_s{s}", attrs=KEEP) for s in range(NS)]
        s1_o_q = [Signal.like(o, name=f"s1_o_q{q}", attrs=KEEP) for q in range(P)]
        s1_par_s = [Signal(name=f"s1_par_s{s}", attrs=KEEP) for s in range(NS)]  # the window's buffer, per sample
        o_pad = Signal()  # the window's lane o is past the layer's last output (registered)
        s1_sb_last = Signal()
        s1_last_g = Signal()
        s1_last_k = Signal()
        s1_pass = Signal.like(pas)
        s1_last_tile = Signal()
        s1_base = Signal(addr_w)
        s1_load = Signal()
        s1_lrow = Signal(range(max(NS, 2)))
        s1_lbuf = Signal()
        held = Signal(len(self.xdy.payload.x.as_value()) + len(self.xdy.payload.dy.as_value()))
        with m.If(adv):
            m.d.sync += [
                s1_valid.eq(take_w | (take_x & ~pre)),
                s1_x.eq(xmode),
                s1_load.eq(take_x & load),
                s1_lrow.eq(o),
                s1_lbuf.eq(~par),
                held.eq(Cat(self.xdy.payload.x.as_value(), self.xdy.payload.dy.as_value())),
            ]
            with m.If(xmode):
                m.d.sync += [
                    s1_fin.eq(xfin),
                    s1_first.eq((xg == 0) & (o == 0)),
                    *(c.eq(o) for c in s1_o_s + s1_o_q),
                    o_pad.eq((xg == x_g_last) & ~x_lane_ok.bit_select(o, 1)),
                    *(c.eq(par) for c in s1_par_s),
                    s1_sb_last.eq(sb == NSB - 1),
                    s1_last_g.eq(xg == x_g_last),
                    s1_last_k.eq(xk == x_k_last),
                    s1_base.eq(xbase + (xk << (P.bit_length() - 1))),
                ]
            with m.Else():
                m.d.sync += [
                    s1_fin.eq(fin),
                    s1_first.eq(slot == 0),
                    s1_pass.eq(pas),
                    s1_last_g.eq(g == sz.g_last),
                    s1_last_k.eq(k == sz.k_last),
                    s1_last_tile.eq((g == sz.g_last) & (k == sz.k_last)),
                ]
        operands = data.StructLayout({"x": self.xdy.payload.x.shape(), "dy": self.xdy.payload.dy.shape()})
        op = Signal(operands)
        m.d.comb += op.as_value().eq(held)

        # the codes of the NS samples for the current window and the next (loaded one row per cycle)
        row_layout = data.ArrayLayout(geo.code_layout, LO)
        buf = [[Signal(row_layout, name=f"codes{b}_{s}") for s in range(NS)] for b in range(2)]
        for b in range(2):
            for s in range(NS):
                with m.If(s1_load & (s1_lbuf == b) & (s1_lrow == s)):
                    m.d.sync += buf[b][s].eq(self.codes.data)
        xcode = [Signal(geo.code_layout, name=f"xcode{s}") for s in range(NS)]
        wcol = Signal(LI)  # the weights of output lane o: input bits of word k
        for s in range(NS):
            with m.Switch(s1_o_s[s]):
                for oo in range(LO):
                    with m.Case(oo):
                        m.d.comb += xcode[s].eq(Mux(s1_par_s[s], buf[1][s][oo], buf[0][s][oo]))
        for q in range(P):
            with m.Switch(s1_o_q[q]):
                for oo in range(LO):
                    with m.Case(oo):
                        m.d.comb += wcol[q * LS:(q + 1) * LS].eq(self.weights.data[oo][q * LS:(q + 1) * LS])
        # dW: this pass's activations; with dw_pairs the lanes below H take pass 2 pas, the others 2 pas + 1
        x1 = [Signal(LS, name=f"x1_{h}" if pairs else "x1") for h in range(2 if pairs else 1)]
        for h, xh in enumerate(x1):
            if P > 1:
                with m.Switch(s1_pass):
                    for p in range(PR):
                        with m.Case(p):
                            q = 2 * p + h if pairs else p
                            m.d.comb += xh.eq(Cat(op.x[0][q * LS + i] for i in range(LS)))
            else:
                m.d.comb += xh.eq(Cat(op.x[0][i] for i in range(LS)))
        # the sign bits of the slices of part q (dX) and half h (dW pairs)
        bits = {(q, h): Signal(LS, name=f"bits{q}_{h}" if pairs else f"bits{q}") for q in range(P)
                for h in range(len(x1))}
        for (q, h), b in bits.items():
            m.d.comb += b.eq(Mux(s1_x, wcol[q * LS:(q + 1) * LS], x1[h]))
        tern = []  # dW pairs: each lane's ternary code as a signed value
        for lane in range(LO if pairs else 0):
            t = Signal(signed(2), name=f"tern{lane}")
            cd = op.dy[0][lane]
            m.d.comb += t.eq(Mux(cd.field != 0, Mux(cd.neg, -1, 1), 0))
            tern.append(t)

        # ---- the slices, with a DSP48's pipeline registers: stage 1 forms each slice's operands, stage a holds
        # them (A, B), stage m their product (M), and the accumulator P takes it. The operands' choice and
        # decode, the product and the accumulate in one cycle closed at 31.3 MHz on the ECP5 proxy (fabric
        # adders around MULT18s, docs/results/timing.md); on the xc7z020 these are the slice's AREG / BREG, MREG
        # and PREG. The stages after stage 1 never stall: a beat or a finish cycle leaves stage 1 on ``adv``
        # (``go1``), and the finish cycle leaves only when its capture, ARRAY_STAGES cycles on, finds the drain free.
        go1 = Signal()
        m.d.comb += go1.eq(adv & s1_valid)
        a_step, a_fin, a_first, a_x = (Signal(name=f"sa_{n}") for n in ("step", "fin", "first", "x"))
        a2_step, a2_fin, a2_first, a2_x = (Signal(name=f"sa2_{n}") for n in ("step", "fin", "first", "x"))
        c_step, c_fin, c_first, c_x = (Signal(name=f"sc_{n}") for n in ("step", "fin", "first", "x"))
        m_fin = Signal(name="sm_fin")
        m.d.sync += [c_step.eq(go1 & ~s1_fin), c_fin.eq(go1 & s1_fin), c_first.eq(s1_first), c_x.eq(s1_x),
                     a_step.eq(c_step), a_fin.eq(c_fin), a_first.eq(c_first), a_x.eq(c_x),
                     a2_step.eq(a_step), a2_fin.eq(a_fin), a2_first.eq(a_first), a2_x.eq(a_x), m_fin.eq(a2_fin)]
        # stage c's copy of the dX / dW choice, per lane (it picks B1's value between the dX code and the dW
        # ternary pair)
        c_x_l = replicas(m, s1_x, LO, name="sc_x") if pairs else None
        # stage m's accumulate enable and load select, a copy per lane (streams.replicas)
        m_step = replicas(m, a2_step, LO, name="sm_step")
        m_first = replicas(m, a2_first, LO, name="sm_first")
        m_x = replicas(m, a2_x, LO, name="sm_x") if pairs else None
        vw = geo.span + 2
        acc, tacc = {}, []
        for lane in range(LO):
            s = lane % NS
            code = Signal(geo.code_layout, name=f"code{lane}")
            m.d.comb += code.eq(Mux(s1_x, xcode[s], op.dy[0][lane]))
            pad = o_pad | (s1_sb_last if s >= s_last else 0)
            real = (code.field != 0) & ~(s1_x & pad)
            # stage c: the chosen code and its real flag registered; B1 takes their decode alone
            code_c = Signal(geo.code_layout, name=f"code_c{lane}", reset_less=True)
            real_c = Signal(name=f"real_c{lane}", reset_less=True)
            m.d.sync += [code_c.eq(code), real_c.eq(real)]
            v, _ = _signed_power(m, code_c, real_c, vw, f"v{lane}")  # no carry chain in front of the B register
            bias = Const(1 << (F - 1), signed(DSP_P_BITS))
            if pairs:  # v_t = t_a + t_b 2^(2 Ft) for lanes a = lane mod H, b = a + H; the lower three fields biased
                v_t = Signal(signed(2 * FT + 2), name=f"v_t{lane}")
                v_tc = Signal.like(v_t, name=f"v_tc{lane}", reset_less=True)
                m.d.comb += v_t.eq(tern[lane % H] + (tern[lane % H + H] << (2 * FT)))
                m.d.sync += v_tc.eq(v_t)
                v_dw = Signal(signed(max(vw, 2 * FT + 2)), name=f"v_mux{lane}")
                m.d.comb += v_dw.eq(Mux(c_x_l[lane], v, v_tc))
                bias = Mux(m_x[lane], bias, Const(sum(1 << (q * FT + FT - 1) for q in range(3)), signed(DSP_P_BITS)))
            else:
                v_dw = v
            for c in range(LS // 2):
                b = bits[lane // NS, int(pairs and lane >= H)]
                a = Signal(signed(DSP_A_BITS), name=f"dsp_a{c}_{lane}")
                a_dx = Cat(b[2 * c], Const(0, DSP_A_BITS - 2), b[2 * c + 1]).as_signed()
                if pairs:  # A = s_0 + s_1 2^Ft, s = +-1 by the activation bits
                    a_t = Signal(signed(DSP_A_BITS), name=f"dsp_at{c}_{lane}")
                    m.d.comb += a_t.eq(Mux(b[2 * c], 1, -1) + (Mux(b[2 * c + 1], 1, -1) << FT))
                    # the choice as AND-OR, not a multiplexer: a multiplexer with a constant 0 on the dX side
                    # (A's middle bits) becomes, in Yosys, the flip-flop's synchronous reset, and a flip-flop with a
                    # reset cannot move into the MULT18's input register (boards/ecp5_dsp.py)
                    sx = s1_x.replicate(DSP_A_BITS)
                    m.d.comb += a.eq((a_dx.as_unsigned() & sx) | (a_t.as_unsigned() & ~sx))
                else:
                    m.d.comb += a.eq(a_dx)
                # A1, B1: the first operand registers, B1 a copy per slice (KEEP), not merged into one per lane (a
                # merged one reached the far MULT18s of the lane's slices through 6.2 ns of routing on the ECP5
                # proxy); A2, B2: the multiplier's own
                a_c = Signal.like(a, name=f"dsp_ac{c}_{lane}", reset_less=True)  # stage c
                a_r1 = Signal.like(a, name=f"dsp_ar1_{c}_{lane}", reset_less=True)
                a_r = Signal.like(a, name=f"dsp_ar{c}_{lane}", reset_less=True)
                b_r1 = Signal.like(v_dw, name=f"dsp_br1_{c}_{lane}", reset_less=True, attrs=KEEP)
                b_r = Signal.like(v_dw, name=f"dsp_br{c}_{lane}", reset_less=True)
                m_r = Signal(signed(DSP_A_BITS + len(v_dw)), name=f"dsp_m{c}_{lane}", reset_less=True)  # M
                m.d.sync += [a_c.eq(a), a_r1.eq(a_c), a_r.eq(a_r1), b_r1.eq(v_dw), b_r.eq(b_r1), m_r.eq(a_r * b_r)]
                p_ = Signal(signed(DSP_P_BITS), name=f"dsp_p{c}_{lane}")
                with m.If(m_step[lane]):
                    m.d.sync += p_.eq(Mux(m_first[lane], bias, p_) + m_r)
                acc[c, lane] = p_
            t_b1 = Signal.like(v, name=f"dsp_tb1_{lane}", reset_less=True, attrs=KEEP)
            t_b = Signal.like(v, name=f"dsp_tb{lane}", reset_less=True)
            t_m = Signal(signed(vw + F + 1), name=f"dsp_tm{lane}", reset_less=True)
            m.d.sync += [t_b1.eq(v), t_b.eq(t_b1), t_m.eq(t_b * Const((1 << F) - 1, unsigned(F)))]
            t = Signal(signed(DSP_P_BITS), name=f"dsp_t{lane}")  # lower field: -T
            with m.If(m_step[lane]):
                m.d.sync += t.eq(Mux(m_first[lane], 0, t) + t_m)
            tacc.append(t)

        # ---- capture and drain ----
        # The capture registers of each slice column are a chain over the lanes: the capture loads every lane, and
        # each drain step moves them down one lane, so the drain always reads lane 0 (``head``; an ``LO``-way
        # choice of a lane by the lane counter, whose select fanned out to every capture bit, closed at 58 MHz on
        # the ECP5 proxy). Stage R is the head row; stage V registers its dX word (the ``dx`` output) or its
        # signs and where they go in ``kept`` (written from V).
        cap = Signal()
        d_free = Signal()
        # the finish cycle leaves stage 1 when the chain is free or frees this cycle and no capture is on its way:
        # then the chain is idle at the capture (stage m), which always takes place
        m.d.comb += [adv.eq(~(s1_valid & s1_fin & ~(d_free & ~c_fin & ~a_fin & ~a2_fin & ~m_fin))), cap.eq(m_fin)]
        cap_p = {key: Signal(2 * F, name=f"cap{key[0]}_{key[1]}", reset_less=True) for key in acc}
        cap_t = [Signal(F, name=f"cap_t{lane}", reset_less=True) for lane in range(LO)]
        d_busy = Signal()
        d_x = Signal()
        dl = Signal(range(LO))
        d_s = Signal(range(max(NS, 2)))
        d_soff = Signal(addr_w)
        d_qbase = Signal(addr_w)
        d_mask = Signal(LO)  # dX: the lanes whose word is real
        d_pass = Signal.like(pas)
        d_last_g = Signal()
        d_last_k = Signal()
        d_last_tile = Signal()
        mask = Signal(LO)
        for lane in range(LO):
            s, q = lane % NS, lane // NS
            no_sample = s1_sb_last if s >= s_last else Const(0)
            m.d.comb += mask[lane].eq(~no_sample & ~(s1_last_k & ~x_parts_ok[q]))

        head_p = [cap_p[c, 0] for c in range(LS // 2)]
        head_t = cap_t[0]
        vals = []
        for c in range(LS // 2):
            lo_ = Signal(F, name=f"drain_v{2 * c}")
            hi_ = Signal(F, name=f"drain_v{2 * c + 1}")
            m.d.comb += [lo_.eq((head_p[c][:F] << 1) + head_t), hi_.eq(head_t - (head_p[c][F:] << 1))]
            vals += [lo_, hi_]
        m.submodules.queue = queue = SkidBuffer(shape=grad_layout(bank))
        kept = Signal(grad_layout(bank))
        d_push = Signal()  # kept holds a whole tile, offered to the queue
        push_last = Signal()
        # stage V
        v_busy = Signal()
        v_x = Signal()
        v_real = Signal()
        v_addr = Signal(addr_w)
        v_vals = [Signal(max(geo.dx_width, 1), name=f"drain_dx{i}") for i in range(LS)]
        v_push = Signal()  # the row is a tile's last: kept is whole after it
        v_last_tile = Signal()
        v_cons = Signal()  # stage V is empty or its row leaves this cycle
        v_wr = Signal()  # V writes its signs into kept
        d_go = Signal()
        last_lane = Signal()
        # V writes into kept only while no whole tile waits in it (``d_push``, a register): a tile offered to the
        # queue frees kept a cycle after the queue takes it, and the queue's ready reaches neither kept's enables
        # nor the drain's (timing: the queue's ready -> V's write -> kept's clock enables, 13.98 ns for a quarter
        # array at the paper's widths on the ECP5 proxy). No cycle is lost without backpressure: the next tile's
        # first row reaches V a whole pass after the last row of the tile before.
        m.d.comb += [
            v_wr.eq(v_busy & ~v_x & ~d_push),
            v_cons.eq(~v_busy | Mux(v_x, ~v_real | self.dx.ready, ~d_push)),
            d_go.eq(d_busy & v_cons),
            last_lane.eq(dl == LO - 1),
            d_free.eq(~d_busy | (d_go & last_lane)),
            self.dx.valid.eq(v_busy & v_x & v_real),
            self.dx.payload.addr.eq(v_addr),
            queue.i.valid.eq(d_push),
            queue.i.payload.g.eq(kept.g),
            queue.i.payload.last.eq(push_last),
        ]
        for i in range(LS):
            m.d.comb += self.dx.payload.dx[i].eq(v_vals[i].as_signed())
        with m.If(d_go):
            m.d.sync += [
                v_busy.eq(1), v_x.eq(d_x), v_real.eq(d_mask.bit_select(dl, 1)), v_addr.eq(d_qbase + d_soff),
                v_push.eq(~d_x & (d_pass == PR - 1) & last_lane), v_last_tile.eq(d_last_tile),
            ]
            m.d.sync += [v_vals[i].eq(vals[i][: len(v_vals[i])]) for i in range(LS)]
            with m.If(last_lane):
                m.d.sync += d_busy.eq(0)
            with m.Else():
                m.d.sync += dl.eq(dl + 1)
                with m.If(d_s == NS - 1):
                    m.d.sync += [d_s.eq(0), d_soff.eq(0), d_qbase.eq(d_qbase + 1)]
                with m.Else():
                    m.d.sync += [d_s.eq(d_s + 1), d_soff.eq(d_soff + x_parts)]
        with m.Elif(v_cons):
            m.d.sync += v_busy.eq(0)
        with m.If(d_push & queue.i.ready):
            m.d.sync += d_push.eq(0)
        with m.If(v_wr & v_push):
            m.d.sync += [d_push.eq(1), push_last.eq(v_last_tile)]
        # the signs of the head row and the lanes and pass of kept they go to, registered in V
        nsides = 2 if pairs else 1
        v_sign = [[Signal(signed(2), name=f"drain_sign{h}_{i}") for i in range(LS)] for h in range(nsides)]
        v_lane = Signal(LO, name="drain_lanes")  # one-hot (pairs: two-hot) over kept's lanes
        v_pass = Signal(P, name="drain_passes")  # one-hot over kept's passes
        if pairs:
            signs, lanes, passes = self._drain_pairs(m, sz, head_p, dl, d_pass, d_last_g, d_last_k, LS=LS, LO=LO,
                                                      P=P, FT=FT)
        else:
            pad_bits = sz.pass_padding(m, d_pass, P)
            lane_pad = Signal()
            m.d.comb += lane_pad.eq(d_last_g & ~sz.lane_ok.bit_select(dl, 1))
            signs = {}
            for i in range(LS):
                sig = Signal(signed(2), name=f"sign{i}")
                m.d.comb += sig.eq(Mux(lane_pad | (d_last_k & pad_bits[i]) | (vals[i] == 0), 0,
                                       Mux(vals[i][-1], -1, 1)))
                signs[0, i] = sig
            lanes = Cat(dl == lane for lane in range(LO))
            passes = Cat(d_pass == p for p in range(P))
        with m.If(d_go):
            m.d.sync += [v_sign[h][i].eq(signs[h, i]) for h in range(nsides) for i in range(LS)]
            m.d.sync += [v_lane.eq(lanes), v_pass.eq(passes)]
        for lane in range(LO):
            h = int(pairs and lane >= LO // 2)
            for p in range(P):
                with m.If(v_wr & v_lane[lane] & v_pass[p]):
                    m.d.sync += [kept.g[lane][p * LS + i].eq(v_sign[h][i]) for i in range(LS)]
        # the finish cycle's drain settings, kept from stage 1 to its capture (the next one leaves stage 1 later)
        fin_ctl = {"qbase": s1_base, "mask": mask, "x": s1_x, "pass": s1_pass, "last_g": s1_last_g,
                   "last_k": s1_last_k, "last_tile": s1_last_tile}
        f = {n: Signal.like(v, name=f"fin_{n}") for n, v in fin_ctl.items()}
        with m.If(go1 & s1_fin):
            m.d.sync += [f[n].eq(v) for n, v in fin_ctl.items()]
        with m.If(cap):
            m.d.sync += [
                d_busy.eq(1), dl.eq(0), d_s.eq(0), d_soff.eq(0), d_qbase.eq(f["qbase"]), d_mask.eq(f["mask"]),
                d_x.eq(f["x"]), d_pass.eq(f["pass"]), d_last_g.eq(f["last_g"]), d_last_k.eq(f["last_k"]),
                d_last_tile.eq(f["last_tile"]),
            ]
        # the chain: each lane's capture registers load under a copy of the capture flag of their own and move
        # under a copy of the drain's busy flag of their own (streams.replicas)
        busy_next = Signal()
        m.d.comb += busy_next.eq(Mux(cap, 1, Mux(d_go & last_lane, 0, d_busy)))
        cap_l = replicas(m, a2_fin, LO, name="cap")  # m_fin, a copy per lane
        busy_l = replicas(m, busy_next, LO, name="drain_busy")
        for lane in range(LO):
            regs = [(cap_p[c, lane], acc[c, lane][: 2 * F]) for c in range(LS // 2)] + [(cap_t[lane], tacc[lane][:F])]
            with m.If(cap_l[lane]):
                m.d.sync += [r.eq(v) for r, v in regs]
            with m.Elif(busy_l[lane] & v_cons):
                if lane + 1 < LO:
                    nxt = [cap_p[c, lane + 1] for c in range(LS // 2)] + [cap_t[lane + 1]]
                    m.d.sync += [r.eq(n) for (r, _), n in zip(regs, nxt, strict=True)]
        wiring.connect(m, queue.o, wiring.flipped(self.dw))
        return m

    @staticmethod
    def _drain_pairs(m, sz, head_p, dl, d_pass, d_last_g, d_last_k, *, LS, LO, P, FT):
        """dW drain with :attr:`Po2Geometry.dw_pairs`: slice row ``dl`` holds lanes ``a = dl mod H`` and ``a + H``
        (``H = LO / 2``) of pass ``2 d_pass + (dl >= H)``; slice ``c``'s fields ``0 .. 3`` (``FT`` bits each) are
        the weights (input ``2c``, lane ``a``), (``2c + 1``, ``a``), (``2c``, ``a + H``), (``2c + 1``, ``a + H``),
        the lower three biased by ``2^(FT-1)``, the top one signed. A drain row keeps both lanes' signs. Returns
        ``(signs, lanes, passes)``: ``(side, input) -> sign`` (side 0: lane ``a``, 1: lane ``a + H``), the kept
        lanes ``a`` and ``a + H`` as bits over the lanes and the pass one-hot."""
        H = LO // 2
        hi = Signal(name="drain_hi")
        la = Signal(range(max(H, 2)), name="drain_lane_a")
        p_cur = Signal(range(max(P, 2)), name="drain_pass")
        m.d.comb += [hi.eq(dl >= H), la.eq(Mux(hi, dl - H, dl)), p_cur.eq((d_pass << 1) | hi)]
        pad_bits = sz.pass_padding(m, p_cur, P)
        half = 1 << (FT - 1)
        signs = {}
        for side in range(2):  # lane a, lane a + H
            lane_pad = Signal(name=f"lane_pad{side}")
            m.d.comb += lane_pad.eq(d_last_g & ~sz.lane_ok.bit_select(la + side * H, 1))
            for i in range(LS):
                q = 2 * side + i % 2
                raw = head_p[i // 2][q * FT:(q + 1) * FT]
                neg, zero = (raw[-1], raw == 0) if q == 3 else (~raw[-1], raw == half)
                sig = Signal(signed(2), name=f"sign{side}_{i}")
                m.d.comb += sig.eq(Mux(lane_pad | (d_last_k & pad_bits[i]) | zero, 0, Mux(neg, -1, 1)))
                signs[side, i] = sig
        lanes = Cat(la == lane % H for lane in range(LO))
        passes = Cat(p_cur == p for p in range(P))
        return signs, lanes, passes


class Po2Backward(wiring.Component):
    """dX and sgn(dW) of one dense layer by exponent planes (see the module docstring).

    Parameters (keyword-only): ``geometry`` (:class:`Po2Geometry`); :meth:`from_config` derives it from a
    configuration and a layer index. Or ``shapes``: the geometries of several layers with the same lanes,
    batch, code bits, ``x_max`` and passes, served one at a time: the engine is built for their
    :func:`envelope` (largest words, groups and widths) and the ``layer`` input picks the layer's words,
    groups and padding at run time (hold it while the layer's dX or dW runs; the weight row of word ``k``
    and group ``g`` is ``g * words + k`` with that layer's words).

    Ports (the dX ones only with ``dx_width > 0``):
        layer: ``In(range(len(shapes)))`` (only with two or more shapes) index into ``shapes``.
        dy: ``In(stream.Signature(dy_layout))`` codes of one output group per beat, rows in order.
        dx: ``Out(stream.Signature(dx_layout))`` one input word of ``dX`` per beat, rows in order.
        weights: ``Out(WeightReadSignature(bank))`` read access to the layer's weight banks.
        xdy: ``In(stream.Signature(xdy_layout))`` dW operands, tiles in bank-row order.
        dw: ``Out(stream.Signature(grad_layout(bank)))`` ``sgn(dW)`` of one tile per beat.
    The two units are independent and may run at the same time.
    """

    def __init__(self, *, geometry: Po2Geometry | None = None, shapes=None):
        if (geometry is None) == (shapes is None):
            raise TypeError("give either geometry or shapes")
        if geometry is not None and not isinstance(geometry, Po2Geometry):
            raise TypeError(f"geometry must be a Po2Geometry, not {geometry!r}")
        self._shapes = [geometry] if geometry is not None else list(shapes)
        self._geometry = geo = envelope(self._shapes)
        ports = {}
        if len(self._shapes) > 1:
            ports["layer"] = In(range(len(self._shapes)))
        self._array = array_mode(self._shapes)
        if self._array:
            ports.update(
                dx_start=In(1),
                codes=Out(CodeReadSignature(geo)),
                weights=Out(WeightReadSignature(geo.bank)),
                dx=Out(stream.Signature(geo.array_dx_layout)),
            )
        elif geo.dx_width:
            ports.update(
                dy=In(stream.Signature(geo.dy_layout)),
                dx=Out(stream.Signature(geo.dx_layout)),
                weights=Out(WeightReadSignature(geo.bank)),
            )
        ports.update(xdy=In(stream.Signature(geo.xdy_layout)), dw=Out(stream.Signature(grad_layout(geo.bank))))
        super().__init__(ports)

    @classmethod
    def from_config(
        cls, cfg, layer_index: int, *, lanes_in: int, lanes_out: int, lanes_b: int, dw_passes: int | None = None,
        dx_passes: int | None = None,
    ) -> Po2Backward:
        """The engine of weight layer ``layer_index`` of ``cfg`` (see :meth:`Po2Geometry.from_config`)."""
        return cls(
            geometry=Po2Geometry.from_config(
                cfg, layer_index, lanes_in=lanes_in, lanes_out=lanes_out, lanes_b=lanes_b, dw_passes=dw_passes,
                dx_passes=dx_passes,
            )
        )

    @property
    def geometry(self) -> Po2Geometry:
        return self._geometry

    @property
    def shapes(self) -> list[Po2Geometry]:
        return list(self._shapes)

    @property
    def array(self) -> bool:
        """dX and dW share one array of DSP48 slices (:func:`array_mode`): the dX ports are ``dx_start``,
        ``codes``, ``weights`` and ``dx`` (:attr:`Po2Geometry.array_dx_layout`) instead of ``dy``, ``weights``
        and ``dx``."""
        return self._array

    def elaborate(self, platform):
        m = Module()
        geo = self._geometry
        layer = self.layer if len(self._shapes) > 1 else 0
        if self._array:
            m.submodules.array = arr = _Array(self._shapes)
            m.d.comb += [arr.layer.eq(layer), arr.dx_start.eq(self.dx_start)]
            for name in ("codes", "weights", "dx", "dw"):
                wiring.connect(m, getattr(arr, name), wiring.flipped(getattr(self, name)))
            wiring.connect(m, wiring.flipped(self.xdy), arr.xdy)
            return m
        if geo.dx_width:
            m.submodules.dx_unit = dxu = _Dx(self._shapes)
            m.d.comb += dxu.layer.eq(layer)
            wiring.connect(m, wiring.flipped(self.dy), dxu.dy)
            wiring.connect(m, dxu.dx, wiring.flipped(self.dx))
            wiring.connect(m, dxu.weights, wiring.flipped(self.weights))
        m.submodules.dw_unit = dwu = _Dw(self._shapes)
        m.d.comb += dwu.layer.eq(layer)
        wiring.connect(m, wiring.flipped(self.xdy), dwu.xdy)
        wiring.connect(m, dwu.dw, wiring.flipped(self.dw))
        return m
