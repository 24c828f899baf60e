"""Row reads of a conv layer's windows (docs/architecture.md 10.1): the address generator over a feature map.

A conv layer's input map (or, for ``dx j``, its code map) sits in block RAM as one row per image row: row
``(b, r)`` of sample ``b`` and image row ``r`` at rows ``b H + r``, each ``row_words`` memory words, so word
``w`` of it is at address ``(b H + r) row_words + w``. For every output row ``(b, h)`` (``h`` in
``0 .. Ho - 1``, ``Ho = H + 2 pad - k + 1``) the windows of that row read the ``k`` input rows
``h - pad .. h - pad + k - 1``; the generator emits those reads, kernel row by kernel row and word by word,
for the consumer that loads them into its ``k``-row register window:

    for b in 0 .. B-1, h in 0 .. Ho-1, i in 0 .. k-1, w in 0 .. row_words-1:
        r = h + i - pad;  valid = 0 <= r < H;  addr = (b H + r) row_words + w if valid else 0

A beat whose image row lies in the padding (``valid`` = 0) reads nothing: the consumer loads zeros and marks
those window positions as skipped terms (docs/arithmetic.md 3.8). ``pad`` is the convolution's own padding
(0 for ``valid``, ``(k - 1) / 2`` for ``same``) for the forward and dW windows, and ``k - 1 - pad`` for the
transposed convolution of ``dx j`` over the codes (then ``H`` is the code map's height and ``Ho`` the input
map's).

The payload carries ``addr``, ``valid``, ``row_last`` (the last read of an output row's window rows: the
consumer may start emitting that row's windows) and ``last`` (the last beat of the batch). One beat a cycle
while ``o.ready`` is high: ``B Ho k row_words`` cycles for a batch (:meth:`WindowGeometry.cycles`).

Ports: ``start`` (a pulse; ignored while ``busy``), ``o`` (the read stream), ``busy``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RowWindow", "RowWindowGeometry", "WindowAddressGenerator", "WindowGeometry", "row_window_reference"]

MAX_SIZE = 1 << 16


def _check(name: str, value: object, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {value!r}")
    return value


@dataclass(frozen=True)
class WindowGeometry:
    """One feature map's shape as the generator reads it: ``batch`` samples of ``height`` rows of ``row_words``
    memory words, windows of ``kernel`` rows with ``pad`` padding rows above and below."""

    batch: int
    height: int
    kernel: int
    pad: int
    row_words: int = 1

    def __post_init__(self):
        _check("batch", self.batch, 1, MAX_SIZE)
        _check("height", self.height, 1, MAX_SIZE)
        _check("kernel", self.kernel, 1, 15)
        _check("pad", self.pad, 0, self.kernel - 1)
        _check("row_words", self.row_words, 1, MAX_SIZE)
        if self.out_height < 1:
            raise ValueError(f"kernel {self.kernel} with pad {self.pad} does not fit {self.height} rows")

    @classmethod
    def for_conv(cls, *, batch: int, height: int, kernel: int, padding: str, row_words: int = 1,
                 transposed: bool = False) -> WindowGeometry:
        """The reads of a conv layer's forward / dW windows (``padding`` "valid" or "same"), or with
        ``transposed`` those of ``dx j`` over the code map (``height`` then the code map's ``Ho``)."""
        if padding not in ("valid", "same"):
            raise ValueError(f"padding must be 'valid' or 'same', not {padding!r}")
        if padding == "same" and kernel % 2 == 0:
            raise ValueError(f"padding 'same' needs an odd kernel, not {kernel}")
        pad = (kernel - 1) // 2 if padding == "same" else 0
        return cls(batch=batch, height=height, kernel=kernel, pad=kernel - 1 - pad if transposed else pad,
                   row_words=row_words)

    @property
    def out_height(self) -> int:
        return self.height + 2 * self.pad - self.kernel + 1

    @property
    def depth(self) -> int:
        """Words of the map: the address range."""
        return self.batch * self.height * self.row_words

    def cycles(self) -> int:
        """Beats of one batch (one a cycle without backpressure)."""
        return self.batch * self.out_height * self.kernel * self.row_words

    def reads(self) -> dict[str, np.ndarray]:
        """The reference sequence of beats: ``addr``, ``valid``, ``row_last``, ``last`` (one entry per beat)."""
        B, H, k, RW = self.batch, self.height, self.kernel, self.row_words
        b, h, i, w = np.meshgrid(np.arange(B), np.arange(self.out_height), np.arange(k), np.arange(RW),
                                 indexing="ij")
        b, h, i, w = (a.reshape(-1) for a in (b, h, i, w))
        r = h + i - self.pad
        valid = (r >= 0) & (r < H)
        addr = np.where(valid, (b * H + r) * RW + w, 0)
        row_last = (i == k - 1) & (w == RW - 1)
        last = np.zeros(len(addr), dtype=bool)
        last[-1] = True
        return {"addr": addr.astype(np.int64), "valid": valid, "row_last": row_last, "last": last}


class WindowAddressGenerator(wiring.Component):
    """The reads of :class:`WindowGeometry` as a stream (module docstring). The payload is computed from the
    counters' registers (a constant multiply and an add), so it holds still while ``o.ready`` is low."""

    def __init__(self, *, geometry: WindowGeometry):
        if not isinstance(geometry, WindowGeometry):
            raise TypeError(f"geometry must be a WindowGeometry, not {type(geometry).__name__}")
        self.geometry = geometry
        self._layout = data.StructLayout({
            "addr": range(max(geometry.depth, 2)),
            "valid": 1,
            "row_last": 1,
            "last": 1,
        })
        super().__init__({
            "start": In(1),
            "o": Out(stream.Signature(self._layout)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        B, H, k, RW, pad, Ho = g.batch, g.height, g.kernel, g.row_words, g.pad, g.out_height
        b = Signal(range(max(B, 2)))
        h = Signal(range(max(Ho, 2)))
        i = Signal(range(max(k, 2)))
        w = Signal(range(max(RW, 2)))
        r = Signal(signed(max(H + k, 2 * k).bit_length() + 1))  # the image row h + i - pad
        base = Signal(range(B * H + 1))  # b H
        running = Signal()
        last_w, last_i, last_h, last_b = w == RW - 1, i == k - 1, h == Ho - 1, b == B - 1
        inside = Signal()
        row = Signal(range(B * H + 1))
        m.d.comb += [
            inside.eq((r >= 0) & (r < H)),
            row.eq(base + r),  # taken only where inside: then 0 <= b H + r < B H
            self.busy.eq(running),
            self.o.valid.eq(running),
            self.o.payload.valid.eq(inside),
            self.o.payload.row_last.eq(last_i & last_w),
            self.o.payload.last.eq(last_i & last_w & last_h & last_b),
        ]
        with m.If(inside):
            m.d.comb += self.o.payload.addr.eq(row * RW + w)

        with m.If(~running & self.start):
            m.d.sync += [running.eq(1), b.eq(0), h.eq(0), i.eq(0), w.eq(0), r.eq(-pad), base.eq(0)]
        with m.If(self.o.valid & self.o.ready):
            with m.If(~last_w):
                m.d.sync += w.eq(w + 1)
            with m.Else():
                m.d.sync += w.eq(0)
                with m.If(~last_i):
                    m.d.sync += [i.eq(i + 1), r.eq(r + 1)]
                with m.Else():
                    m.d.sync += i.eq(0)
                    with m.If(~last_h):
                        m.d.sync += [h.eq(h + 1), r.eq(r - (k - 2))]  # h + 1 + 0 - pad
                    with m.Else():
                        m.d.sync += [h.eq(0), r.eq(-pad)]
                        with m.If(~last_b):
                            m.d.sync += [b.eq(b + 1), base.eq(base + H)]
                        with m.Else():
                            m.d.sync += running.eq(0)
        return m


@dataclass(frozen=True)
class RowWindowGeometry:
    """The register window of one conv layer: rows of ``width`` pixels of ``channels`` bits (pixel ``v`` in bits
    ``v channels .. v channels + channels - 1``), windows of ``kernel x kernel`` pixels, ``pad`` padding columns
    on each side (the generator's ``pad``)."""

    channels: int
    width: int
    kernel: int
    pad: int

    def __post_init__(self):
        _check("channels", self.channels, 1, 4096)
        _check("width", self.width, 1, MAX_SIZE)
        _check("kernel", self.kernel, 1, 15)
        _check("pad", self.pad, 0, self.kernel - 1)
        if self.out_width < 1:
            raise ValueError(f"kernel {self.kernel} with pad {self.pad} does not fit {self.width} columns")

    @property
    def out_width(self) -> int:
        return self.width + 2 * self.pad - self.kernel + 1

    @property
    def window_bits(self) -> int:
        """``N = channels kernel^2``: one im2col row."""
        return self.channels * self.kernel * self.kernel

    def cycles(self, out_rows: int) -> int:
        """Cycles of ``out_rows`` output rows at full rate: ``kernel`` row loads, then ``out_width`` windows."""
        return out_rows * (self.kernel + self.out_width)

    def windows(self, rows: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reference: the windows of one output row from its ``kernel`` input rows (``rows [k, channels, width]``
        of 0/1 bits, ``valid [k]``): ``bits [out_width, N]`` in the contract's ``(c, i, j)`` order (bit
        ``c k^2 + i k + j``; 0 at padding) and ``mask [out_width, k^2]`` (bit ``i k + j``: a real pixel)."""
        k, C, W, p = self.kernel, self.channels, self.width, self.pad
        x = np.where(np.asarray(valid, bool)[:, None, None], np.asarray(rows, np.uint8), 0)
        xp = np.pad(x, ((0, 0), (0, 0), (p, p)))
        real = np.pad(np.broadcast_to(np.asarray(valid, bool)[:, None], (k, W)), ((0, 0), (p, p)))
        bits = np.stack([xp[:, :, v:v + k].transpose(1, 0, 2).reshape(-1) for v in range(self.out_width)])
        mask = np.stack([real[:, v:v + k].reshape(-1) for v in range(self.out_width)])
        assert bits.shape == (self.out_width, C * k * k)
        return bits.astype(np.uint8), mask


def row_window_reference(gen: WindowGeometry, rw: RowWindowGeometry, x_bits: np.ndarray,
                         rng: np.random.Generator) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The beats of a :class:`RowWindow` over map ``x_bits [B, C, H, W]`` (0/1) as the generator ``gen`` reads it:
    the input beats ``(data, valid, row_last, last)`` (the addressed row packed, pixel ``v`` in bits
    ``v C .. v C + C - 1``, or random junk on a padding read) and the expected output beats
    ``(bits, mask, row_last, last)`` as integers (bit 0 first)."""
    x_bits = np.asarray(x_bits, np.uint8)
    B, C, H, W = x_bits.shape
    if (B, H, C, W, gen.pad) != (gen.batch, gen.height, rw.channels, rw.width, rw.pad):
        raise ValueError(f"map {x_bits.shape} does not match {gen} and {rw}")
    rd = gen.reads()
    ins = []
    for a, ok, rl, last in zip(rd["addr"], rd["valid"], rd["row_last"], rd["last"], strict=True):
        if ok:
            b, r = divmod(int(a), H)
            word = sum(int(x_bits[b, c, r, v]) << (v * C + c) for v in range(W) for c in range(C))
        else:
            word = int(rng.integers(0, 1 << min(W * C, 62)))
        ins.append((word, int(ok), int(rl), int(last)))
    outs = []
    k = gen.kernel
    for b in range(B):
        for h in range(gen.out_height):
            rs = [h + i - gen.pad for i in range(k)]
            rows = np.stack([x_bits[b, :, r] if 0 <= r < H else np.zeros((C, W), np.uint8) for r in rs])
            bits, mask = rw.windows(rows, np.array([0 <= r < H for r in rs]))
            for v in range(rw.out_width):
                end = v == rw.out_width - 1
                outs.append((sum(int(t) << i for i, t in enumerate(bits[v])),
                             sum(int(t) << i for i, t in enumerate(mask[v])),
                             int(end), int(end and b == B - 1 and h == gen.out_height - 1)))
    return ins, outs


class RowWindow(wiring.Component):
    """The ``kernel``-row register window that turns the rows :class:`WindowAddressGenerator` reads into windows
    (docs/architecture.md 10.1).

    Input ``i``: one beat per row read, ``data`` (a whole image row, ``width channels`` bits), ``valid`` (0: a
    padding row, ``data`` ignored), ``row_last`` (the output row's last read) and ``last`` (the batch's), i.e. the
    generator's flags with the memory's word (``row_words = 1``). The rows are loaded into registers
    (``kernel (width + 2 pad) channels`` bits, zeros in the padding columns); then the ``out_width`` windows of
    the output row leave on ``o``, one a beat: ``bits`` (``N = channels kernel^2``, the contract's ``(c, i, j)``
    order: bit ``c k^2 + i k + j``), ``mask`` (``k^2`` bits, ``i k + j``: a real pixel, not padding; what
    ``N_valid`` and the engine's skip mask come from), ``row_last`` and ``last``. After each window the rows
    shift right by one pixel, so the window is always the low ``kernel`` pixels of each row (no multiplexer).
    Loading and emitting alternate: ``kernel + out_width`` cycles per output row at full rate
    (:meth:`RowWindowGeometry.cycles`); the engine holds each window for ``ceil(N / li) G`` cycles anyway.
    """

    def __init__(self, *, geometry: RowWindowGeometry):
        if not isinstance(geometry, RowWindowGeometry):
            raise TypeError(f"geometry must be a RowWindowGeometry, not {type(geometry).__name__}")
        self.geometry = geometry
        g = geometry
        k = g.kernel
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "data": g.width * g.channels, "valid": 1, "row_last": 1, "last": 1}))),
            "o": Out(stream.Signature(data.StructLayout({
                "bits": g.window_bits, "mask": k * k, "row_last": 1, "last": 1}))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        g = self.geometry
        k, C, W, p, Wo = g.kernel, g.channels, g.width, g.pad, g.out_width
        rows = [Signal((W + 2 * p) * C, name=f"row{i}") for i in range(k)]
        real = Signal(k)  # per row: an image row, not padding
        load = Signal(range(max(k, 2)))  # the next row register to load
        v = Signal(range(max(Wo, 2)))  # the window's column
        emit = Signal()
        last = Signal()  # the batch's last output row
        v_last = v == Wo - 1
        m.d.comb += [
            self.i.ready.eq(~emit),
            self.o.valid.eq(emit),
            self.o.payload.row_last.eq(v_last),
            self.o.payload.last.eq(last & v_last),
            self.busy.eq(emit | (load != 0)),
        ]
        for c in range(C):
            for i in range(k):
                for j in range(k):
                    m.d.comb += self.o.payload.bits[c * k * k + i * k + j].eq(rows[i][j * C + c])
        for i in range(k):
            for j in range(k):  # column v + j of the padded row is an image column
                m.d.comb += self.o.payload.mask[i * k + j].eq(real[i] & (v + j >= p) & (v + j < p + W))

        with m.If(self.i.valid & self.i.ready):
            word = Signal(W * C)
            m.d.comb += word.eq(Mux(self.i.payload.valid, self.i.payload.data, 0))
            for i in range(k):
                with m.If(load == i):
                    m.d.sync += [rows[i].eq(word << (p * C)), real[i].eq(self.i.payload.valid)]
            with m.If(self.i.payload.row_last):
                m.d.sync += [load.eq(0), emit.eq(1), v.eq(0), last.eq(self.i.payload.last)]
            with m.Else():
                m.d.sync += load.eq(load + 1)
        with m.If(self.o.valid & self.o.ready):
            with m.If(v_last):
                m.d.sync += emit.eq(0)
            with m.Else():
                m.d.sync += v.eq(v + 1)
                for i in range(k):
                    m.d.sync += rows[i].eq(rows[i] >> C)
        return m
