// The simulated board's bus harness: the Verilated accelerator (prefix Vsimboard) with a clock loop, an
// AXI4-Lite master and the two 32-bit AXI-Streams, behind a small C interface that host/simboard.py loads
// with ctypes. No Python runs per clock cycle: every call below runs whole transactions in C++.
//
// Timing: inputs change while the clock is low (as the cocotb testbench drives them at falling edges), a
// handshake happens at the rising edge where valid and ready are both high. Each cycle costs two eval()s:
// the rising edge, and the falling edge together with the new inputs.
//
// Every wait is bounded in cycles; a call that runs out returns a negative code instead of hanging.
//
// The top module is host/simboard.py's wrapper around the accelerator: the same ports, with the reset input
// registered once before it reaches the accelerator (see wrap_top there).

#include <cstdint>
#include <memory>

#include "Vsimboard.h"
#include "verilated.h"

namespace {

constexpr int ABI_VERSION = 1;

struct Board {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vsimboard> top;
    uint64_t cycles = 0;
    bool dirty = true;  // inputs or the clock changed since the last eval()

    Board() : ctx(new VerilatedContext), top() {
        ctx->debug(0);
        ctx->randReset(0);
        top.reset(new Vsimboard(ctx.get(), "top"));
        Vsimboard& t = *top;
        t.clk = 0;
        t.rst = 0;
        t.s_axi_awvalid = 0;
        t.s_axi_wvalid = 0;
        t.s_axi_bready = 0;
        t.s_axi_arvalid = 0;
        t.s_axi_rready = 0;
        t.s_axi_awaddr = 0;
        t.s_axi_awprot = 0;
        t.s_axi_wdata = 0;
        t.s_axi_wstrb = 0;
        t.s_axi_araddr = 0;
        t.s_axi_arprot = 0;
        t.s_axis_tvalid = 0;
        t.s_axis_tlast = 0;
        t.s_axis_tdata = 0;
        t.m_axis_tready = 0;
        settle();
    }

    ~Board() { top->final(); }

    // Outputs valid for the coming rising edge.
    inline void settle() {
        if (dirty) {
            top->eval();
            dirty = false;
        }
    }

    // One clock cycle: the rising edge, then the clock low again (evaluated with the next inputs).
    inline void tick() {
        settle();
        top->clk = 1;
        top->eval();
        top->clk = 0;
        dirty = true;
        ++cycles;
    }
};

}  // namespace

extern "C" {

int sb_abi_version() { return ABI_VERSION; }

void* sb_open() { return new Board(); }

void sb_close(void* h) { delete static_cast<Board*>(h); }

uint64_t sb_cycles(void* h) { return static_cast<Board*>(h)->cycles; }

// Reset held high for ``cycles`` cycles, then two cycles for the wrapper's reset register to release it.
void sb_reset(void* h, uint64_t cycles) {
    Board& b = *static_cast<Board*>(h);
    b.top->rst = 1;
    b.dirty = true;
    for (uint64_t i = 0; i < cycles; ++i) b.tick();
    b.top->rst = 0;
    b.dirty = true;
    b.tick();
    b.tick();
    b.settle();
}

// Let ``cycles`` clock cycles pass with every input held.
void sb_run(void* h, uint64_t cycles) {
    Board& b = *static_cast<Board*>(h);
    for (uint64_t i = 0; i < cycles; ++i) b.tick();
    b.settle();
}

// AXI4-Lite write. Returns 0 with ``*resp`` = BRESP, or -1 when the transaction did not finish within
// ``max_cycles`` (the valids are dropped again).
int sb_write(void* h, uint32_t addr, uint32_t data, uint32_t strb, uint64_t max_cycles, uint32_t* resp) {
    Board& b = *static_cast<Board*>(h);
    Vsimboard& t = *b.top;
    t.s_axi_awaddr = addr;
    t.s_axi_awprot = 0;
    t.s_axi_awvalid = 1;
    t.s_axi_wdata = data;
    t.s_axi_wstrb = strb;
    t.s_axi_wvalid = 1;
    t.s_axi_bready = 1;
    b.dirty = true;
    int rc = -1;
    for (uint64_t n = 0; n < max_cycles; ++n) {
        b.settle();
        const bool aw = t.s_axi_awvalid && t.s_axi_awready;
        const bool w = t.s_axi_wvalid && t.s_axi_wready;
        const bool done = t.s_axi_bready && t.s_axi_bvalid;
        if (done) *resp = t.s_axi_bresp;
        b.tick();
        if (aw) t.s_axi_awvalid = 0;
        if (w) t.s_axi_wvalid = 0;
        if (done) {
            rc = 0;
            break;
        }
    }
    t.s_axi_awvalid = 0;
    t.s_axi_wvalid = 0;
    t.s_axi_bready = 0;
    b.dirty = true;
    b.settle();
    return rc;
}

// AXI4-Lite read. Returns 0 with ``*data`` and ``*resp`` (RRESP), or -1 after ``max_cycles``.
int sb_read(void* h, uint32_t addr, uint64_t max_cycles, uint32_t* data, uint32_t* resp) {
    Board& b = *static_cast<Board*>(h);
    Vsimboard& t = *b.top;
    t.s_axi_araddr = addr;
    t.s_axi_arprot = 0;
    t.s_axi_arvalid = 1;
    t.s_axi_rready = 1;
    b.dirty = true;
    int rc = -1;
    for (uint64_t n = 0; n < max_cycles; ++n) {
        b.settle();
        const bool ar = t.s_axi_arvalid && t.s_axi_arready;
        const bool done = t.s_axi_rready && t.s_axi_rvalid;
        if (done) {
            *data = t.s_axi_rdata;
            *resp = t.s_axi_rresp;
        }
        b.tick();
        if (ar) t.s_axi_arvalid = 0;
        if (done) {
            rc = 0;
            break;
        }
    }
    t.s_axi_arvalid = 0;
    t.s_axi_rready = 0;
    b.dirty = true;
    b.settle();
    return rc;
}

// Push ``n`` words into s_axis, TLAST on the last one if ``last``. Returns the number of words the
// accelerator took: fewer than ``n`` when it was not ready for ``max_idle`` cycles in a row.
int64_t sb_send(void* h, const uint32_t* words, uint64_t n, int last, uint64_t max_idle) {
    Board& b = *static_cast<Board*>(h);
    Vsimboard& t = *b.top;
    uint64_t i = 0, idle = 0;
    t.s_axis_tvalid = 1;
    while (i < n) {
        t.s_axis_tdata = words[i];
        t.s_axis_tlast = (last && i + 1 == n) ? 1 : 0;
        b.dirty = true;
        b.settle();
        const bool take = t.s_axis_tready;
        b.tick();
        if (take) {
            ++i;
            idle = 0;
        } else if (++idle >= max_idle) {
            break;
        }
    }
    t.s_axis_tvalid = 0;
    t.s_axis_tlast = 0;
    b.dirty = true;
    b.settle();
    return static_cast<int64_t>(i);
}

// Take up to ``n`` words from m_axis into ``out``, as a DMA S2MM channel does: the transfer ends after
// ``n`` words or at the first TLAST (``*last_at`` = its index, else -1). Returns the number of words
// taken: fewer than ``n`` at an early TLAST or when no word came for ``max_idle`` cycles in a row
// (``*last_at`` < 0 then).
int64_t sb_receive(void* h, uint32_t* out, uint64_t n, uint64_t max_idle, int64_t* last_at) {
    Board& b = *static_cast<Board*>(h);
    Vsimboard& t = *b.top;
    uint64_t i = 0, idle = 0;
    *last_at = -1;
    t.m_axis_tready = 1;
    b.dirty = true;
    while (i < n) {
        b.settle();
        const bool take = t.m_axis_tvalid;
        if (take) {
            out[i] = t.m_axis_tdata;
            if (t.m_axis_tlast) *last_at = static_cast<int64_t>(i);
        }
        b.tick();
        if (take) {
            ++i;
            idle = 0;
            if (*last_at >= 0) break;
        } else if (++idle >= max_idle) {
            break;
        }
    }
    t.m_axis_tready = 0;
    b.dirty = true;
    b.settle();
    return static_cast<int64_t>(i);
}

}  // extern "C"
