"""A tiny stream block that exercises the whole toolchain: Amaranth -> Verilog -> cocotb on Verilator/Icarus.

It is the BNN inner product in miniature: for each input beat ``(a, w)`` it emits ``popcount(~(a ^ w))``,
the number of positions where activation and weight bits agree.
"""

from amaranth import Module, Shape
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["XnorPopcount", "ref_xnor_popcount"]


def ref_xnor_popcount(a: int, w: int, width: int) -> int:
    """Golden model: number of equal bits in the low ``width`` bits of ``a`` and ``w``."""
    mask = (1 << width) - 1
    return (~(a ^ w) & mask).bit_count()


class XnorPopcount(wiring.Component):
    """XNOR-popcount of one ``width``-bit activation/weight pair per stream beat, one register stage.

    Ports:
        i_stream: payload ``{a: width, w: width}`` (``a`` in the low bits).
        o_stream: payload ``popcount(~(a ^ w))``, ``ceil(log2(width + 1))`` bits.

    Accepts a beat whenever the output register is empty or being drained, so it runs at one beat per
    cycle under no backpressure.
    """

    def __init__(self, *, width: int = 8):
        if not isinstance(width, int) or not 1 <= width <= 1024:
            raise ValueError(f"width must be an integer in 1..1024, not {width!r}")
        self._width = width
        super().__init__(
            {
                "i_stream": In(stream.Signature(data.StructLayout({"a": width, "w": width}))),
                "o_stream": Out(stream.Signature(self.count_shape)),
            }
        )

    @property
    def width(self) -> int:
        return self._width

    @property
    def count_shape(self) -> Shape:
        return Shape.cast(range(self._width + 1))

    def elaborate(self, platform):
        m = Module()
        agree = ~(self.i_stream.payload.a ^ self.i_stream.payload.w)
        count = sum(agree[i] for i in range(self._width))

        m.d.comb += self.i_stream.ready.eq(self.o_stream.ready | ~self.o_stream.valid)
        with m.If(self.i_stream.ready):
            m.d.sync += [
                self.o_stream.valid.eq(self.i_stream.valid),
                self.o_stream.payload.eq(count),
            ]
        return m
