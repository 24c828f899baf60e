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
from amaranth import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["WindowAddressGenerator", "WindowGeometry"]

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
