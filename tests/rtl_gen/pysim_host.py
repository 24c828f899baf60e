"""Host-port accesses for units simulated in Amaranth's simulator (the ``host`` / ``host_rdata`` streams of
the weight memory, generator engine and BN parameter unit)."""

from __future__ import annotations


async def host_access(ctx, dut, payload: dict, *, read: bool):
    """Send one request ``payload`` on ``dut.host``; for a read, wait for and return the ``host_rdata`` word."""
    ctx.set(dut.host.payload, payload)
    ctx.set(dut.host.valid, 1)
    await ctx.tick().until(dut.host.ready)
    ctx.set(dut.host.valid, 0)
    if not read:
        return None
    ctx.set(dut.host_rdata.ready, 1)
    (v,) = await ctx.tick().sample(dut.host_rdata.payload).until(dut.host_rdata.valid)
    ctx.set(dut.host_rdata.ready, 0)
    return int(v)


async def start_beta_update(ctx, dut, p1, scale: int, lr_shift: int):
    """Give a BN parameter unit its layer's ``P1`` values (one beat a channel), the gradient scale and the
    learning-rate shift, and pulse ``update`` for one cycle (the unit is busy from the next cycle)."""
    for v in p1:
        ctx.set(dut.p1.payload, int(v))
        ctx.set(dut.p1.valid, 1)
        await ctx.tick()
    ctx.set(dut.p1.valid, 0)
    ctx.set(dut.scale, scale)
    ctx.set(dut.lr_shift, lr_shift)
    ctx.set(dut.update, 1)
    await ctx.tick()
    ctx.set(dut.update, 0)


async def bn_param_host(ctx, dut, space: int, addr: int, data=None):
    """Read (``data`` None) or write one word of a BN parameter unit's ``space`` at channel ``addr``."""
    payload = {"write": int(data is not None), "space": space, "outer": addr, "inner": 0,
               "data": 0 if data is None else int(data) & ((1 << dut.host_width) - 1)}
    return await host_access(ctx, dut, payload, read=data is None)


def to_signed(v: int, w: int) -> int:
    """The ``w``-bit two's-complement value of ``v``'s low ``w`` bits."""
    v &= (1 << w) - 1
    return v - (1 << w) if v >> (w - 1) else v
