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
