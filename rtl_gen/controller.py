"""The accelerator's control registers (declared once) and the command controller.

:func:`build_regmap` declares every register the host sees; the map is exported as JSON with the
accelerator description (``rtl_gen.contract.AcceleratorDescription``) and implemented by
:class:`rtl_gen.axil.AXI4LiteCSR` in :mod:`rtl_gen.top`.

Commands (``cmd``, one pulse field each; write exactly one bit):

``upload``   accept one batch on the stream input: ``arg.batch`` samples (1 .. ``info.batch``), then their
             labels.
``train``    run one training step (forward, loss, backward, update) on the uploaded batch (a full one).
``infer``    classify the uploaded batch (any size): the forward pass with the running BN statistics, every
             layer's state untouched; the predicted classes are then read back as quantity ``classes``
             (the argmax of the eval logits, first index on ties) and the logits as ``logits``.
``readback`` send quantity ``arg.quantity`` of layer ``arg.layer`` on the stream output.
``restore``  accept quantity ``arg.quantity`` of layer ``arg.layer`` on the stream input.
``abort``    stop the running command (streams are drained and refilled with nothing); always accepted.

A command that makes no sense is refused: nothing starts, an ``error`` bit is set, ``status.busy`` does
not change. The ``error`` bits (sticky, write 1 to clear):

``busy``      a command (other than abort) while another one runs, e.g. start while training or a
              read-back during training;
``multiple``  more than one command bit in one write;
``batch``     ``arg.batch`` is 0 or above the batch size the hardware was built for (``info.batch``), or
              ``train`` after an upload of fewer samples;
``layer``     ``arg.layer`` >= ``info.layers``;
``quantity``  ``arg.quantity`` is not a quantity of that layer, or a restore of a read-only one;
``no_batch``  ``train`` or ``infer`` without a complete batch uploaded since the last command;
``framing``   an input stream transfer whose TLAST came early or not on the last beat (the command ends,
              the rest of the transfer is accepted and dropped, so the DMA never stalls);
``label``     an uploaded label >= ``info.classes`` (the batch is not marked complete).

``done`` bits (sticky, write 1 to clear) report each command's completion; ``status.busy`` is high
while a command runs. ``cycles`` holds the clock cycles of the last ``train`` or ``infer`` command (from the cycle
after the command to the cycle it completes), ``steps`` counts completed training steps and
``correct`` is the last step's number of correctly classified samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl_gen.regmap import Field, Register, RegisterMap
from sim.hw.optim import PROB_BITS
from sim.hw_config import LAYER_FIELD_BITS

from .buffers import SplitMemory
from .contract import HASH_REGISTER
from .shared import layer_port, per_layer
from .streams import SkidBuffer

__all__ = [
    "BnParamUnit",
    "COMMANDS",
    "bn_param_cycles",
    "bn_param_sizes",
    "ERRORS",
    "MAGIC",
    "OPTIMIZER_CODES",
    "REGMAP_VERSION",
    "HASH_REGISTER",
    "build_regmap",
]

MAGIC = 0x584E  # "XN"
REGMAP_VERSION = 2  # 2: the description hash register ``id_hash``
COMMANDS = ("upload", "train", "readback", "restore", "abort", "infer")
DONE = ("upload", "train", "readback", "restore", "infer")
ERRORS = ("busy", "multiple", "batch", "layer", "quantity", "no_batch", "framing", "label")
OPTIMIZER_CODES = {"switch": 0, "bop": 1, "iir": 2, "sgd": 3}

#: Controller states as shown in ``status.state`` (for debugging from the host).
STATES = ("idle", "upload", "forward", "loss", "backward", "update", "readback", "restore", "drain", "finish",
          "infer")


def build_regmap(*, name: str, layers: int, batch: int, classes: int, input_int8: bool, optimizer: str,
                 quantity_kinds: int, layer_bits: int = LAYER_FIELD_BITS, loss_bits: int = 32,
                 desc_hash: int = 0) -> RegisterMap:
    """The accelerator's register map (12-bit address space: one 4 KiB AXI window). ``loss_bits``: width of the
    loss unit's integer loss (``loss``, and ``loss_hi`` for the bits above 32). ``desc_hash``: the value of the
    read-only ``id_hash`` register, :func:`rtl_gen.contract.description_hash` of the accelerator's description (which
    leaves this value out, so it can be computed from the map built with 0)."""
    if not 1 <= layers < (1 << layer_bits):
        raise ValueError(f"layers = {layers} does not fit the {layer_bits}-bit layer field")
    if optimizer not in OPTIMIZER_CODES:
        raise ValueError(f"optimizer {optimizer!r} is not one of {sorted(OPTIMIZER_CODES)}")
    qbits = max(1, (quantity_kinds - 1).bit_length())
    regs = [
        Register("id", "ro", desc="identification", fields=[
            Field("magic", 16, reset=MAGIC, desc='0x584E ("XN")'),
            Field("version", 8, reset=REGMAP_VERSION, desc="register map version"),
        ]),
        Register("info", "ro", desc="build-time geometry", fields=[
            Field("layers", layer_bits, reset=layers, desc="weight layers"),
            Field("classes", 12, reset=classes, desc="output classes"),
            Field("input_int8", 1, reset=int(input_int8), desc="first-layer input: 1 = int8 pixels, 0 = +-1 bits"),
            Field("optimizer", 2, reset=OPTIMIZER_CODES[optimizer], desc="0 switch, 1 bop, 2 iir, 3 sgd"),
        ]),
        Register("info_batch", "ro", desc="batch size the datapath is built for", fields=[
            Field("batch", 16, reset=batch),
        ]),
        Register(HASH_REGISTER, "ro", width=32, reset=desc_hash,
                 desc="hash of accelerator.json (rtl_gen.contract.description_hash): the driver refuses another one"),
        Register("cmd", "pulse", desc="commands: write exactly one bit", fields=[
            Field(c, 1, desc=f"start {c}") for c in COMMANDS
        ]),
        Register("arg", "rw", desc="command arguments", fields=[
            Field("batch", 16, desc="upload: samples in the batch, 1 .. info_batch.batch (train needs a full one)"),
            Field("layer", layer_bits, desc="readback/restore: weight layer"),
            Field("quantity", qbits, desc="readback/restore: quantity code (accelerator.json 'kinds')"),
        ]),
        Register("sched", "rw", desc="per-step optimiser constants (host: Driver.schedule_words)", fields=[
            Field("lr_shift", 6, desc="round(-log2 lr): beta update (and sgd)"),
            Field("opt_shift", 6, desc="bop EMA shift / iir alpha shift at this point of the schedule"),
            Field("switch_gate", PROB_BITS + 1, reset=1 << PROB_BITS,
                  desc="switch: accumulate only where (u & 0xFFFF) < gate; switch_gate(lr / lr0), 65536 = always"),
        ]),
        Register("status", "ro", desc="controller state", fields=[
            Field("busy", 1, desc="a command is running"),
            Field("state", 4, desc="controller state: " + ", ".join(f"{i} {s}" for i, s in enumerate(STATES))),
            Field("layer", layer_bits, desc="layer being processed"),
            Field("batch_loaded", 1, desc="a complete batch is waiting for train"),
            Field("phase", 6, desc="train / infer: index of the running phase (SystemPlan.phases() + infer_phases())"),
        ]),
        Register("done", "w1c", desc="command completion flags", fields=[Field(d, 1) for d in DONE]),
        Register("error", "w1c", desc="refused or failed commands", fields=[Field(e, 1) for e in ERRORS]),
        Register("cycles", "ro", width=32, desc="clock cycles of the last train or infer command"),
        Register("steps", "ro", width=32, desc="training steps completed since reset"),
        Register("correct", "ro", width=16, desc="correctly classified samples of the last step"),
        Register("undone", "ro", width=1,
                 desc="hw.switch_undo: the last step's weight update was reverted (the re-run's loss rose)"),
        Register("loss", "ro", width=min(loss_bits, 32),
                 desc="the last step's integer loss from the loss unit (the switch_undo quantity), bits 0..31"),
    ] + ([Register("loss_hi", "ro", width=loss_bits - 32, desc="the integer loss, bits 32 and above")]
         if loss_bits > 32 else [])  # fmt: skip
    return RegisterMap(regs, name=name, addr_width=12)


# --- per-layer BN parameters: running statistics and the beta optimiser ---------------------------------

SPACE_BETA, SPACE_M, SPACE_A, SPACE_MU, SPACE_S, SPACE_E = range(6)
E_WIDTH = 16

RUNNING_LATENCY = 8
""":class:`BnParamUnit`'s running-statistics pipeline: cycles from a stats beat taken to its channel's update
written (the beat and the reads, the dividends, rtl_gen.divider.CONST_DIV_LATENCY cycles, the sums)."""

#: Cycles a stats beat spends in :class:`BnParamUnit`'s input slice (a skid buffer) before the pipeline takes it.
STATS_IN_STAGE = 1


def bitlen_signal(m, value, width: int, name: str, offset: int = 0):
    """``int.bit_length`` of the unsigned ``value`` minus the constant ``offset`` (a priority encoder whose
    codes carry the offset), as a Signal."""
    out = Signal(range(-offset, width + 1 - offset), name=name)
    m.d.comb += out.eq(-offset)
    for i in range(width):
        with m.If(value[i]):
            m.d.comb += out.eq(i + 1 - offset)
    return out


def m_extra_bits(sm: int, sa: int) -> int:
    """Headroom of the beta momentum ``m`` over the scale EMA ``a`` (docs/architecture.md, "beta update"):
    ``|m| <= F a`` with ``F = 2^(sa-sm) / (1 - (1-2^-sm)/(1-2^-sa))`` when ``sa > sm`` (old large gradients
    decay faster in ``m`` than in ``a``), plus rounding; returns ``bitlen(ceil(F)) + 1``."""
    if sm <= 0 or sa <= sm:
        return 2
    ratio = (1 - 2.0**-sm) / (1 - 2.0**-sa)
    f = 2.0 ** (sa - sm) / (1 - ratio)
    return int(math.ceil(f)).bit_length() + 1


def bn_param_sizes(layer, hw) -> dict:
    """Widths of :class:`BnParamUnit`'s storage and divider for a :class:`rtl_gen.bn_unit.BnLayer` and the
    ``[hw]`` section: ``beta``, ``m``, ``a``, ``running``, ``p1``, ``host`` (bits) and ``divider``
    (dividend, divisor, quotient widths)."""
    p = layer.params
    w = layer.widths
    bits = hw.beta_state_bits
    out = {
        "beta": p.beta_int + p.beta_frac,
        "m": bits + m_extra_bits(hw.beta_momentum_shift, hw.beta_scale_shift),
        "a": bits,
        "running": w["running"],
        "p1": w["P"],
    }
    out["host"] = max(out["beta"], out["m"], out["a"], out["running"], E_WIDTH)
    B, fr = layer.batch, p.running_frac
    ymax = layer.y_bound
    smax = layer.bounds.S
    run_n = max(2 * B * (ymax << fr) + 2 * B, 2 * (smax << fr) + B * B).bit_length() + 1
    out["run_n"] = run_n
    # the divider serves the beta update's ratio (|m| 2^9 + a) / 2a below 2^10; the running statistics divide by
    # the constants 2B and 2B^2 without it (rtl_gen.divider.const_divide)
    out["divider"] = (out["m"] + 11, out["a"] + 2, 10)
    return out


def bn_param_cycles(layer, hw, div_steps: int) -> dict:
    """Cycles of :class:`BnParamUnit`: ``running`` per channel (a stats beat a cycle) and the beta ``update`` of
    the layer (maxima pass, then per channel read, align, EMAs, ratio division, write)."""
    from .divider import latency

    wq = bn_param_sizes(layer, hw)["divider"][2]
    lat = latency(wq, min(div_steps, wq))
    M = layer.channels
    # running: a stats beat a cycle (the divisions by constants are a pipeline)
    running = 1
    # update: maxima pass (its reads' registered requests, the reads, the read words registered, then a registered
    # |P1| before the comparisons), exponent (4 cycles) and the aligner's amounts (2), M + 9 in all (measured in
    # RTL, 784-12-10), then per
    # channel read, the read words
    # registered, align (4: m, a, g through the two-cycle aligner), ema, ratio operands, |m|, request, the
    # divider's latency (|r| taken with the response), the sign of r, delta (the learning-rate shift of r),
    # beta - delta, apply
    return {"running": running, "update": M + 9 + M * (lat + 14)}


class BnParamUnit(wiring.Component):
    """The BN parameters of one or several layers and their per-step updates, bit-exact to
    :func:`sim.hw.arith.running_update` and :func:`sim.hw.optim.beta_update`.

    Storage (one entry per channel): ``beta`` (Q.Fb), the beta EMAs ``m`` and ``a`` (block floating point
    with the layer exponent ``e``), the running mean ``mu`` and scale ``s`` (Q.Fr), and this step's ``P1``.
    With ``layers`` (several :class:`rtl_gen.bn_unit.BnLayer` of one batch size) the layers' channels follow
    each other in every memory, each layer keeps its own ``e``, and the ``layer`` input selects the layer for
    everything (streams, update, host access; hold it while a layer's work runs). Widths and the divider
    are built for the largest bound of all layers (:func:`rtl_gen.bn_unit.merge_bounds`).

    Ports:
        stats: ``In(stream {sum_y, S})`` per channel from the BN forward unit: running update, one channel
            at a time (two divisions by the constants ``2B`` and ``2B^2`` on the unit's divider).
        p1: ``In(stream P)`` per channel from the BN backward unit (kept for the update).
        beta_start: pulse: stream ``beta`` out on ``beta`` (channel order) for the BN forward unit.
        eval_mode / run: with ``eval_mode`` high (evaluation mode: hold it while the stream runs) every ``beta`` beat
            comes with the channel's running statistics on ``run`` (``mu``, ``s``); nothing is updated.
        update: pulse: run the beta update with ``scale`` (the layer's gradient scale exponent) and
            ``lr_shift`` (round(-log2 lr)), both sampled with the pulse; it starts once the running
            statistics in flight are done; ``busy`` until it is done.
        host / host_rdata: host access (:func:`rtl_gen.buffers.host_request_layout`), ``space`` 0 beta,
            1 m, 2 a, 3 mu, 4 s, 5 e (one value), ``outer`` = channel.
        layer: ``In(range(len(layers)))`` (only with several layers) the layer all of the above refer to; taken
            a cycle after it changes (set it a cycle before the layer's streams, host requests or update start;
            ``beta_start`` may come with it).
    """

    def __init__(self, *, layer=None, layers=None, hw, div_steps: int = 2):
        from .bn_unit import BnLayer, merge_bounds

        layers = per_layer(layer, layers, BnLayer, one_name="layer", many_name="layers")
        if len({(lay.batch, lay.params) for lay in layers}) != 1:
            raise ValueError("the layers of one BnParamUnit must share the batch size and arithmetic parameters")
        self._channels = [lay.channels for lay in layers]
        self._layer = layer = merge_bounds(layers)
        self._p = p = layer.params
        self._sm, self._sa, self._bits = hw.beta_momentum_shift, hw.beta_scale_shift, hw.beta_state_bits
        self._rshift = p.running_shift
        sizes = bn_param_sizes(layer, hw)
        w = layer.widths
        self.beta_width = sizes["beta"]
        self.m_width = sizes["m"]
        self.a_width = sizes["a"]
        self.run_width = sizes["running"]
        self.p_width = sizes["p1"]
        self.host_width = sizes["host"]
        self._div = sizes["divider"]
        self._run_n = sizes["run_n"]
        self._div_steps = div_steps
        M = layer.channels
        from .buffers import host_request_layout

        super().__init__({
            **layer_port(len(layers)),
            "stats": In(stream.Signature(data.StructLayout({"sum_y": signed(w["sum_y"]),
                                                            "S": unsigned(layer.s_width)}))),
            "p1": In(stream.Signature(signed(self.p_width))),
            "beta_start": In(1),
            "beta": Out(stream.Signature(signed(self.beta_width))),
            "eval_mode": In(1),
            "run": Out(data.StructLayout({"mu": signed(self.run_width), "s": signed(self.run_width)})),
            "update": In(1),
            "scale": In(signed(E_WIDTH)),
            "lr_shift": In(6),
            "busy": Out(1),
            "host": In(stream.Signature(host_request_layout(M, 1, self.host_width))),
            "host_rdata": Out(stream.Signature(self.host_width)),
        })

    @property
    def channels(self) -> list[int]:
        """Channels of each layer, in ``layer`` order."""
        return list(self._channels)

    def cycles(self, layer: int = 0) -> dict:
        """See :func:`bn_param_cycles` (for layer ``layer``)."""
        from dataclasses import replace

        lay = replace(self._layer, bounds=replace(self._layer.bounds, fan_out=self._channels[layer]))
        return bn_param_cycles(lay, _HwView(self._sm, self._sa, self._bits), self._div_steps)

    def elaborate(self, platform):
        from .divider import CONST_DIV_LATENCY, Divider, const_divide

        assert RUNNING_LATENCY == 3 + CONST_DIV_LATENCY

        lay, p = self._layer, self._p
        B = lay.batch
        chans = self._channels
        n_layers, total = len(chans), sum(chans)
        fr, fb = p.running_frac, p.beta_frac
        sm, sa, bits = self._sm, self._sa, self._bits
        m = Module()
        # the selected layer: its first entry in the memories (base), channels (M) and exponent (e_reg), from the
        # layer as a register, a cycle after ``layer`` (the top level sets it as a phase or a host access starts,
        # and the unit uses them from the next cycle on; only ``beta_start``'s count takes the layer at once:
        # ``M_now``), so that no multiplexer of the callers' layer numbers runs into the memories' addresses
        if n_layers > 1:
            sel = Signal.like(self.layer, name="layer_q")
            m.d.sync += sel.eq(self.layer)
        else:
            sel = Const(0, 1)
        Mmax = max(chans)
        # the layer's channels (and less one) and base address are registers of their own, loaded from ``layer``
        # as ``layer_q`` is (timing: ``layer_q``'s decode in front of the count compares and the base adders,
        # then the FSM's next state, closed at 83.4 MHz at the paper's widths on the ECP5 proxy)
        M = Signal(range(Mmax + 1), init=chans[0], name="M_q")
        M1 = Signal(range(Mmax), init=chans[0] - 1, name="M1_q")
        base = Signal(range(max(total, 2)), name="base_q")
        with m.Switch(self.layer if n_layers > 1 else Const(0, 1)):
            for i, c in enumerate(chans):
                with m.Case(i):
                    m.d.sync += [M.eq(c), M1.eq(c - 1), base.eq(sum(chans[:i]))]
        e_regs = [Signal(signed(E_WIDTH), name=f"e{i}") for i in range(n_layers)]
        e_reg = Signal(signed(E_WIDTH))
        e_new = Signal(signed(E_WIDTH))  # the exponent after this update (set in "exponent")
        e_in = Signal(signed(E_WIDTH))
        e_load = Signal()
        # the update's new exponent is written a cycle after its last channel, from a register (timing: the FSM
        # state and the channel compare into the exponent registers' clock enables closed at 95.5 MHz at the
        # paper's widths on the ECP5 proxy); the host reaches e no earlier than three cycles after the update
        e_upd = Signal(name="e_upd")
        m.d.sync += e_upd.eq(0)
        with m.If(e_upd):
            m.d.comb += [e_in.eq(e_new), e_load.eq(1)]
        with m.Switch(sel):
            for i in range(n_layers):
                with m.Case(i):
                    m.d.comb += e_reg.eq(e_regs[i])
                    with m.If(e_load):
                        m.d.sync += e_regs[i].eq(e_in)
        M_now = Signal.like(M)
        with m.Switch(self.layer if n_layers > 1 else Const(0, 1)):
            for i, c in enumerate(chans):
                with m.Case(i):
                    m.d.comb += M_now.eq(c)
        wn, wd, wq = self._div
        m.submodules.div = div = Divider(dividend_width=wn, divisor_width=wd, quotient_width=wq,
                                         steps=min(self._div_steps, wq))
        mems = {}
        for name, shape in (("beta", signed(self.beta_width)), ("m", signed(self.m_width)),
                            ("a", unsigned(self.a_width)), ("mu", signed(self.run_width)),
                            ("s", signed(self.run_width)), ("p1", signed(self.p_width))):
            init = [1 << fr] * total if name == "s" else []
            # a 1,024-word bulk and a tail: 1,034 channels (the paper's MLP) would need the 2,048-deep modes
            mem = m.submodules[f"{name}_mem"] = SplitMemory(shape=shape, depth=max(total, 2), block=1024,
                                                            init=init, name=name)
            mems[name] = (mem.read, mem.write)
        mem_rd = {k: v[0] for k, v in mems.items()}
        # the write ports too take their address, data and enable from registers, the requests below a cycle
        # earlier (timing: the FSM state -> the write multiplexers -> the segment compare -> beta_mem's tail write
        # enable closed at 92.9 MHz at the paper's widths on the ECP5 proxy); every word is read a pass or more
        # after its write, the host's reads three cycles or more after it
        wr = {}
        for name, (_, port) in mems.items():
            req = wr[name] = _WriteRequest(Signal.like(port.addr, name=f"{name}_wr_addr_n"),
                                           Signal.like(port.data, name=f"{name}_wr_data_n"),
                                           Signal(name=f"{name}_wr_en_n"))
            regs = (Signal.like(port.addr, name=f"{name}_wr_addr_r", reset_less=True),
                    Signal.like(port.data, name=f"{name}_wr_data_r", reset_less=True), Signal(name=f"{name}_wr_en_r"))
            m.d.sync += [r.eq(v) for r, v in zip(regs, (req.addr, req.data, req.en), strict=True)]
            m.d.comb += [port.addr.eq(regs[0]), port.data.eq(regs[1]), port.en.eq(regs[2])]
        # every read port's address and enable come from registers, loaded a cycle before the read from the
        # requests below (``rd``: the host, the beta stream, the running statistics, the update's passes; timing:
        # `b_left` -> the running statistics' read enable and the FSM state -> a_mem's address, decoded and
        # multiplexed into every block RAM of the memory in one cycle, closed at 88.4 and 95.0 MHz at the paper's
        # widths on the ECP5 proxy); each requester takes the word a cycle later than from the port itself
        rd = {}
        for name, port in mem_rd.items():
            req = rd[name] = _ReadRequest(Signal.like(port.addr, name=f"{name}_rd_addr_n"),
                                          Signal(name=f"{name}_rd_en_n"), port.data)
            addr_r = Signal.like(port.addr, name=f"{name}_rd_addr_r", reset_less=True)
            en_r = Signal(name=f"{name}_rd_en_r")
            m.d.sync += [addr_r.eq(req.addr), en_r.eq(req.en)]
            m.d.comb += [port.addr.eq(addr_r), port.en.eq(en_r)]

        # ---- host access (only while idle) ----------------------------------------------------------------
        # A request is taken into registers (offset, data, space one-hot) and carried out from them a cycle
        # later, and ``host.ready`` is a function of flip-flops only (``busy`` a cycle late: the host reaches
        # the unit only between steps): neither the host's valid nor this unit's state crosses into the other
        # side's logic in one cycle (docs/architecture.md, "Timing discipline"). Writes go at one a cycle.
        h = self.host.payload
        busy = Signal()
        busy_r = Signal()
        m.d.sync += busy_r.eq(busy)
        host_pending0 = Signal()  # the read's request registered
        host_pending = Signal()
        host_pending2 = Signal()
        host_space = Signal(3)
        host_e = Signal(signed(E_WIDTH))
        resp_full = Signal()
        resp_data = Signal(self.host_width)
        spaces = {"beta": SPACE_BETA, "m": SPACE_M, "a": SPACE_A, "mu": SPACE_MU, "s": SPACE_S}
        hq_valid, hq_write = Signal(), Signal()
        hq_outer = Signal.like(h.outer, reset_less=True)
        hq_addr = Signal(range(max(total, 2)))
        hq_data = Signal(len(h.data), reset_less=True)
        hq_space = Signal(3, reset_less=True)
        hq_is = {sp: Signal(name=f"hq_is{sp}", reset_less=True) for sp in (*spaces.values(), SPACE_E)}
        m.d.comb += [
            self.host.ready.eq(~busy_r & ~(hq_valid & ~hq_write) & ~host_pending0 & ~host_pending & ~host_pending2 &
                               ~resp_full),
            self.host_rdata.valid.eq(resp_full),
            self.host_rdata.payload.eq(resp_data),
        ]
        host_go = self.host.valid & self.host.ready
        m.d.sync += hq_valid.eq(host_go)
        with m.If(host_go):
            m.d.sync += [hq_write.eq(h.write), hq_outer.eq(h.outer), hq_data.eq(h.data), hq_space.eq(h.space),
                         *(hq_is[sp].eq(h.space == sp) for sp in hq_is)]
        host_rd = Signal()
        host_wr = Signal()
        m.d.comb += [host_rd.eq(hq_valid & ~hq_write), host_wr.eq(hq_valid & hq_write), hq_addr.eq(base + hq_outer)]
        with m.If(host_rd):
            m.d.sync += [host_pending0.eq(1), host_space.eq(hq_space), host_e.eq(e_reg)]
        with m.If(host_pending0):
            m.d.sync += [host_pending0.eq(0), host_pending.eq(1)]
        # a read: the memories' words registered as they leave the block RAMs, then the space's word chosen
        # (timing: the block RAM's output through the space multiplexer into host_rdata closed at 84 MHz at the
        # paper's widths on the ECP5 proxy; a cycle of the host path, outside the step)
        host_words = {name: Signal.like(rd[name].data, name=f"host_{name}") for name in spaces}
        with m.If(host_pending):
            m.d.sync += [host_pending.eq(0), host_pending2.eq(1),
                         *(host_words[name].eq(rd[name].data) for name in spaces)]
        with m.If(host_pending2):
            m.d.sync += [host_pending2.eq(0), resp_full.eq(1)]
            with m.Switch(host_space):
                for name, sp in spaces.items():
                    with m.Case(sp):
                        m.d.sync += resp_data.eq(host_words[name])
                with m.Case(SPACE_E):
                    m.d.sync += resp_data.eq(host_e.as_unsigned())
        with m.If(self.host_rdata.valid & self.host_rdata.ready):
            m.d.sync += resp_full.eq(0)
        with m.If(host_wr & hq_is[SPACE_E]):
            m.d.comb += [e_in.eq(hq_data[:E_WIDTH]), e_load.eq(1)]

        # default port drive: the host's registered request
        for name, sp in spaces.items():
            m.d.comb += [
                rd[name].addr.eq(hq_addr),
                rd[name].en.eq(host_rd & hq_is[sp]),
                wr[name].addr.eq(hq_addr),
                wr[name].data.eq(hq_data),
                wr[name].en.eq(host_wr & hq_is[sp]),
            ]

        # ---- beta stream for the forward unit -----------------------------------------------------------------
        b_left = Signal(range(Mmax + 1))
        b_addr = Signal(range(Mmax))
        b_inflight0 = Signal()  # the read's request registered
        b_inflight = Signal()
        b_full = Signal()
        b_data = Signal(signed(self.beta_width))
        b_issue = Signal()
        m.d.comb += [
            b_issue.eq((b_left != 0) & ~b_inflight0 & ~b_inflight & ~b_full),
            self.beta.valid.eq(b_full),
            self.beta.payload.eq(b_data),
        ]
        with m.If(b_issue):
            m.d.comb += [rd["beta"].addr.eq(base + b_addr), rd["beta"].en.eq(1)]
            m.d.sync += [b_addr.eq(b_addr + 1), b_left.eq(b_left - 1), b_inflight0.eq(1)]
        with m.If(b_inflight0):
            m.d.sync += [b_inflight0.eq(0), b_inflight.eq(1)]
        b_run = Signal.like(self.run)
        m.d.comb += self.run.eq(b_run)
        with m.If(b_issue & self.eval_mode):  # eval: the running statistics travel with beta (no stats arrive then)
            for name in ("mu", "s"):
                m.d.comb += [rd[name].addr.eq(base + b_addr), rd[name].en.eq(1)]
        with m.If(b_inflight):
            m.d.sync += [b_inflight.eq(0), b_full.eq(1), b_data.eq(rd["beta"].data)]
            with m.If(self.eval_mode):
                m.d.sync += [b_run.mu.eq(rd["mu"].data), b_run.s.eq(rd["s"].data)]
        with m.If(self.beta.valid & self.beta.ready):
            m.d.sync += b_full.eq(0)
        with m.If(self.beta_start):
            m.d.sync += [b_left.eq(M_now), b_addr.eq(0)]

        # ---- P1 capture ----------------------------------------------------------------------------------------
        # (each beat registered first and written a cycle later: timing, BN backward's output valid into the
        # memory's write port multiplexer; P1 is read in the upd phase, phases later)
        p1_addr = Signal(range(Mmax))
        p1_v = Signal(name="p1_q_valid")
        p1_d = Signal.like(self.p1.payload, name="p1_q", reset_less=True)
        m.d.comb += self.p1.ready.eq(1)
        m.d.sync += [p1_v.eq(self.p1.valid), p1_d.eq(self.p1.payload)]
        with m.If(p1_v):
            m.d.comb += [wr["p1"].addr.eq(base + p1_addr), wr["p1"].data.eq(p1_d), wr["p1"].en.eq(1)]
            m.d.sync += p1_addr.eq(Mux(p1_addr == M1, 0, p1_addr + 1))

        # ---- running statistics -----------------------------------------------------------------------------
        # mu_b = floor((2 sum_y 2^Fr + B) / 2B) (signed floor), s_b = floor((2 S 2^Fr + B^2) / 2B^2), then
        # r += (b - r + half) >> shift: a pipeline taking a stats beat every cycle (the divisions are by
        # constants: rtl_gen.divider.const_divide). Stage 0 takes the beat and reads mu, s; stage 1 forms the
        # dividends and keeps the old values; the quotients follow CONST_DIV_LATENCY cycles later; then the sums,
        # then the write. A channel's next write is a whole forward pass away.
        ch = Signal(range(Mmax))  # the beta update's channel (run_ch: the running statistics')
        sh = p.running_shift
        half = 1 << (sh - 1)
        req, resp = div.req.payload, div.resp.payload
        run_ch = Signal(range(Mmax))
        run_n = self._run_n
        take = Signal()
        fsm_idle = Signal()  # the beta update's FSM is idle
        pending = Signal()  # an update pulse seen, the update not started
        # the stats beats arrive through a registered slice: this unit's ready (its FSM state) would otherwise run
        # back through the top level's stats fork into the BN forward unit's output stage
        m.submodules.stats_in = stats_in = SkidBuffer(shape=self.stats.payload.shape())
        wiring.connect(m, wiring.flipped(self.stats), stats_in.i)
        stats = stats_in.o
        stats_held = Signal()
        m.d.comb += [stats_held.eq(stats_in.o.valid | ~stats_in.i.ready),
                     stats.ready.eq(fsm_idle & ~pending), take.eq(stats.valid & stats.ready)]
        with m.If(take):
            m.d.comb += [rd["mu"].addr.eq(base + run_ch), rd["mu"].en.eq(1),
                         rd["s"].addr.eq(base + run_ch), rd["s"].en.eq(1)]
            m.d.sync += run_ch.eq(Mux(run_ch == M1, 0, run_ch + 1))
        depth = RUNNING_LATENCY  # stage 0, stage 1, the quotients, the sums, the write
        v = [Signal(name=f"run_v{i}") for i in range(depth)]
        addr = [Signal.like(wr["mu"].addr, name=f"run_addr{i}") for i in range(depth)]
        m.d.sync += [v[0].eq(take), addr[0].eq(base + run_ch)]
        m.d.sync += [v[i].eq(v[i - 1]) for i in range(1, depth)]
        m.d.sync += [addr[i].eq(addr[i - 1]) for i in range(1, depth)]
        run_busy = Signal()
        m.d.comb += run_busy.eq(Cat(*v).any())
        sum_y0 = Signal(signed(len(stats.payload.sum_y)))
        s_val0 = Signal(unsigned(len(stats.payload.S)))
        with m.If(take):
            m.d.sync += [sum_y0.eq(stats.payload.sum_y), s_val0.eq(stats.payload.S)]
        # stage 1: the dividends (a negative mu numerator as -n + 2B - 1, the quotient negated: a floor), the old
        # values while the read words hold them
        n1 = Signal(signed(run_n + 1))
        m.d.comb += n1.eq((sum_y0 << (fr + 1)) + B)
        n_mu = Signal(run_n)
        n_s = Signal(run_n)
        neg = [Signal(name=f"run_neg{i}") for i in range(CONST_DIV_LATENCY + 1)]
        old_mu = [Signal(signed(self.run_width), name=f"run_mu_old{i}") for i in range(CONST_DIV_LATENCY + 1)]
        old_s = [Signal(signed(self.run_width), name=f"run_s_old{i}") for i in range(CONST_DIV_LATENCY + 1)]
        m.d.sync += [n_mu.eq(Mux(n1 < 0, -n1 + 2 * B - 1, n1)), n_s.eq((s_val0 << (fr + 1)) + B * B),
                     neg[0].eq(n1 < 0), old_mu[1].eq(rd["mu"].data), old_s[1].eq(rd["s"].data)]
        for i in range(1, CONST_DIV_LATENCY + 1):
            m.d.sync += neg[i].eq(neg[i - 1])
        for i in range(2, CONST_DIV_LATENCY + 1):  # the read words arrive in stage 2 (the request registered)
            m.d.sync += [old_mu[i].eq(old_mu[i - 1]), old_s[i].eq(old_s[i - 1])]
        q_mu = const_divide(m, n_mu, 2 * B, "run_mu")
        q_s = const_divide(m, n_s, 2 * B * B, "run_s")
        # the sums b - r + half (the old values CONST_DIV_LATENCY cycles behind the dividends, beside the quotients)
        L_ = CONST_DIV_LATENCY
        run_mu_sum = Signal(signed(max(len(q_mu), self.run_width) + sh + 3), name="run_mu_sum")
        run_s_sum = Signal(signed(max(len(q_s), self.run_width) + sh + 3), name="run_s_sum")
        mu_b = Signal(signed(len(q_mu) + 1))
        m.d.comb += mu_b.eq(Mux(neg[L_], -q_mu, q_mu))
        keep_mu, keep_s = Signal.like(old_mu[0], name="run_mu_keep"), Signal.like(old_s[0], name="run_s_keep")
        m.d.sync += [run_mu_sum.eq(mu_b + (half - old_mu[L_])), run_s_sum.eq(q_s + (half - old_s[L_])),
                     keep_mu.eq(old_mu[L_]), keep_s.eq(old_s[L_])]
        with m.If(v[depth - 1]):
            mu_new = Signal(signed(self.run_width + 2))
            s_new = Signal(signed(self.run_width + 2))
            m.d.comb += [
                mu_new.eq(keep_mu + (run_mu_sum >> sh)),
                s_new.eq(keep_s + (run_s_sum >> sh)),
                wr["mu"].addr.eq(addr[depth - 1]), wr["mu"].data.eq(mu_new), wr["mu"].en.eq(1),
                wr["s"].addr.eq(addr[depth - 1]), wr["s"].data.eq(s_new), wr["s"].en.eq(1),
            ]

        # ---- beta update state ------------------------------------------------------------------------------------
        scale = Signal(signed(E_WIDTH))
        lr_sh = Signal(6)
        gmax = Signal(self.p_width)
        amax = Signal(self.a_width)
        dm = Signal(signed(E_WIDTH + 1))
        dg = Signal(signed(E_WIDTH + 1))
        c_issue = Signal(range(Mmax + 1))
        c_more = Signal()  # c_issue != M, a register (the maxima pass's reads to come)
        c_seen = Signal(range(Mmax + 1))
        rd_valid0 = Signal()  # a read requested (registered)
        rd_valid = Signal()
        mx_valid = Signal()
        mx_rq_valid = Signal()
        mx_p1_q = Signal.like(rd["p1"].data, name="max_p1_q")
        mx_a_q = Signal.like(rd["a"].data, name="max_a_q")
        mx_g = Signal(self.p_width)
        mx_a = Signal(self.a_width)

        mv = Signal(signed(self.m_width))
        av = Signal(signed(self.a_width + 1))
        gv = Signal(signed(self.m_width))
        m2 = Signal(signed(self.m_width + 1))
        a2 = Signal(unsigned(self.a_width))
        r = Signal(signed(11))
        beta_new = Signal(signed(self.beta_width))
        m_abs_r = Signal(self.m_width + 1)  # |m2|, registered in "ratio_abs"

        top_g = Signal(signed(E_WIDTH + 2))
        top_a = Signal(signed(E_WIDTH + 2))
        top = Signal(signed(E_WIDTH + 2))  # the new exponent
        g_zero = Signal()
        a_zero = Signal()
        tg_r = Signal(range(-(bits - 2), self.p_width + 1 - (bits - 2)), name="tg_r")
        ta_r = Signal(range(-(bits - 2), self.a_width + 1 - (bits - 2)), name="ta_r")

        # an update request waits (``pending``) until the running-statistics work in flight is done
        with m.If(self.update):
            m.d.sync += [pending.eq(1), scale.eq(self.scale), lr_sh.eq(self.lr_shift)]
        shv = Signal(signed(8))  # the shift of r in the beta step, lr_sh + 8 - Fb (constant during an update)
        m.d.comb += shv.eq(lr_sh + 8 - fb)
        # its cases, amounts and rounding term registered (they follow lr_sh a cycle late, long before "delta";
        # timing: the shift's add, compares and amounts in front of the shifter closed at 87 MHz on the ECP5 proxy)
        sh_left, sh_right = Signal(), Signal()  # shv <= 0: a left shift; 0 < shv < 12: a rounded right shift
        sh_l, sh_r = Signal(5), Signal(4)
        sh_half = Signal(12)  # 2^(shv - 1)
        m.d.sync += [sh_left.eq(shv <= 0), sh_right.eq((shv > 0) & (shv < 12)), sh_l.eq((-shv).as_unsigned()[:5]),
                     sh_r.eq(shv.as_unsigned()[:4]), sh_half.eq(Const(1, 12) << (shv - 1).as_unsigned()[:4])]
        delta = Signal(signed(self.beta_width + 12))
        diff = Signal(signed(self.beta_width + 13))
        ratio_n = Signal(wn)  # the ratio division's operands (|m| 2^9 + a, 2a)
        ratio_d = Signal(wd)
        ratio_zero, ratio_big, ratio_neg = Signal(), Signal(), Signal()  # a = 0, |m| >= 2a, m < 0
        r_mag = Signal(9)  # |r| <= 256
        # one aligner, used for m, a and g in turn (the read words hold while the read enables are low)
        al_w = max(self.m_width, self.a_width + 1, self.p_width + 1)
        # the aligner's operand: the registered m word, then a register loaded a state ahead with the a and P1
        # words, chosen by a flag register (timing: the FSM state's choice of the operand in front of the rounding
        # add's 35-bit carry chain, in the SMALL design in context and at the paper's widths; the memory's output
        # through that choice into a register, 96.2 MHz)
        al_x = Signal(signed(al_w), name="al_x")
        al_x2 = Signal(signed(al_w), name="al_x_q", reset_less=True)
        al_first = Signal(name="al_first")  # the aligner's operand is m (in "align")
        al_ow = max(self.m_width, self.a_width + 1)
        # the three alignments' amounts (m by dm, a by dm, g by dg; dm and dg hold during the update) computed
        # every cycle into registers, and the next align state's set registered again (timing: the state, the
        # choice of dm or dg and the clamp compares in front of these registers closed at 69 MHz on the ECP5 proxy)
        # -dm and -dg registered first (timing: negation, clamp compare and the -1 in one cycle, 81 MHz), and the
        # clamp compares registered a cycle before the sets (timing: dg, the compare d > lmax and the set's
        # register closed at 99.6 MHz at the paper's widths on the ECP5 proxy): the sets follow dm and dg three
        # cycles late, in "read_q" (dm and dg are set in "exponent_diff" and hold for the whole update)
        ndm, ndg = Signal.like(dm, name="ndm"), Signal.like(dg, name="ndg")
        m.d.sync += [ndm.eq(-dm), ndg.eq(-dg)]
        al_sets = [_align_amounts(m, d_, al_w, al_ow, f"al{i}", lmax=lim, domain="sync", neg=nd_, early_clamp=True)
                   for i, (d_, nd_, lim) in enumerate(((dm, ndm, self.m_width - 1), (dm, ndm, self.a_width),
                                                       (dg, ndg, self.m_width - 1)))]
        al_amounts = [Signal.like(v, name=f"al_{k}") for v, k in zip(al_sets[0], ("l", "r", "rm1", "pos"), strict=True)]

        def al_choose(i):
            m.d.sync += [a.eq(v) for a, v in zip(al_amounts, al_sets[i], strict=True)]

        al_out = _align_pipelined(m, al_x, al_amounts, al_ow, "al")
        wq = {name: Signal.like(rd[name].data, name=f"upd_{name}_q") for name in ("m", "a", "beta", "p1")}
        m.d.comb += al_x.eq(Mux(al_first, wq["m"], al_x2))
        with m.FSM() as fsm:
            with m.State("idle"):
                m.d.comb += fsm_idle.eq(1)
                with m.If(pending & ~run_busy):
                    m.d.sync += [pending.eq(0), gmax.eq(0), amax.eq(0), c_issue.eq(0), c_more.eq(1), c_seen.eq(0),
                                 rd_valid0.eq(0), rd_valid.eq(0), mx_rq_valid.eq(0), mx_valid.eq(0)]
                    m.next = "max"
            # beta update pass 0: maxima of |P1| and a
            with m.State("max"):
                with m.If(c_more):
                    m.d.comb += [rd["a"].addr.eq(base + c_issue), rd["a"].en.eq(1),
                                 rd["p1"].addr.eq(base + c_issue), rd["p1"].en.eq(1)]
                    m.d.sync += [c_issue.eq(c_issue + 1), c_more.eq(c_issue != M1)]
                m.d.sync += [rd_valid0.eq(c_more), rd_valid.eq(rd_valid0)]
                # the words registered as they leave the block RAMs, then |P1| and a registered before the
                # comparisons (timing: the negation, the comparison and the maxima's enables in one cycle closed
                # at 95.7 MHz on the ECP5 proxy; the block RAM's output into the negation at 87 MHz at the paper's
                # widths)
                m.d.sync += [mx_rq_valid.eq(rd_valid), mx_p1_q.eq(rd["p1"].data), mx_a_q.eq(rd["a"].data)]
                pv = mx_p1_q
                m.d.sync += [mx_valid.eq(mx_rq_valid), mx_g.eq(Mux(pv < 0, -pv, pv)), mx_a.eq(mx_a_q)]
                with m.If(mx_valid):
                    with m.If(mx_g > gmax):
                        m.d.sync += gmax.eq(mx_g)
                    with m.If(mx_a > amax):
                        m.d.sync += amax.eq(mx_a)
                with m.If(~c_more & ~rd_valid0 & ~rd_valid & ~mx_rq_valid & ~mx_valid):
                    m.next = "exponent"
            # the layer exponent over four cycles (timing: leading-one positions, the comparison and the
            # differences in one cycle closed at 48 MHz on the ECP5 proxy); both candidates carry the
            # "- (bits - 2)" from the encoders (timing: the comparison, the choice and that subtraction in one
            # cycle closed at 93 MHz)
            # the encoders' outputs registered before the sums (timing: the 30-bit encoder and the sum in one
            # cycle closed at 95 MHz at the paper's widths on the ECP5 proxy)
            with m.State("exponent"):
                tg = bitlen_signal(m, gmax, self.p_width, "tg", offset=bits - 2)
                ta = bitlen_signal(m, amax, self.a_width, "ta", offset=bits - 2)
                m.d.sync += [tg_r.eq(tg), ta_r.eq(ta), g_zero.eq(gmax == 0), a_zero.eq(amax == 0)]
                m.next = "exponent_sum"
            with m.State("exponent_sum"):
                m.d.sync += [top_g.eq(tg_r + scale), top_a.eq(ta_r + e_reg)]
                m.next = "exponent_top"
            with m.State("exponent_top"):
                m.d.sync += top.eq(Mux(g_zero, top_a, Mux(a_zero | (top_g > top_a), top_g, top_a)))
                with m.If(g_zero & a_zero):
                    m.next = "idle"  # nothing moves (the model returns its inputs)
                with m.Else():
                    m.next = "exponent_diff"
            with m.State("exponent_diff"):
                m.d.sync += [e_new.eq(top), dm.eq(e_reg - top), dg.eq(scale - top), ch.eq(0)]
                m.next = "amounts"
            with m.State("amounts"):  # the alignments' amount sets follow dm and dg (-dm, -dg, then the sets)
                m.next = "amounts2"
            with m.State("amounts2"):  # the first channel's read requested
                for name in ("m", "a", "beta", "p1"):
                    m.d.comb += [rd[name].addr.eq(base + ch), rd[name].en.eq(1)]
                m.next = "read"
            # al_choose names the NEXT cycle's alignment (its amounts are registered)
            with m.State("read"):  # the words leave the memories (requested in the state before)
                m.next = "read_q"
            # the channel's words registered as they leave the memories, before the aligner and beta - delta
            # (timing: a_mem's output, the operand multiplexer and the rounding add in one cycle closed at 77 MHz
            # at the paper's widths on the ECP5 proxy)
            with m.State("read_q"):
                m.d.sync += [wq[name].eq(rd[name].data) for name in wq]
                m.d.sync += al_first.eq(1)
                al_choose(0)
                m.next = "align"
            # the aligner takes two cycles (_align_pipelined): each result is taken a state after its operand
            with m.State("align"):  # the operand is m
                m.d.sync += [al_x2.eq(wq["a"]), al_first.eq(0)]
                al_choose(1)
                m.next = "align_a"
            with m.State("align_a"):  # the operand is a (al_x_q)
                m.d.sync += al_x2.eq(wq["p1"])
                al_choose(2)
                m.d.sync += mv.eq(al_out)
                m.next = "align_g"
            with m.State("align_g"):  # the operand is P1 (al_x_q)
                m.d.sync += av.eq(al_out)
                m.next = "align_end"
            # the EMAs' rounding terms less the old values registered while g is aligned, and |g| as a choice of
            # two sums (timing: |g|, the subtraction, the rounding add and the update's add chained in one cycle
            # closed at 94 MHz on the ECP5 proxy)
            ema_m = Signal(signed(self.m_width + max(sm, 1) + 1))  # 2^(sm-1) - m
            ema_a = Signal(signed(self.a_width + max(sa, 1) + 2))  # 2^(sa-1) - a
            with m.State("align_end"):
                m.d.sync += gv.eq(al_out)
                if sm > 0:
                    m.d.sync += ema_m.eq((1 << (sm - 1)) - mv)
                if sa > 0:
                    m.d.sync += ema_a.eq((1 << (sa - 1)) - av)
                m.next = "ema"
            with m.State("ema"):
                g_abs2 = Signal(signed(self.m_width + 1))
                m.d.comb += g_abs2.eq(Mux(gv < 0, -gv, gv))
                if sm > 0:
                    m.d.sync += m2.eq(mv + ((gv + ema_m) >> sm))
                else:
                    m.d.sync += m2.eq(gv)
                if sa > 0:
                    a_step = Signal(signed(max(len(ema_a), len(gv)) + 2))  # |g| - a + 2^(sa-1)
                    m.d.comb += a_step.eq(Mux(gv < 0, ema_a - gv, ema_a + gv))
                    m.d.sync += a2.eq(av + (a_step >> sa))
                else:
                    m.d.sync += a2.eq(g_abs2)
                m.next = "ratio_abs"
            # the division always runs (its result is replaced when a = 0 or |m| >= 2a), so every
            # channel takes the same time and the cycle model is exact; its operands are registered first
            # (timing: |m|, the comparison and the dividend in front of the divider's first stages)
            # |m| registered (timing: with the comparison and the dividend, 85 MHz), and the cases a = 0 and
            # |m| >= 2a (as m - 2a >= 0 or m + 2a <= 0, beside |m|; timing: |m| >= 2a, the case and the dividend in
            # one cycle closed at 83.6 MHz at the paper's widths on the ECP5 proxy)
            # m + 2a <= 0 is decided in the next state from the registered sum (timing: m - 2a and m + 2a, the
            # latter's compare with 0, and their join in one cycle closed at 97.1 MHz at the paper's widths on the
            # ECP5 proxy, a2 -> ratio_big_m)
            zero_a = Signal(name="ratio_zero_a")
            big_p = Signal(name="ratio_big_p")  # m - 2a >= 0
            m_2a = Signal((m2 + (a2 << 1)).shape(), name="ratio_m_2a")  # m + 2a
            big = Signal(name="ratio_big_m")
            m.d.comb += big.eq(big_p | (m_2a <= 0))
            with m.State("ratio_abs"):
                m.d.sync += [m_abs_r.eq(Mux(m2 < 0, -m2, m2)), zero_a.eq(a2 == 0),
                             big_p.eq(m2 - (a2 << 1) >= 0), m_2a.eq(m2 + (a2 << 1))]
                m.next = "ratio"
            with m.State("ratio"):
                m_abs = m_abs_r
                m.d.sync += [ratio_n.eq(Mux(zero_a | big, 0, (m_abs << 9) + a2)), ratio_d.eq(Mux(zero_a, 1, a2 << 1)),
                             ratio_zero.eq(zero_a), ratio_big.eq(big), ratio_neg.eq(m2 < 0)]
                m.next = "ratio_req"
            with m.State("ratio_req"):
                m.d.comb += [div.req.valid.eq(1), req.dividend.eq(ratio_n), req.divisor.eq(ratio_d)]
                with m.If(div.req.ready):
                    m.next = "ratio_wait"
            # |r|: the quotient clamped at 256 (256 when |m| >= 2a, 0 when a = 0: the cases' flags registered with
            # the operands), then its sign in a cycle of its own (timing: the FSM state, the compares, the clamp
            # and the negation in one cycle closed at 86 MHz on the ECP5 proxy)
            with m.State("ratio_wait"):
                m.d.comb += div.resp.ready.eq(1)
                with m.If(div.resp.valid):
                    m.d.sync += r_mag.eq(Mux(ratio_zero, 0, Mux(ratio_big | (resp.quotient > 256), 256, resp.quotient)))
                    m.next = "ratio_sign"
            with m.State("ratio_sign"):
                m.d.sync += r.eq(Mux(ratio_neg, -r_mag, r_mag))
                m.next = "delta"
            # the learning-rate shift of r in a cycle of its own (timing: shift, rounding, subtraction, clamp and
            # the beta write in one cycle closed at 25 MHz on the ECP5 proxy)
            with m.State("delta"):
                # delta = r << -sh (sh <= 0), (r + 2^(sh-1)) >> sh (0 < sh < 62), else 0; sh = lr_sh + 8 - Fb
                with m.If(sh_left):
                    m.d.sync += delta.eq(r << sh_l)
                with m.Elif(sh_right):
                    m.d.sync += delta.eq((r + sh_half) >> sh_r)
                with m.Else():
                    m.d.sync += delta.eq(0)  # |r| <= 256: (r + 2^(sh-1)) >> sh = 0 for sh >= 10
                m.next = "apply_diff"
            with m.State("apply_diff"):  # beta - delta registered (timing: with the clamp and the write, 72 MHz)
                m.d.sync += diff.eq(wq["beta"] - delta)
                m.next = "apply"
            with m.State("apply"):
                m.d.comb += beta_new.eq(Mux(diff < p.beta_lo, p.beta_lo, Mux(diff > p.beta_hi, p.beta_hi, diff)))
                m.d.comb += [
                    wr["m"].addr.eq(base + ch), wr["m"].data.eq(m2), wr["m"].en.eq(1),
                    wr["a"].addr.eq(base + ch), wr["a"].data.eq(a2), wr["a"].en.eq(1),
                    wr["beta"].addr.eq(base + ch), wr["beta"].data.eq(beta_new), wr["beta"].en.eq(1),
                ]
                with m.If(ch == M1):
                    m.d.sync += e_upd.eq(1)
                    m.d.sync += ch.eq(0)
                    m.next = "idle"
                with m.Else():  # the next channel's read requested
                    for name in ("m", "a", "beta", "p1"):
                        m.d.comb += [rd[name].addr.eq(base + ch + 1), rd[name].en.eq(1)]
                    m.d.sync += ch.eq(ch + 1)
                    m.next = "read"
        m.d.comb += busy.eq(~fsm.ongoing("idle") | pending | (b_left != 0) | b_inflight0 | b_inflight | b_full |
                            run_busy | stats_held)
        m.d.comb += self.busy.eq(busy)
        return m


@dataclass
class _ReadRequest:
    """A read port's request (``addr``, ``en``: registered before the port) and the port's ``data``."""

    addr: Signal
    en: Signal
    data: object


@dataclass
class _WriteRequest:
    """A write port's request (registered before the port)."""

    addr: Signal
    data: Signal
    en: Signal


class _HwView:
    def __init__(self, sm, sa, bits):
        self.beta_momentum_shift, self.beta_scale_shift, self.beta_state_bits = sm, sa, bits


def _align_amounts(m, d, x_width: int, out_width: int, name: str, lmax=None, domain: str = "comb", neg=None,
                   early_clamp: bool = False):
    """The shift amounts of :func:`_align` for ``d`` (an ``x_width``-bit operand, a ``signed(out_width)``
    result): ``(left, right, right - 1, d >= 0)``, clamped where the result no longer changes; left shifts at
    ``lmax`` (default ``out_width - 1``). ``domain="sync"``: registered (they follow ``d`` a cycle late).
    ``neg``: ``-d`` given (e.g. registered). ``early_clamp`` (with ``domain="sync"``): the clamp compares are
    registers of their own a cycle before the amounts (which then follow ``d`` and ``neg`` two cycles late; for
    amounts that hold long, the timing reason: a compare's carry chain in front of the amounts' registers)."""
    nd = -d if neg is None else neg
    wx = x_width + 1
    lcap = max(out_width - 1, 1)
    if lmax is None:
        lmax = lcap
    rmax = wx + 1
    left = Signal(range(lcap + 1), name=f"{name}_l")
    right = Signal(range(rmax + 1), name=f"{name}_r")
    rm1 = Signal(range(rmax + 1), name=f"{name}_rm1")
    pos = Signal(name=f"{name}_pos")
    l_over, r_over = d > lmax, nd > rmax
    if early_clamp:
        assert domain == "sync"
        l_over, r_over = Signal(name=f"{name}_lgt"), Signal(name=f"{name}_rgt")
        m.d.sync += [l_over.eq(d > lmax), r_over.eq(nd > rmax)]
    m.d[domain] += [
        left.eq(Mux(l_over, lmax, d.as_unsigned()[: len(left)])),
        right.eq(Mux(r_over, rmax, nd.as_unsigned()[: len(right)])),
        rm1.eq(Mux(r_over, rmax, nd.as_unsigned()[: len(right)]) - 1),
        pos.eq(d >= 0),
    ]
    return left, right, rm1, pos


def _align_pipelined(m, x, amounts, out_width: int, name: str):
    """:func:`_align` of ``x`` with the given ``amounts`` over two cycles: the operand and its rounded form
    registered, then the shift; the result (a ``signed(out_width)`` Signal) follows ``x`` and ``amounts`` a
    cycle late (timing: the operand multiplexer, the rounding add and the shifter in one cycle closed at 68 MHz
    on the ECP5 proxy)."""
    xs = Signal(signed(len(x) + 1), name=f"{name}_x")
    m.d.comb += xs.eq(x)
    wx = len(xs)
    left, right, rm1, pos = amounts
    xs_r = Signal(signed(wx), name=f"{name}_xr")
    rnd_r = Signal(signed(wx + 2), name=f"{name}_rnd")
    left2, right2, pos2 = Signal.like(left, name=f"{name}_l2"), Signal.like(right, name=f"{name}_r2"), Signal()
    m.d.sync += [xs_r.eq(xs), rnd_r.eq(xs + (Const(1, wx + 1) << rm1)), left2.eq(left), right2.eq(right),
                 pos2.eq(pos)]
    out = Signal(signed(out_width), name=name)
    with m.If(pos2):
        m.d.comb += out.eq(xs_r << left2)
    with m.Else():
        m.d.comb += out.eq(rnd_r >> right2)
    return out


def _align(m, x, d, out_width: int, name: str, lmax=None, sync_amounts: bool = False, amounts=None):
    """``x 2^d`` of :func:`sim.hw.optim._align`: ``x << d`` for ``d >= 0``, else ``(x + 2^(-d-1)) >> -d``
    (round half up), as a ``signed(out_width)`` Signal. Right shifts past the operand give 0 exactly as the
    model (the shift is clamped where the result no longer changes); left shifts are clamped at ``lmax``
    (default ``out_width - 1``; a value when one aligner serves results of different widths: each result's
    low bits are then those of its own width's aligner). ``sync_amounts``: the clamped shift amounts and the
    direction are registered (they follow ``d`` and ``lmax`` one cycle late; for shifts that stay put while the
    aligner runs, the timing reason: the clamp compares in front of the shifter). ``amounts``: the amounts
    given instead of ``d`` (:func:`_align_amounts` of the same widths)."""
    xs = Signal(signed(len(x) + 1), name=f"{name}_x")
    m.d.comb += xs.eq(x)
    wx = len(xs)
    out = Signal(signed(out_width), name=name)
    if amounts is None:
        amounts = _align_amounts(m, d, len(x), out_width, name, lmax, "sync" if sync_amounts else "comb")
    left, right, rm1, pos = amounts
    with m.If(pos):
        m.d.comb += out.eq(xs << left)
    with m.Else():
        rnd = Signal(signed(wx + 2), name=f"{name}_rnd")
        m.d.comb += rnd.eq(xs + (Const(1, wx + 1) << rm1))
        m.d.comb += out.eq(rnd >> right)
    return out
