"""The top-level accelerator: host interface, controller, buffers and the datapath units the layers share.

See docs/architecture.md for the block diagram and the reasons behind it. In short:

- host interface: AXI4-Lite registers (:func:`rtl_gen.controller.build_regmap`, exported as JSON) and
  one 32-bit AXI-Stream in each direction (``s_axis``: batches and restores, ``m_axis``: read-backs),
  meant for one Xilinx AXI DMA on a Zynq HP port;
- :class:`~rtl_gen.plan.SystemPlan` (rtl_gen/plan.py): everything the configuration decides (layer geometries,
  lanes, widths, which layers share a unit, the phases), in plain Python; the quantities the host can read back /
  restore, their stream layouts, the register map and the host description (``accelerator.json``) are derived from
  it in rtl_gen/host_interface.py;
- :class:`Accelerator`: the Amaranth component built from a plan. Every unit is shared by the layers that
  can use it (their phases never overlap), taking the layer's geometry or state region at run time through
  its ``layer`` input: the weight memory with its optimiser, the generator engine, the XNOR engine, the BN
  forward/backward and po2 units, the BN parameter unit and the po2 backward engine (groups:
  ``SystemPlan.wmem_groups``, ``rng_groups``, ``unit_groups``, ``backward_groups``; for the paper's MLP one
  of each for all five layers); the output layer's logit and loss units; the buffers between them. The
  controller runs the phases of a training step one after the other::

      fwd 0 .. fwd L-1 (the last one with logits and loss), then for j = L-1 .. 0:
      bwd j (BN backward + po2 codes), dx j (j > 0: dX into the buffer of layer j-1),
      upd j (dW, the weight update sweep, the beta update)

The wiring of the phases lives in rtl_gen/wire_forward.py and rtl_gen/wire_backward.py (mixins of
:class:`Accelerator`), the memory-port multiplexers in rtl_gen/ports.py; this file keeps the component, its
memories, buffers and controller, the shared-unit facades and the host targets.
"""

from __future__ import annotations

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    DomainRenamer,
    Instance,
    Module,
    Mux,
    ResetInserter,
    ResetSignal,
    Signal,
    Value,
    signed,
)
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from boards.primitives import GLOBAL_BUFFER, global_buffer_verilog
from sim.hw.arith import loss_grad_scale

from .axil import AXI4LiteCSR, AXI4LiteSignature, vivado_ports
from .bn_unit import BnBackwardUnit, BnForwardUnit, mul_const_fabric
from .buffers import (
    BEAT_BITS,
    BeatWriter,
    HostSequencer,
    MemoryTarget,
    RowWriter,
    SplitMemory,
    WordSerializer,
    beats_for,
)
from .contract import HASH_REGISTER
from .host_interface import E_WIDTH
from .loss_unit import LossGradUnit, OutputLogitUnit
from .plan import TOP_NAME, LayerPlan, SystemPlan
from .po2_backward import Po2Backward
from .po2_unit import Po2Unit
from .ports import OffsetPort, PackedPort, PortMux
from .rng import RngEngine
from .streams import KEEP, SkidBuffer, or_tree
from .weight_memory import WeightMemory
from .wire_backward import BackwardWiring
from .wire_forward import ForwardWiring
from .xnor_engine import XnorEngineCore

__all__ = ["PORT_ATTRS", "Accelerator", "LayerPlan", "SystemPlan", "TOP_NAME", "top_ports"]


def top_ports(component) -> dict:
    """Verilog port names Vivado recognises (``s_axi_awaddr``, ``s_axis_tdata``, ...)."""
    return vivado_ports(component)


# Xilinx interface attributes on the top-level ports (UG994 "Inferring AXI Interfaces", UG1118): with them a
# module reference of the Verilog in a Vivado block design gets its clock (with the bus interfaces and the
# reset it clocks), its active-high reset and its level interrupt without hand work; the AXI4-Lite and the two
# AXI4-Stream interfaces are inferred from the port names. Amaranth writes ``Signal.attrs`` as Verilog
# attributes on the top-level ports.
PORT_ATTRS = {
    "clk": {"X_INTERFACE_INFO": "xilinx.com:signal:clock:1.0 clk CLK",
            "X_INTERFACE_PARAMETER": "ASSOCIATED_BUSIF s_axi:s_axis:m_axis, ASSOCIATED_RESET rst"},
    "rst": {"X_INTERFACE_INFO": "xilinx.com:signal:reset:1.0 rst RST",
            "X_INTERFACE_PARAMETER": "POLARITY ACTIVE_HIGH"},
    "irq": {"X_INTERFACE_INFO": "xilinx.com:signal:interrupt:1.0 irq INTERRUPT",
            "X_INTERFACE_PARAMETER": "SENSITIVITY LEVEL_HIGH"},
}


def _sync_domain(name: str):
    """The top level's implicit clock domain, created at export with :data:`PORT_ATTRS` on its ports."""
    from amaranth import ClockDomain

    cd = ClockDomain(name)
    if name == "sync":
        cd.clk.attrs.update(PORT_ATTRS["clk"])
        cd.rst.attrs.update(PORT_ATTRS["rst"])
    return cd


class Accelerator(ForwardWiring, BackwardWiring, wiring.Component):
    """The accelerator for one :class:`SystemPlan` (see the module docstring and docs/architecture.md)."""

    def __init__(self, plan: SystemPlan):
        if not isinstance(plan, SystemPlan):
            raise TypeError(f"plan must be a SystemPlan, not {plan!r}")
        self._plan = plan
        self._regmap = plan.regmap
        super().__init__({
            "s_axi": In(AXI4LiteSignature(addr_width=self._regmap.addr_width)),
            "s_axis_tdata": In(BEAT_BITS),
            "s_axis_tlast": In(1),
            "s_axis_tvalid": In(1),
            "s_axis_tready": Out(1),
            "m_axis_tdata": Out(BEAT_BITS),
            "m_axis_tlast": Out(1),
            "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1),
            "irq": Out(1),
        })

    @property
    def plan(self) -> SystemPlan:
        return self._plan

    @property
    def regmap(self):
        return self._regmap

    def verilog(self) -> str:
        from .toolchain import to_verilog

        # no source-location attributes: the text (and so the simulator build cache key) changes only when
        # the logic does
        self.irq.attrs.update(PORT_ATTRS["irq"])
        text = to_verilog(self, self._plan.name, ports=top_ports(self), emit_src=False, missing_domain=_sync_domain)
        # the units' reset buffer as a wire; board flows read their own version over it (boards/primitives.py)
        return text + "\n" + global_buffer_verilog()

    # ------------------------------------------------------------------------------------------------------
    def elaborate(self, platform):
        plan = self._plan
        cfg, p = plan.cfg, plan.p
        B, L = plan.batch, len(plan.layers)
        LP = plan.layers
        k_bits = p.k
        m = Module()
        self._m = m
        abort = Signal()
        self._abort = abort
        # The units run in a clock domain of their own, "units": the same clock, and as reset one flip-flop, set
        # by the top level's reset (its initial value) and by the abort command, a cycle after either, through
        # the global buffer (boards/primitives.py). No OR of the two resets in front of every unit flip-flop's
        # synchronous reset, and on the ECP5 the net is on a clock network, not in the fabric.
        units_reset = Signal(init=1)
        m.d.sync += units_reset.eq(abort)
        units_reset_net = Signal()
        m.submodules.units_reset_buffer = Instance(GLOBAL_BUFFER, i_i=units_reset, o_o=units_reset_net)
        m.domains.units = ClockDomain("units")
        m.d.comb += [ClockSignal("units").eq(ClockSignal("sync")), ResetSignal("units").eq(units_reset_net)]

        def sub(name, unit):
            m.submodules[name] = DomainRenamer({"sync": "units"})(unit)
            return unit

        # ---- registers -----------------------------------------------------------------------------------
        m.submodules.csr = csr = AXI4LiteCSR(self._regmap)
        wiring.connect(m, wiring.flipped(self.s_axi), csr.s_axi)
        regs = csr.regs
        for r in self._regmap:
            if r.name in ("id", "info", "info_batch", HASH_REGISTER):
                for f in r.fields:
                    m.d.comb += getattr(getattr(regs, r.name), f.name).eq(f.reset)

        # ---- phases ----------------------------------------------------------------------------------------
        phases = plan.phases() + plan.infer_phases()  # a train command runs the first n_train, infer the rest
        n_ph = len(phases)
        n_train = len(plan.phases())
        training = Signal()
        ph = Signal(range(max(n_ph, 2)))
        ph_start = Signal()  # first cycle of the current phase
        # the phase activity as a one-hot set of registers (docs/architecture.md, "Timing discipline"): ``act[key]``
        # is ``training & ph == i`` and ``start[key]`` its first cycle, each a flip-flop of its own, loaded from
        # ``act_next`` / ``start_next`` (the controller FSM below drives them), so that no decode of ``ph`` sits
        # between the controller and the units' enables and start pulses
        act = {}
        start = {}
        done = {}
        act_next = {}
        start_next = {}
        for key in phases:
            a = Signal(name=f"act_{key[0]}{key[1]}", attrs=KEEP)
            s = Signal(name=f"start_{key[0]}{key[1]}", attrs=KEEP)
            an = Signal(name=f"act_next_{key[0]}{key[1]}")
            sn = Signal(name=f"start_next_{key[0]}{key[1]}")
            m.d.comb += [an.eq(a), sn.eq(0)]
            m.d.sync += [a.eq(an), s.eq(sn)]
            act[key], start[key], act_next[key], start_next[key] = a, s, an, sn
            done[key] = Signal(name=f"done_{key[0]}{key[1]}")
        self._act, self._start = act, start
        self._port_phases = {}  # (port, phases) -> its copy of the phase registers (_port_phase)

        # ---- per-layer units ---------------------------------------------------------------------------------
        po2b = {}
        self.unit_names = []  # the shared units' submodule names
        self._pool = {}  # (name, params) -> [unit, uses]: readers shared by the phases of several layers (_pooled)
        # (kind, a BN unit group's layers) -> the slice of that kind shared by the group (:meth:`_group_slice`): the
        # beta slice in front of BN forward, the Q slice in front of the po2 unit
        self._group_slices = {}
        self._wide_driven = set()  # ids of shared units' wide inputs that already have a default driver (_wide)
        def fwd_keys(j):
            return [k for k in (("fwd", j), ("rfwd", j), ("ifwd", j)) if k in act]

        def unit_act(name, j, kinds):
            """A register of the unit's own that is high while layer ``j``'s phases of ``kinds`` run (a copy per
            unit: no OR of phase registers, and no one register fanning out to every unit)."""
            keys = [k for kind in kinds for k in ([*fwd_keys(j)] if kind == "fwd" else [(kind, j)]) if k in act]
            return self._phase_reg(keys, f"{name}_phase{j}")

        # units that keep every layer's state (in their memories, one region per layer) and take the layer
        # at their ``layer`` input: one BN parameter unit for all layers, one generator engine per group of
        # layers with equal update lanes; the host reaches them through the same facades (host_sel, driven
        # by _connect_targets)
        host_sel = {(kind, lp.index): Signal(name=f"{kind}_host{lp.index}") for kind in ("bnp", "rng", "wm")
                    for lp in LP}
        # weight memories: layer j's is read in fwd j (XNOR engine) and dx j (po2 backward engine) and swept in
        # upd j; one memory (banks, state, sweep datapath) per group of layers with equal lanes
        wm = self._shared_state(m, sub, "wmem", plan.wmem_groups,
                                lambda j: unit_act("wmem", j, ("fwd", "dx", "upd", "undo")) | host_sel[("wm", j)],
                                lambda grp: WeightMemory(geometries=[plan.wmem_geometry(j) for j in grp]))
        bnp = self._shared_state(m, sub, "bn_param", [[lp.index for lp in LP]],
                                 lambda j: unit_act("bn_param", j, ("fwd", "bwd", "upd")) | host_sel[("bnp", j)],
                                 lambda grp: plan.bn_param_unit())
        rng = self._shared_state(m, sub, "rng", plan.rng_groups,
                                 lambda j: unit_act("rng", j, ("upd",)) | host_sel[("rng", j)],
                                 lambda grp: RngEngine(geometries=[plan.rng_geometry(j) for j in grp]))
        groups = plan.unit_groups
        eng = self._shared_state(m, sub, "engine", groups["engine"], lambda j: unit_act("engine", j, ("fwd",)),
                                 lambda grp: XnorEngineCore(geometries=[LP[j].geometry for j in grp]))
        def chans(grp):
            return [LP[j].n_out for j in grp]

        self._bn_groups = [tuple(g) for g in groups["bn"]]
        bnf = self._shared_state(m, sub, "bn_fwd", groups["bn"], lambda j: unit_act("bn_fwd", j, ("fwd",)),
                                 lambda grp: BnForwardUnit(layer=plan.bn_envelope(grp), div_steps=cfg.hw.div_steps,
                                                           channels=chans(grp)))
        bnb = self._shared_state(m, sub, "bn_bwd", groups["bn"], lambda j: unit_act("bn_bwd", j, ("bwd",)),
                                 lambda grp: BnBackwardUnit(layer=plan.bn_envelope(grp), channels=chans(grp),
                                                            pass2_lanes=plan.po2_lanes(LP[grp[0]].lanes_out)))
        po2 = self._shared_state(m, sub, "po2_", groups["bn"], lambda j: unit_act("po2", j, ("bwd",)),
                                 lambda grp: Po2Unit(layer=plan.bn_envelope(grp), mul_steps=cfg.hw.mul_steps,
                                                     channels=chans(grp), tops=[LP[j].top for j in grp],
                                                     pass1_lanes=plan.po2_lanes(LP[grp[0]].lanes_out)))
        for grp in plan.backward_groups:  # one po2 backward engine per group of layers
            unit = sub("po2b_" + "_".join(map(str, grp)),
                       Po2Backward(shapes=[plan.po2_geometry(j) for j in grp]))
            for j in grp:
                po2b[j] = unit
            if len(grp) > 1:
                # the engine's layer, a register loaded from the controller's phase registers: the value the
                # phases' activity copies (a cycle behind them, _phase_reg) would choose, without their OR and
                # multiplexer in front of the engine's sizes (timing: ``upd_any2`` -> the layer's choice -> the
                # dW and dX units' sizes -> the code reader's pop -> the dX unit's issue, 19.16 ns with 17.1 of
                # it routing, the paper-width design's worst path in context on the ECP5 proxy at 380b4b2)
                sel = Signal(range(len(grp)), name="po2b_layer_" + "_".join(map(str, grp)))
                m.d.sync += sel.eq(0)
                for i, j in enumerate(grp):
                    for key in (("dx", j), ("upd", j)):
                        if key in act:
                            with m.If(act[key]):
                                m.d.sync += sel.eq(i)
                m.d.comb += unit.layer.eq(sel)
        top = LP[-1]
        logit = sub("logit", OutputLogitUnit.from_config(cfg, lanes=plan.loss_lanes, div_steps=cfg.hw.div_steps))
        loss = sub("loss", LossGradUnit.from_config(cfg, lanes=plan.loss_lanes, div_steps=cfg.hw.div_steps))

        # ---- memories ----------------------------------------------------------------------------------------
        def mem(name, width, depth, init=None, block=None):
            if block:  # a bulk of whole blocks and a tail (SplitMemory: no half-empty deeper block RAM modes)
                sm = m.submodules[name] = SplitMemory(shape=width, depth=max(depth, 2), block=block, init=init or [],
                                                      name=name)
                return sm.read, sm.write
            mm = m.submodules[name] = Memory(shape=width, depth=max(depth, 2), init=init or [])
            return mm.read_port(), mm.write_port()

        # activations X_j (input of layer j), banked by sample
        xb = {}
        # one sample bank and one word width: all layers' X in one memory (layer j's words from xb_base[j]); the
        # phases read at most one layer's X and write at most one other's (fwd j: X_j in, X_{j+1} out)
        xb_one = len({(lp.lanes_b, lp.lanes_in) for lp in LP}) == 1 and LP[0].lanes_b == 1 and len(LP) > 1
        xb_base = {lp.index: sum(q.tiles * q.words for q in LP[:k]) for k, lp in enumerate(LP)}
        if xb_one:
            xb_all = mem("xb", LP[0].lanes_in, sum(lp.tiles * lp.words for lp in LP))
        else:
            for lp in LP:
                xb[lp.index] = [mem(f"xb{lp.index}_{i}", lp.lanes_in, lp.tiles * lp.words) for i in range(lp.lanes_b)]
        # x_hat | mask of every layer's BN output, BN beat order
        # (hidden layers: the mask only; their x_hat is X_{j+1}, read back from XB_{j+1} in bwd j)
        mx = {lp.index: mem(f"mx{lp.index}", (2 if lp.top else 1) * lp.lanes_out, lp.beats) for lp in LP}
        # per-channel S' and alpha_q of every layer, each in one memory (layer j's channels from chan_base[j]): a
        # few hundred words per layer would leave most of a block RAM per layer empty
        chan_base = {lp.index: sum(q.n_out for q in LP[: k]) for k, lp in enumerate(LP)}
        self._chan_base = chan_base
        chans_all = sum(lp.n_out for lp in LP)
        seff_mem = mem("seff", max(plan.bn_layer(lp.index).s_width for lp in LP), chans_all, block=1024)
        # alpha: alpha_q and above it the zero-scale flag (S = 0: the channel passes no gradient), as
        # BnLayer.alpha_layout, the BN backward unit's alpha stream (alpha_q's width depends on hw.* only)
        self._alpha_w = max(lp.widths["alpha_q"] for lp in LP)
        alpha_mem = mem("alpha", self._alpha_w + 1, chans_all, block=1024)
        # shared: Y (forward) / dX (backward) buffer, codes (banked), po2 scratch
        ydx_w = max(max(lp.lanes_out * lp.widths["y"], lp.lanes_out * lp.widths["dx"]) for lp in LP)
        # the output layer's loss gradient g is kept in the top top.beats words of YDX (written while the logits
        # replay reads Y from the bottom words, read in bwd of the output layer, overwritten by its dX after that)
        ydx_d = max(max(lp.beats for lp in LP), 2 * top.beats)
        self._g_base = ydx_d - top.beats
        lo_max = max(lp.lanes_out for lp in LP)
        lb = LP[0].lanes_b
        cb_d = max(lp.tiles * lp.groups for lp in LP)
        # the codes (one bank) in rows of YDX above its words, n per row, where YDX's block RAMs have the rows free
        # (or YDX is small): codes are written in bwd j (YDX: the scratch is read) and read in dx j (YDX: dX is
        # written) and upd j (YDX idle), so YDX's one read and one write port serve both
        cw_bits = lo_max * k_bits
        cb_n = 1 << max(0, (ydx_w // cw_bits).bit_length() - 1) if cw_bits <= ydx_w else 0
        while cb_n and ydx_w % cb_n:
            cb_n //= 2
        cb_rows = -(-cb_d // cb_n) if cb_n else 0
        cb_in_ydx = (lb == 1 and cb_n > 0
                     and ydx_d + cb_rows <= max(1 << (ydx_d - 1).bit_length(), 512))
        self._cb_packing = (ydx_d, cb_n) if cb_in_ydx else None
        cb = [] if cb_in_ydx else [mem(f"cb{i}", cw_bits, cb_d) for i in range(lb)]
        if cb_in_ydx:
            ydx_mem = m.submodules["ydx"] = Memory(shape=ydx_w, depth=ydx_d + cb_rows, init=[])
            ydx_r, ydx_wp = ydx_mem.read_port(), ydx_mem.write_port(granularity=ydx_w // cb_n)
        else:
            ydx_r, ydx_wp = mem("ydx", ydx_w, ydx_d)
        scr_w = max(len(po2[lp.index].scratch.payload.as_value()) - 1 for lp in LP)
        # the po2 scratch of bwd j goes into YDX where it fits: word b is written after BN backward's second
        # pass has read dX word b (its input), which nothing reads after that; the output layer's g lies above
        # its words. Otherwise a memory of its own.
        scr_in_ydx = scr_w <= ydx_w
        scr_r, scr_wp = (ydx_r, ydx_wp) if scr_in_ydx else mem("scratch", scr_w, ydx_d)
        # output layer: loss gradient g, logits; labels
        self._g_lane = len(loss.g.payload.g[0])  # bits per lane of a g word in YDX
        assert top.lanes_out * self._g_lane <= ydx_w, "g words must fit the YDX buffer"
        lg_w = plan.loss_lanes * plan.logit_width
        lgb_r, lgb_wp = mem("logits", lg_w, B * plan.loss_groups)
        lab_r, lab_wp = mem("labels", plan.label_bits, B)
        plog_r, plog_wp = mem("phase_log", 32, n_ph)
        # the phase log's write from registers, a cycle after the phase's end: the end (`phase_done`, an AND-OR of
        # every unit's done) then reaches only the phase registers, not a distributed RAM's address and enable as
        # well (the routed SMALL design's worst path, docs/results/timing.md)
        # The write passes a second set of registers, which the placer can put by the RAM: from the controller's
        # registers to the RAM's write pins is then a cycle of its own (the first set's enable, where the end
        # arrives: 12.95 ns in the SMALL design in context at 0d278d2 seed 3)
        plog_en = Signal()
        plog_addr = Signal.like(plog_wp.addr)
        plog_data = Signal.like(plog_wp.data, reset_less=True)
        plog_en2 = Signal(name="plog_en2")
        plog_addr2 = Signal.like(plog_wp.addr, name="plog_addr2", reset_less=True)
        plog_data2 = Signal.like(plog_wp.data, name="plog_data2", reset_less=True)
        m.d.sync += [plog_en.eq(0), plog_en2.eq(plog_en), plog_addr2.eq(plog_addr), plog_data2.eq(plog_data)]
        m.d.comb += [plog_wp.addr.eq(plog_addr2), plog_wp.data.eq(plog_data2), plog_wp.en.eq(plog_en2)]

        ports = {}

        def pm(key, port):
            late = key.startswith(("ydx_", "scr_", "xb", "cb", "mx", "seff", "alpha")) and key.endswith("_w")
            # YDX's write port reaches every one of its many RAM slices; S' and alpha's from their callers'
            # registers through the chain was 13.60 ns (the routed SMALL design's worst path at seed 1)
            late += late and key.startswith(("ydx_", "seff", "alpha"))
            ports[key] = PortMux(port, key, late=late)
            return ports[key]

        for j in xb:
            for i, (r, w) in enumerate(xb[j]):
                pm(f"xb{j}_{i}_r", r)
                pm(f"xb{j}_{i}_w", w)
        if xb_one:
            pm("xb_r", xb_all[0])
            pm("xb_w", xb_all[1])
            for lp in LP:
                for rw in "rw":
                    ports[f"xb{lp.index}_0_{rw}"] = OffsetPort(ports[f"xb_{rw}"], xb_base[lp.index])
        for name, (r, w) in [("ydx", (ydx_r, ydx_wp)), ("scr", (scr_r, scr_wp)),
                             ("lgb", (lgb_r, lgb_wp)), ("lab", (lab_r, lab_wp))]:
            if name == "scr" and scr_in_ydx:
                ports["scr_r"], ports["scr_w"] = ports["ydx_r"], ports["ydx_w"]
                continue
            pm(f"{name}_r", r)
            pm(f"{name}_w", w)
        for i, (r, w) in enumerate(cb):
            pm(f"cb{i}_r", r)
            pm(f"cb{i}_w", w)
        if cb_in_ydx:
            for rw in "rw":
                ports[f"cb0_{rw}"] = PackedPort(ports[f"ydx_{rw}"], base=ydx_d, n=cb_n, gran=ydx_w // cb_n,
                                                 width=cw_bits, read=rw == "r")
        pm("plog_r", plog_r)
        for j in LP:
            jj = j.index
            pm(f"mx{jj}_r", mx[jj][0])
            pm(f"mx{jj}_w", mx[jj][1])
        for name, (r, w) in (("seff", seff_mem), ("alpha", alpha_mem)):
            pm(f"{name}_r", r)
            pm(f"{name}_w", w)
            for lp in LP:
                for rw in "rw":
                    ports[f"{name}{lp.index}_{rw}"] = OffsetPort(ports[f"{name}_{rw}"], chan_base[lp.index])

        # ---- host interface --------------------------------------------------------------------------------
        l0 = LP[0]
        hq_w = max(hq.width for hq in plan.quantities)
        w_max = max(hq_w, l0.lanes_in, BEAT_BITS)
        d_max = max([hq.count for hq in plan.quantities] + [B * l0.words, B])
        writer = sub("writer", BeatWriter(width=w_max, depth=d_max))
        ser = sub("serializer", WordSerializer(width=w_max))
        outer_max = max(hq.count for hq in plan.quantities)
        inner_max = max(hq.inner for hq in plan.quantities)
        seq = sub("host_seq", HostSequencer(outer=outer_max, inner=inner_max, width=w_max, count=d_max))
        # the input stream reaches the beat writer through a registered slice: TVALID from the port and the
        # writer's TREADY (the request slice's room, through the sequencer's restore handshake) end at its
        # flip-flops instead of meeting in one LUT between the port's pins and the writer (the SMALL design's
        # routed worst path at one nextpnr seed: the request slice's valid -> the sequencer -> the stream's
        # handshake -> the writer's address enables, 12.62 ns, 11.0 of it routing). A unit of the "units" domain:
        # the abort command empties it with the writer.
        in_skid = sub("s_axis_skid", SkidBuffer(shape=writer.i.payload.shape(), ring=True))
        wiring.connect(m, in_skid.o, writer.i)
        m.d.comb += [
            in_skid.i.valid.eq(self.s_axis_tvalid),
            in_skid.i.payload.data.eq(self.s_axis_tdata),
            in_skid.i.payload.last.eq(self.s_axis_tlast),
            self.s_axis_tready.eq(in_skid.i.ready),
            self.m_axis_tdata.eq(ser.o.payload.data),
            self.m_axis_tlast.eq(ser.o.payload.last),
            self.m_axis_tvalid.eq(ser.o.valid),
            ser.o.ready.eq(self.m_axis_tready),
        ]
        wiring.connect(m, seq.o, ser.i)
        # upload: layer-0 rows into XB_0 (sample-major), labels
        up_rows = sub("upload_rows", RowWriter(width=l0.lanes_in, banks=l0.lanes_b, words=l0.words, rows=B))

        # ---- controller state ----------------------------------------------------------------------------
        busy = Signal()
        batch_loaded = Signal()
        n_loaded = Signal(range(B + 1))  # samples of the uploaded batch (train needs B)
        up_n = Signal(range(B + 1))
        label_bad = Signal()
        cycles = Signal(32)
        steps = Signal(32)
        correct = Signal(16)
        self._loss_rose = Signal()  # switch_undo: the re-run's integer loss is above the first run's
        self._loss_q = Signal(plan.loss_bits, name="loss_q")  # the step's integer loss (first run): register loss
        target_x = Signal()
        uploading = Signal()
        restoring = Signal()
        reading = Signal()
        state_code = Signal(4)
        cur_layer = Signal(range(max(L, 2)))
        done_set = {k: Signal(name=f"done_{k}") for k in ("upload", "train", "readback", "restore", "infer")}
        err_set = {k: Signal(name=f"err_{k}") for k in
                   ("busy", "multiple", "batch", "layer", "quantity", "no_batch", "framing", "label")}
        for k, s_ in done_set.items():
            m.d.comb += getattr(regs.done, f"{k}_set").eq(s_)
        for k, s_ in err_set.items():
            m.d.comb += getattr(regs.error, f"{k}_set").eq(s_)
        m.d.comb += [
            regs.status.busy.eq(busy),
            regs.status.state.eq(state_code),
            regs.status.layer.eq(cur_layer),
            regs.status.batch_loaded.eq(batch_loaded),
            regs.status.phase.eq(Mux(training, ph, 0)),
            regs.cycles.value.eq(cycles),
            regs.steps.value.eq(steps),
            regs.correct.value.eq(correct),
            regs.undone.value.eq(self._loss_rose),
            regs.loss.value.eq(self._loss_q[:32]),
            self.irq.eq(Cat(*[getattr(regs.done, k) for k in done_set], *[getattr(regs.error, k) for k in err_set])
                        .any()),
        ]
        if plan.loss_bits > 32:
            m.d.comb += regs.loss_hi.value.eq(self._loss_q[32:])
        # the commands (the cmd register's write strobes) registered before the controller acts on them (timing: the
        # AXI write's address decode into the FSM and every phase register's next value); a command starts a
        # cycle later, the step's cycles do not change
        strobes = {c: getattr(regs.cmd, c) for c in ("upload", "train", "readback", "restore", "abort", "infer")}
        cmds = {c: Signal(name=f"cmd_{c}") for c in strobes}
        n_cmds = Signal(range(7))
        any_cmd = Signal()
        m.d.sync += [cmds[c].eq(v) for c, v in strobes.items()]
        m.d.sync += [n_cmds.eq(sum(s_.as_unsigned() for s_ in strobes.values())),
                     any_cmd.eq(Cat(*strobes.values()).any())]
        m.d.comb += abort.eq(cmds["abort"])

        # the upload's word count and batch check from registers, a cycle behind the arg register (the command
        # comes in a later AXI write): no product or comparison of the register between the bus and the beat
        # writer's FSM (docs/architecture.md, "Timing discipline")
        batch_words = Signal(len(regs.arg.batch) + (l0.words - 1).bit_length() + 1)
        batch_bad = Signal()
        # (the product as shifts and adds in the fabric: a MULT18 sits in its row across the die from both
        # registers, 12.99 ns in context at one nextpnr seed)
        m.d.sync += [batch_words.eq(mul_const_fabric(regs.arg.batch, l0.words, max_terms=l0.words.bit_length())),
                     batch_bad.eq((regs.arg.batch == 0) | (regs.arg.batch > B))]

        # ---- host quantity selection -------------------------------------------------------------------------
        nq = len(plan.quantities)
        q_match, q_wo, q_ro = Signal(), Signal(), Signal()
        q_index = Signal(range(max(nq, 2)))
        for i, hq in enumerate(plan.quantities):
            with m.If((regs.arg.quantity == hq.layout.kind) & (regs.arg.layer == (hq.layout.layer or 0))):
                m.d.comb += [q_match.eq(1), q_wo.eq(hq.layout.access == "wo"), q_ro.eq(hq.layout.access == "ro"),
                             q_index.eq(i)]
        sel_beats = Signal(range(1, beats_for(w_max) + 1))
        sel_count = Signal(range(d_max + 1))
        sel_inner = Signal(range(1, inner_max + 1))
        sel_space = Signal(3)
        with m.Switch(q_index):
            for i, hq in enumerate(plan.quantities):
                with m.Case(i):
                    m.d.comb += [sel_beats.eq(beats_for(hq.width)), sel_count.eq(hq.count), sel_inner.eq(hq.inner),
                                 sel_space.eq(hq.space)]
        reader_beats = Signal.like(sel_beats)
        m.d.comb += ser.beats.eq(reader_beats)
        targets = plan.targets
        # the target of the selected quantity as one-hot registers (docs/architecture.md, "Timing discipline"):
        # ``tsel[ti]`` is loaded as a readback or a restore starts and ``here[ti]`` is high exactly while the host
        # sequencer owns target ti (the readback / restore states), so that no decode of the quantity or of the FSM
        # state sits between the command and the units' host inputs and the port multiplexers
        q_target = Signal(range(max(len(targets), 2)))
        with m.Switch(q_index):
            for i, hq in enumerate(plan.quantities):
                with m.Case(i):
                    m.d.comb += q_target.eq(targets.index(hq.target))
        tsel = [Signal(name=f"tgt{ti}_chosen") for ti in range(len(targets))]
        here = [Signal(name=f"tgt{ti}_here") for ti in range(len(targets))]
        host_enter = Signal()  # the ``host_go`` state starts a readback or a restore
        host_leave = Signal()  # the readback / restore states go back to idle
        # the selected quantity's target and counts, registered every cycle: ``host_go`` comes the cycle after the
        # idle state accepts the command, so these hold the accepted command's selection there
        go_target = Signal.like(q_target)
        go_count, go_inner, go_space = Signal.like(sel_count), Signal.like(sel_inner), Signal.like(sel_space)
        go_write = Signal()  # the accepted command is a restore
        m.d.sync += [go_target.eq(q_target), go_count.eq(sel_count), go_inner.eq(sel_inner), go_space.eq(sel_space)]
        with m.If(host_enter):
            m.d.sync += [t_.eq(go_target == ti) for ti, t_ in enumerate(tsel)]
            m.d.sync += [h.eq(go_target == ti) for ti, h in enumerate(here)]
        with m.Elif(host_leave):
            m.d.sync += [h.eq(0) for h in here]
        host_on = Signal()  # the host sequencer owns the targets
        m.d.comb += host_on.eq(restoring | reading)
        # the requests reach the targets through a registered slice: a target's ready (a unit's busy state) ends
        # there instead of running through the sequencer into the beat writer and the stream input's ready
        # (emptied with every new command as well: a request left in it by a refused transfer belongs to no target)
        # It is emptied from a register of its own (``host_req_clear``, its fan-out the slice's alone): in the
        # cycle after the abort command's strobe and in the cycle after the host path is left (a refused restore
        # can leave a request in it; the next command's first request comes two cycles after that command starts).
        # The sequencer's start (a decode of the FSM state and the command) once reset it, which put that decode in
        # front of every slot register's enable (14.7 ns in context on the ECP5 proxy); the OR of ``cmd_abort``
        # (placed by the controller) and a register of the leave was 12.7 ns at one nextpnr seed.
        req_skid = SkidBuffer(shape=seq.request_layout)
        req_clear = Signal(name="host_req_clear")
        m.d.sync += req_clear.eq(strobes["abort"] | host_leave)
        m.submodules.host_req_skid = ResetInserter({"sync": req_clear})(req_skid)
        wiring.connect(m, seq.req, req_skid.i)
        self._connect_targets(m, plan, req_skid.o, seq, targets, tsel, here, host_on, wm, rng, bnp, host_sel,
                              {"logits": lgb_r, "plog": plog_r, "labels": lab_r},
                              ports)
        # restore words from the beat writer go to the sequencer
        # (``restore_on``: the restore states as a flip-flop of its own, not a decode of the FSM state, in front of
        # the request slice's input)
        restore_on = Signal()
        m.d.comb += [
            seq.w_valid.eq(writer.w_en & restore_on),
            seq.w_data.eq(writer.w_data),
            writer.w_ready.eq(Mux(restore_on, seq.w_ready, 1)),
        ]
        # upload words
        m.d.comb += [up_rows.valid.eq(writer.w_en & uploading & ~target_x), up_rows.data.eq(writer.w_data)]
        for i in range(l0.lanes_b):
            ports[f"xb0_{i}_w"].add(uploading, addr=up_rows.w_addr, data=up_rows.w_data, en=up_rows.w_en[i])
        ports["lab_w"].add(uploading & target_x, addr=writer.w_addr, data=writer.w_data[: plan.label_bits],
                           en=writer.w_en)
        # a label out of range is seen a cycle after its beat, from a flip-flop of its own (the beat writer's word and
        # its compare end there, not at ``label_bad``'s set and clear). ``upload_check`` comes two cycles after the
        # last label's write at the earliest (the writer's ``finish`` state, then its ``done``), so it sees the flag
        label_hit = Signal()
        m.d.sync += label_hit.eq(writer.w_en & uploading & target_x & (writer.w_data[:BEAT_BITS] >= plan.classes))
        with m.If(label_hit):
            m.d.sync += label_bad.eq(1)

        # ---- datapath of every phase -----------------------------------------------------------------------
        sched_shift = Signal(6)
        h = cfg.hw
        if h.optimizer in ("bop", "iir"):
            m.d.comb += sched_shift.eq(regs.sched.opt_shift)
        elif h.optimizer == "sgd":
            m.d.comb += sched_shift.eq(regs.sched.lr_shift)
        unit_exp = {lp.index: Signal(signed(E_WIDTH), name=f"unit_exp{lp.index}") for lp in LP}
        scale = {}
        for lp in LP:
            j = lp.index
            s_ = Signal(range(-(1 << (E_WIDTH - 1)), 1 << (E_WIDTH - 1)), name=f"scale{j}")
            if lp.top:
                m.d.comb += s_.eq(loss_grad_scale(p))
            else:
                m.d.comb += s_.eq(unit_exp[j + 1])
            scale[j] = s_

        for lp in LP:
            self._forward(m, plan, lp, act, start, done, eng, wm, bnf, bnp, xb, mx, ports, logit, loss,
                          sub, correct)
            self._backward(m, plan, lp, act, start, done, bnb, bnp, po2, mx, ports, scale, unit_exp,
                           sub, lb)
            if lp.index > 0:
                self._dx(m, plan, lp, act, start, done, po2b, wm, ports, sub, lb)
            self._update(m, plan, lp, act, start, done, po2b, wm, rng, bnp, xb, ports, sub, scale, regs,
                         sched_shift, lb)
            if plan.undo:
                self._undo(m, lp, act, start, done, wm)

        # ---- the controller FSM ----------------------------------------------------------------------------
        counting = Signal()
        with m.If(counting):
            m.d.sync += cycles.eq(cycles + 1)
        phase_layer = Signal(range(max(L, 2)))
        with m.Switch(ph):
            for i, key in enumerate(phases):
                with m.Case(i):
                    m.d.comb += phase_layer.eq(key[1])
        phase_done = Signal()
        m.d.comb += phase_done.eq(Cat(*[act[key] & done[key] for key in phases]).any())
        # the phase advances a cycle after its end is seen, from a flip-flop (timing: the AND-OR of every unit's
        # done, then the advance's enables of the phase log, the step counter, the done flags and the phase
        # registers, 16.2 ns in context on the ECP5 proxy); one cycle of cycle_model.PHASE_OVERHEAD
        # (the units see the phase a cycle after the controller (_phase_reg), so a unit's done of its previous run
        # stays visible through the phase's first two controller cycles: ``ph_start`` and ``ph_start2``)
        advance = Signal(attrs=KEEP)
        ph_start2 = Signal()
        m.d.sync += ph_start2.eq(ph_start)
        m.d.sync += advance.eq(phase_done & ~ph_start & ~ph_start2 & ~advance & ~abort)

        with m.FSM():
            with m.State("idle"):
                m.d.comb += state_code.eq(0)
                with m.If(any_cmd & ~abort):
                    with m.If(n_cmds > 1):
                        m.d.comb += err_set["multiple"].eq(1)
                    with m.Elif(cmds["upload"]):
                        with m.If(batch_bad):
                            m.d.comb += err_set["batch"].eq(1)
                        with m.Else():
                            m.d.sync += [batch_loaded.eq(0), label_bad.eq(0), target_x.eq(0), up_n.eq(regs.arg.batch)]
                            m.d.comb += [writer.start.eq(1), writer.count.eq(batch_words),
                                         writer.final.eq(0), writer.beats.eq(beats_for(l0.lanes_in)),
                                         up_rows.start.eq(1)]
                            m.next = "upload"
                    with m.Elif(cmds["train"]):
                        with m.If(~batch_loaded):
                            m.d.comb += err_set["no_batch"].eq(1)
                        with m.Elif(n_loaded != B):
                            m.d.comb += err_set["batch"].eq(1)
                        with m.Else():
                            m.d.sync += batch_loaded.eq(0)
                            m.next = "train_go"
                    with m.Elif(cmds["infer"]):  # the eval forward pass over all B rows (past n: stale, ignored)
                        with m.If(~batch_loaded):
                            m.d.comb += err_set["no_batch"].eq(1)
                        with m.Else():
                            m.d.sync += batch_loaded.eq(0)
                            m.next = "infer_go"
                    with m.Else():  # readback / restore
                        with m.If(regs.arg.layer >= L):
                            m.d.comb += err_set["layer"].eq(1)
                        with m.Elif(~q_match | (cmds["restore"] & q_ro) | (cmds["readback"] & q_wo)):
                            m.d.comb += err_set["quantity"].eq(1)
                        with m.Else():
                            m.d.sync += [reader_beats.eq(sel_beats), go_write.eq(cmds["restore"])]
                            m.next = "host_go"
            # a readback or a restore starts a cycle after the command is accepted, from a state of its own (as a
            # step does from ``train_go``): the sequencer's and the writer's starts, the target registers and the
            # restore flag then load from one decode of the FSM state and registered selections, not from the idle
            # state's checks of the command and its arguments (that decode into the sequencer's synchronous reset
            # was 13.85 ns in the routed SMALL design at one nextpnr seed). A host transfer takes a cycle longer;
            # a step's cycles do not change.
            with m.State("host_go"):
                m.d.comb += [busy.eq(1), state_code.eq(Mux(go_write, 7, 6))]
                with m.If(abort):
                    m.next = "idle"
                with m.Else():
                    m.d.comb += host_enter.eq(1)
                    m.d.comb += [seq.start.eq(1), seq.write.eq(go_write), seq.count.eq(go_count),
                                 seq.inner_n.eq(go_inner), seq.space.eq(go_space)]
                    with m.If(go_write):
                        m.d.sync += restore_on.eq(1)
                        m.d.comb += [writer.start.eq(1), writer.count.eq(go_count), writer.final.eq(1),
                                     writer.beats.eq(reader_beats)]
                        m.next = "restore"
                    with m.Else():
                        m.next = "readback"
            # the first phase starts a cycle after the command is accepted, from a state of its own: its start and
            # activity then come from one decode of the FSM state, not from the idle state's checks of the command
            # (that decode into the units' start copies was the routed SMALL design's worst path, 13.5 ns); the
            # step's cycles are counted from here, so they do not change
            for go, first, code in (("train_go", 0, 2), ("infer_go", n_train, 10)):
                with m.State(go):
                    m.d.comb += [busy.eq(1), state_code.eq(code)]
                    with m.If(abort):
                        m.next = "idle"
                    with m.Else():
                        m.d.sync += [cycles.eq(0), counting.eq(1), ph.eq(first), training.eq(1), ph_start.eq(1)]
                        m.d.comb += [act_next[phases[first]].eq(1), start_next[phases[first]].eq(1)]
                        m.next = "train"
            with m.State("upload"):
                m.d.comb += [busy.eq(1), state_code.eq(1), uploading.eq(1)]
                with m.If(abort):
                    m.next = "idle"
                with m.Elif(writer.done):
                    with m.If(writer.error):
                        m.d.comb += err_set["framing"].eq(1)
                        m.next = "idle"
                    with m.Elif(~target_x):
                        m.next = "upload_labels"
                    with m.Else():
                        m.next = "upload_check"
            with m.State("upload_labels"):
                m.d.comb += [busy.eq(1), state_code.eq(1), uploading.eq(1)]
                m.d.sync += target_x.eq(1)
                m.d.comb += [writer.start.eq(1), writer.count.eq(up_n), writer.final.eq(1), writer.beats.eq(1)]
                m.next = "upload"
            with m.State("upload_check"):
                m.d.comb += [busy.eq(1), state_code.eq(1)]
                with m.If(label_bad):
                    m.d.comb += err_set["label"].eq(1)
                with m.Else():
                    m.d.sync += [batch_loaded.eq(1), n_loaded.eq(up_n)]
                    m.d.comb += done_set["upload"].eq(1)
                m.next = "idle"
            with m.State("train"):
                m.d.comb += [busy.eq(1), cur_layer.eq(phase_layer)]
                with m.Switch(ph):
                    for i, key in enumerate(phases):
                        with m.Case(i):
                            m.d.comb += state_code.eq({"fwd": 2, "rfwd": 2, "bwd": 4, "dx": 4, "upd": 5,
                                                       "undo": 5, "ifwd": 10}[key[0]])
                m.d.sync += ph_start.eq(0)
                with m.If(abort):
                    m.d.sync += [counting.eq(0), training.eq(0)]
                    m.d.comb += [act_next[k].eq(0) for k in phases]
                    m.next = "idle"
                with m.Elif(advance):
                    m.d.sync += [plog_addr.eq(ph), plog_data.eq(cycles + 1), plog_en.eq(1)]
                    # the one-hot activity moves on (off after the last phase of a train or an infer)
                    for i, key in enumerate(phases):
                        prev = act[phases[i - 1]] if i not in (0, n_train) else 0
                        m.d.comb += [act_next[key].eq(prev), start_next[key].eq(prev)]
                    with m.If(ph == n_train - 1):
                        m.d.sync += [counting.eq(0), training.eq(0), steps.eq(steps + 1)]
                        m.d.comb += done_set["train"].eq(1)
                        m.next = "idle"
                    with m.Elif(ph == n_ph - 1):
                        m.d.sync += [counting.eq(0), training.eq(0)]
                        m.d.comb += done_set["infer"].eq(1)
                        m.next = "idle"
                    with m.Else():
                        m.d.sync += [ph.eq(ph + 1), ph_start.eq(1)]
            with m.State("readback"):
                m.d.comb += [busy.eq(1), state_code.eq(6), reading.eq(1)]
                with m.If(abort):
                    m.d.comb += host_leave.eq(1)
                    m.next = "idle"
                with m.Elif(~seq.busy & ~ser.o.valid):
                    m.d.comb += [done_set["readback"].eq(1), host_leave.eq(1)]
                    m.next = "idle"
            with m.State("restore"):
                m.d.comb += [busy.eq(1), state_code.eq(7), restoring.eq(1)]
                with m.If(abort):
                    m.d.comb += host_leave.eq(1)
                    m.next = "idle"
                with m.Elif(writer.done):
                    with m.If(writer.error):
                        m.d.comb += [err_set["framing"].eq(1), host_leave.eq(1)]
                        m.next = "idle"
                    with m.Else():
                        m.next = "restore_drain"
            with m.State("restore_drain"):  # the last word may still be on its way into the unit
                m.d.comb += [busy.eq(1), state_code.eq(7), restoring.eq(1)]
                with m.If(~seq.busy & ~req_skid.o.valid):
                    m.d.comb += [done_set["restore"].eq(1), host_leave.eq(1)]
                    m.next = "idle"
        with m.If(host_leave):
            m.d.sync += restore_on.eq(0)
        with m.If(busy & any_cmd & ~abort):
            m.d.comb += err_set["busy"].eq(1)
        m.d.comb += [writer.abort.eq(abort), seq.abort.eq(abort)]

        for pmux in {id(p): p for p in ports.values()}.values():  # (scratch may share YDX's ports)
            pmux.emit(m)
        self.debug = {"training": training, "ph": ph, "cycles": cycles, "done": done, "act": act, "wm": wm,
                      "rng": rng, "bnp": bnp, "po2b": po2b, "po2": po2, "bnb": bnb, "bnf": bnf}
        return m

    def _phase_reg(self, keys, name: str, *, start: bool = False):
        """A register equal, a cycle later, to the OR of the controller's phase registers ``act[k]`` (``k`` in
        ``keys``; with ``start``: of their start pulses), a flip-flop of the caller's own. The units therefore run
        a phase one cycle behind the controller (one cycle of ``cycle_model.PHASE_OVERHEAD``), and each copy loads
        from flip-flops alone: a copy of one phase is FF -> FF, of several FF -> OR -> FF. (Copies loaded from the
        controller's next value, one comb net of the FSM state, ``advance`` and ``abort``, put that net across the
        die: 13.34 ns, 11.9 of it routing, in the routed SMALL design at seed 1.) The copies, and the phase
        registers themselves, are marked ``streams.KEEP``, or the synthesis would merge those of equal inputs back
        into one flip-flop."""
        m = self._m
        reg = Signal(name=name, attrs=KEEP)
        src = [(self._start if start else self._act)[k] for k in keys]
        m.d.sync += reg.eq(Cat(*src).any() if src else 0)
        return reg

    def _group_slice(self, sub, kind: str, j: int, shape):
        """``(slice, first)``: the registered slice (a :class:`SkidBuffer` in the skid form, its payload straight
        from a register) named ``{kind}_skid<layers>`` that the layers of layer ``j``'s BN unit group share, made
        on its first call; ``first`` says this call made it (that layer drives the payload, the same for every
        layer of the group)."""
        grp = next(g for g in self._bn_groups if j in g)
        first = (kind, grp) not in self._group_slices
        if first:
            self._group_slices[kind, grp] = sub(f"{kind}_skid" + "_".join(map(str, grp)),
                                                SkidBuffer(shape=shape, ring=False))
        return self._group_slices[kind, grp], first

    def _phase_pair(self, key, prefix: str | None = None):
        """``(activity, start)`` of phase ``key`` as registers of one caller's own (:meth:`_phase_reg`, named
        ``{prefix}{j}`` and ``{prefix}_start{j}``; by default the phase wiring's, ``{kind}_any``): the controller's
        phase registers then reach only the controller (docs/architecture.md, "Timing discipline")."""
        prefix = prefix or f"{key[0]}_any"
        return (self._phase_reg([key], f"{prefix}{key[1]}"),
                self._phase_reg([key], f"{prefix}_start{key[1]}", start=True))

    def _port_phase(self, keys, port: str):
        """The phase activity of ``keys`` for the callers of one memory port (``port``): a copy of the phase
        registers of its own (:meth:`_phase_reg`), one per port and phases, so that the port's caller chain starts
        at a flip-flop the placer can put beside the port, not at the phase register every unit of the phase loads
        (the routed SMALL design at seed 3: ``act_bwd1`` -> the YDX read address of its 38 distributed-RAM
        slices, 15.3 ns, 14.1 of it routing)."""
        tag = (port, tuple(keys))
        if tag not in self._port_phases:
            self._port_phases[tag] = self._phase_reg(keys, f"{port}_" + "_".join(f"{k[0]}{k[1]}" for k in keys))
        return self._port_phases[tag]

    def _shared(self, m, sub, name, groups, active, make):
        """One unit per group of layers (``make(group)``). A layer alone talks to its
        unit directly; the layers of a group each get a facade (an interface of the unit's signature): its
        outputs always follow the unit; its 1-bit inputs (valid, ready, enables, pulses) reach the unit only
        while the layer is ``active`` (0 otherwise), its wider inputs (payloads, addresses) too, except that
        while no layer is active the unit sees the group's first layer's (no gating logic on wide paths)."""
        out = {}
        for grp in groups:
            unit = sub(name + "_".join(map(str, grp)), make(grp))
            self.unit_names.append(name + "_".join(map(str, grp)))
            if len(grp) == 1:
                out[grp[0]] = unit
                continue
            for i, j in enumerate(grp):
                out[j] = self._facade(m, unit, f"{name}{j}", i == 0, active[j])
        return out

    @staticmethod
    def _facade(m, unit, path: str, first: bool, active):
        """An interface of ``unit``'s signature for one of its users: outputs follow the unit; 1-bit inputs
        (valid, ready, enables, pulses) reach it only while ``active``; wider inputs (payloads, addresses, data)
        too, except that the ``first`` user's are the default while no user is active (no gating logic on wide
        paths: they only count with a 1-bit valid / enable / pulse)."""
        sig = unit.signature
        facade = sig.create(path=(path,))
        for (_, member, uval), (_, _, fval) in zip(sig.flatten(unit), sig.flatten(facade), strict=True):
            if member.flow == wiring.Out:
                m.d.comb += fval.eq(uval)
            elif Value.cast(uval).shape().width > 1 and first:
                m.d.comb += uval.eq(fval)
            else:
                with m.If(active):
                    m.d.comb += uval.eq(fval)
        return facade

    def _shared_state(self, m, sub, name, groups, active, make):
        """Like :meth:`_shared` for units that take the layer at their ``layer`` input (per-layer state or
        geometry; a unit of one layer has none): layer ``j``'s facade drives ``layer`` with ``j``'s position
        in its group and owns the unit while ``active(j)``."""
        act = {}
        for grp in groups:
            for j in grp:
                act[j] = Signal(name=f"{name}_act{j}")
                m.d.comb += act[j].eq(active(j))
        out = self._shared(m, sub, name, groups, act, make)
        for grp in groups:
            if len(grp) > 1:
                for i, j in enumerate(grp):
                    m.d.comb += out[j].layer.eq(i)
        return out

    def _pooled(self, m, sub, name, params: tuple, make, active):
        """A facade of the one ``make()`` unit per ``(name, params)``, shared by every caller (the same phase of
        different layers, which never overlap; the unit restarts with each phase's ``start``). Wiring as in
        :meth:`_shared`: outputs follow the unit, the first caller's wide inputs are the default, every other
        input reaches the unit while ``active``. Used for the per-phase buffer readers, which would otherwise be
        built once per layer."""
        key = (name, params)
        if key not in self._pool:
            n = sum(1 for k in self._pool if k[0] == name)
            self._pool[key] = [sub(f"{name}_pool{n}", make()), 0]
        unit, uses = self._pool[key]
        self._pool[key][1] += 1
        return self._facade(m, unit, f"{name}_use{len(self._pool)}_{uses}", uses == 0, active)

    # ---- host targets -----------------------------------------------------------------------------------------
    def _connect_targets(self, m, plan, hreq, seq, targets, tsel, here_regs, host_on, wm, rng, bnp, host_sel, mems,
                         ports):
        """The host requests ``hreq`` (the sequencer's, through a registered slice) and the responses into ``seq``
        to and from the selected target: ``tsel[ti]`` (a register) is high for the chosen target, ``here_regs[ti]``
        (a register) while the sequencer owns it."""
        req = hreq.payload
        resp_valid = Signal()
        resp_data = Signal(len(seq.resp.payload))
        req_ready = Signal()
        chosen = []  # per target: (valid, data, ready) where it is the chosen one, else 0
        for ti, t in enumerate(targets):
            here = here_regs[ti]
            if t[0] == "wm":
                u = wm[t[1]]
                hp = u.host.payload
                m.d.comb += host_sel[("wm", t[1])].eq(here)
                m.d.comb += [
                    u.host.valid.eq(here & hreq.valid),
                    hp.write.eq(req.write), hp.space.eq(req.space), hp.lane.eq(req.inner), hp.addr.eq(req.outer),
                    hp.data.eq(req.data),
                    u.host_rdata.ready.eq(here & seq.resp.ready),
                ]
                rv, rd, rr = u.host_rdata.valid, u.host_rdata.payload, u.host.ready
            elif t[0] == "rng":
                u = rng[t[1]]
                hp = u.host.payload
                m.d.comb += host_sel[("rng", t[1])].eq(here)
                m.d.comb += [
                    u.host.valid.eq(here & hreq.valid),
                    hp.write.eq(req.write), hp.addr.eq(req.outer), hp.data.eq(req.data),
                    u.host_rdata.ready.eq(here & seq.resp.ready),
                ]
                rv, rd, rr = u.host_rdata.valid, u.host_rdata.payload, u.host.ready
            elif t[0] == "bnp":
                u = bnp[t[1]]
                hp = u.host.payload
                m.d.comb += host_sel[("bnp", t[1])].eq(here)
                m.d.comb += [
                    u.host.valid.eq(here & hreq.valid),
                    hp.write.eq(req.write), hp.space.eq(req.space), hp.outer.eq(req.outer), hp.data.eq(req.data),
                    u.host_rdata.ready.eq(here & seq.resp.ready),
                ]
                rv, rd, rr = u.host_rdata.valid, u.host_rdata.payload, u.host.ready
            else:  # a plain memory: the logits buffer, the phase log or the labels (classes after an infer)
                rp = mems[t[0]]
                depth = {"logits": plan.batch * plan.loss_groups, "labels": plan.batch}.get(
                    t[0], len(plan.phases()) + len(plan.infer_phases()))
                tgt = m.submodules[f"{t[0]}_target"] = MemoryTarget(outer=depth, inner=1, width=len(rp.data))
                m.d.comb += [
                    tgt.req.valid.eq(here & hreq.valid),
                    tgt.req.payload.write.eq(req.write), tgt.req.payload.outer.eq(req.outer),
                    tgt.resp.ready.eq(here & seq.resp.ready),
                    tgt.r_data.eq(rp.data),
                ]
                ports[{"logits": "lgb_r", "labels": "lab_r"}.get(t[0], "plog_r")].add(here, addr=tgt.r_addr,
                                                                                        en=tgt.r_en)
                rv, rd, rr = tgt.resp.valid, tgt.resp.payload, tgt.req.ready
            chosen.append((Mux(tsel[ti], rv, 0), Mux(tsel[ti], rd, 0), Mux(tsel[ti], rr, 0)))
        # the chosen target's response and ready as an AND-OR tree of the one-hot ``tsel`` (an if on each select
        # in turn made a chain as long as the targets: the SMALL design's routed worst path at one nextpnr seed,
        # ``tgt8_chosen`` -> four LUTs across the die -> the sequencer's response register, 15.5 ns)
        m.d.comb += [resp_valid.eq(or_tree([c[0] for c in chosen])), resp_data.eq(or_tree([c[1] for c in chosen])),
                     req_ready.eq(or_tree([c[2] for c in chosen]))]
        m.d.comb += [
            seq.resp.valid.eq(host_on & resp_valid),
            seq.resp.payload.eq(resp_data),
            hreq.ready.eq(host_on & req_ready),
        ]

    def _sub(self, name, unit):
        self._m.submodules[name] = DomainRenamer({"sync": "units"})(unit)
        return unit

    def _wide(self, m, active, pairs):
        """Drive wide inputs (payloads, data) of a unit that several layers' phases share: the first phase to
        drive an input is its default while no phase is active, the others take it over while active (as in
        :meth:`_facade`: no gating logic on wide paths; they only count with a 1-bit valid or enable)."""
        for target, value in pairs:
            key = id(target)
            if key in self._wide_driven:
                with m.If(active):
                    m.d.comb += target.eq(value)
            else:
                self._wide_driven.add(key)
                m.d.comb += target.eq(value)
