# amaranth: UnusedElaboratable=no
"""Cycle model of one training step of the generated accelerator (rtl_gen.top).

The step is the controller's sequence of phases (:meth:`rtl_gen.top.SystemPlan.phases`); each phase's
cycles follow from the cycle models of the units that run in it (their ``cycles`` methods) and the
rates of the buffers that feed them. Overlaps inside a phase are modelled (the BN forward unit's pass 1
runs at the XNOR engine's rate, the po2 unit's prologue overlaps the BN backward pass, the weight update
sweep consumes dW tiles as they come); phases never overlap. The model is checked against the cycle
count the RTL reports (``cycles`` register, and the per-phase log) in tests/rtl_gen/test_system.py.

:func:`step_cycles` returns a :class:`CycleReport` with the cycles per phase, per step and per training
image (the step amortised over the batch), and of an ``infer`` command (:func:`infer_cycles`) and per
inferred image.

The units built here only answer ``cycles()`` and are never elaborated; the first line tells Amaranth not to warn
about that, also for a unit whose constructor refused its parameters (a warning at garbage collection, whenever
that happens, would otherwise land in the middle of the command's error output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CycleReport", "conv_dx_cycles", "conv_forward_cycles", "conv_layer_forward_cycles", "conv_update_cycles",
           "infer_cycles", "step_cycles"]

#: Controller cycles per phase besides the units' own (the phase's registered copies a cycle behind the controller,
#: the start pulse, done detection, the registered advance).
PHASE_OVERHEAD = 5

#: ``ifwd`` of the output layer: cycles after the logit unit's last beat until the phase is done.
INFER_TAIL = 0

#: ``ifwd``: cycles from a channel's entry into the BN forward unit's stats queue (EPI3 in evaluation mode, no
#: division) to its beat (the queue's write, then its registered output).
STATS_QUEUE_DELAY = 2

#: ``bwd``: the per-channel ``S'`` reaches the po2 unit's prologue, and the scratch words its second pass, through
#: registered readers (``MemoryReader(registered=True)``: one cycle more than the read port; ``S'`` goes into the
#: normaliser's arithmetic at once).
SEFF_STAGE = 1

#: ``upd``: the dW operands reach the po2 backward engine through a registered tile reader
#: (``TileReader(registered=True)``: a skid buffer, one cycle; the buffers' read enables from its flip-flops).
TILE_STAGE = 1

#: ``upd`` with ``hw.dw_window``: the operands rewritten by the code window are registered again before the engine
#: (a skid buffer, one cycle).
WINDOW_STAGE = 1

#: ``fwd`` / ``rfwd`` / ``ifwd``: the rows of ``X`` reach the XNOR engine from a registered reader
#: (``RowReader(registered=True)``: a prefetch queue, one cycle; the sample banks' read enables from its flip-flops).
ROWS_STAGE = 1

#: ``dx``: the codes reach the po2 backward engine from a registered reader (``RowReader(registered=True)``: a
#: prefetch queue, one cycle; the code buffers read every cycle).
CODES_STAGE = 1


@dataclass
class CycleReport:
    phases: dict = field(default_factory=dict)  # "fwd0" -> cycles
    step: int = 0
    batch: int = 1
    infer: int = 0  # cycles of an infer command (any number of samples up to the batch)

    @property
    def per_image(self) -> float:
        return self.step / self.batch

    @property
    def infer_per_image(self) -> float:
        """Cycles per inferred image with full batches."""
        return self.infer / self.batch

    def to_dict(self) -> dict:
        return {"phases": dict(self.phases), "step": self.step, "per_image": round(self.per_image, 1),
                "batch": self.batch, "infer": self.infer, "infer_per_image": round(self.infer_per_image, 1)}

    def format_text(self) -> str:
        lines = [f"cycles per training step: {self.step:,} ({self.per_image:,.0f} per image, batch {self.batch})"]
        if self.infer:
            lines.append(f"cycles per infer: {self.infer:,} ({self.infer_per_image:,.0f} per image with full batches)")
        for k, v in self.phases.items():
            lines.append(f"  {k:<8} {v:>10,}  ({100 * v / max(self.step, 1):4.1f} %)")
        if any(k.startswith("undo") for k in self.phases):
            lines.append("  (hw.switch_undo: an upper bound; the undo sweeps run only when the re-run's loss rose)")
        return "\n".join(lines)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def forward_cycles(plan, j: int, *, infer: bool = False) -> int:
    """``fwd j``: engine (its rate paces BN pass 1), the rest of BN forward, the running-statistics unit's
    rate on the per-channel stats (and the logit unit's for the output layer), then logits and loss.

    ``infer`` (``ifwd j``): the same passes in evaluation mode: the thresholds without divisions (six cycles
    a channel), the per-channel constants without ``alpha`` or a running update (two cycles a channel), the
    logits without the loss unit."""
    from .bn_unit import BN_FWD_ACC_STAGES, STATS_OUT_STAGE, THR_WRITE_STAGES, BnForwardUnit, epi3_responses
    from .loss_unit import LOGIT_LATENCY, LOSS_TOTALS_STAGE, OutputGeometry

    lp = plan.layers[j]
    cfg = plan.cfg
    B, G, M = plan.batch, lp.groups, lp.n_out
    # BN pass 1 ends its stages after the engine's last beat: the compare stage, then the accumulators' write
    engine = lp.geometry.cycles(B) + BN_FWD_ACC_STAGES + ROWS_STAGE
    bn = BnForwardUnit(layer=plan.bn_unit_layer(j), div_steps=cfg.hw.div_steps).cycles()
    from .controller import RUNNING_LATENCY, STATS_IN_STAGE

    resp = epi3_responses(plan.bn_unit_layer(j), cfg.hw.div_steps)
    if infer:
        out = engine + 1 + bn["epi1"] + bn["pass2"] + (G + 6 * M + THR_WRITE_STAGES) + bn["pass3"]
        if not lp.top:  # a group's read, then two cycles a channel; the last beat through the stats queue
            return out + G + 2 * M + STATS_QUEUE_DELAY + STATS_OUT_STAGE + PHASE_OVERHEAD
        geo = OutputGeometry.from_config(cfg, lanes=plan.loss_lanes, div_steps=cfg.hw.div_steps)
        # the first group's read and channel read, then the logit unit's pace (later groups' reads hide in it);
        # measured: 784-12-10 (two groups) and the paper's MLP (one group)
        return out + 2 + STATS_QUEUE_DELAY + STATS_OUT_STAGE + geo.logit_cycles() + INFER_TAIL + PHASE_OVERHEAD
    out = engine + 1 + bn["epi1"] + bn["pass2"] + bn["epi2"] + bn["pass3"]
    if lp.top:
        geo = OutputGeometry.from_config(cfg, lanes=plan.loss_lanes, div_steps=cfg.hw.div_steps)
        # the first stats beat with channel 0's response, one more cycle, then the channels at the logit unit's
        # pace (slower than EPI3's)
        out += resp[0] + 1 + STATS_OUT_STAGE + M * max(geo.channel_cycles(), 5)
        # third Y replay -> logits -> loss; the loss unit's per-sample period paces it for cross-entropy (from the
        # first logit, LOGIT_LATENCY cycles after the first Y; the loss unit's done LOSS_TOTALS_STAGE later)
        out += max(geo.logit_cycles() - M * geo.channel_cycles() + 4,
                   geo.loss_cycles(B) + LOGIT_LATENCY + LOSS_TOTALS_STAGE)
    else:
        # a hidden layer's stats beats go to the running-statistics pipeline, a beat a cycle: EPI3 paces them,
        # and the phase ends when the last channel's update is written
        out += resp[-1] + 1 + STATS_OUT_STAGE + STATS_IN_STAGE + RUNNING_LATENCY
    return out + PHASE_OVERHEAD


def backward_cycles(plan, j: int) -> int:
    """``bwd j``: BN backward pass 1 and its per-channel epilogue (the po2 prologue runs alongside), pass 2
    feeding po2 pass 1, the bias, po2 pass 2 writing the codes."""
    from .bn_unit import BN_BWD_Q_STAGES, BnBackwardUnit
    from .po2_unit import Po2Unit

    cfg = plan.cfg
    lay = plan.bn_unit_layer(j)
    # BN backward's pass 2 (Q) runs at the po2 unit's first-pass rate: the same lanes per cycle
    bnb = BnBackwardUnit(layer=lay, pass2_lanes=plan.po2_lanes(lay.lanes)).cycles()
    po2 = Po2Unit(layer=lay, mul_steps=cfg.hw.mul_steps, pass1_lanes=plan.po2_lanes(lay.lanes)).cycles()
    # the Q pipeline's stages delay the first q beat; while the po2 prologue is longer they fill and cost nothing
    first = max(bnb["pass1"] + bnb["epi"] + BN_BWD_Q_STAGES, SEFF_STAGE + po2["pro"])
    pass2 = bnb["pass2"] - BN_BWD_Q_STAGES
    return first + max(pass2, po2["pass1"]) + po2["bias"] + SEFF_STAGE + po2["pass2"] + 4 + PHASE_OVERHEAD


def dx_cycles(plan, j: int) -> int:
    """``dx j``: the dX engine (``rows * depth * dx_passes``), unless cutting each pass's beat of ``ls`` values into
    the BN beats of layer ``j-1`` (``ls / lo'`` cycles per beat) is slower; on the dW array
    (:meth:`~rtl_gen.po2_backward.Po2Geometry.array_dx_cycles`) the whole batch in blocks of samples."""
    lp = plan.layers[j]
    if plan.po2_array(j):  # on the dW array, which writes the buffer words itself
        return plan.po2_geometry(j).array_dx_cycles() - 1 + PHASE_OVERHEAD
    below = plan.layers[j - 1]
    B, W, G = plan.batch, lp.words, lp.groups
    ls = lp.lanes_in // lp.dx_passes
    r = max(1, ls // below.lanes_out)
    per_word = lp.dx_passes * max(G, r)
    from .po2_backward import DX_LATENCY

    return B * W * per_word + DX_LATENCY + CODES_STAGE + (2 if ls > below.lanes_out else 1) + PHASE_OVERHEAD


def update_cycles(plan, j: int) -> int:
    """``upd j``: the dW tiles and the update sweep run together (the sweep takes one tile per bank row);
    the beta update runs alongside."""
    lp = plan.layers[j]
    sweep = lp.sweep
    g = lp.geometry
    per_row_sweep = sweep.visits / g.depth
    per_tile = (lp.tiles + 1) * lp.dw_passes  # dW cycles per bank row: per pass the beats and a finish cycle
    tail = 0
    if plan.po2_array(j):  # the array's passes last at least their drain (one cycle per lane and ARRAY_STAGES)
        from .po2_backward import ARRAY_STAGES

        per_tile = plan.dw_reads(j) * max(lp.tiles + 1, lp.lanes_out + ARRAY_STAGES)
        tail = lp.lanes_out + 1  # the last drain and the push
    per_row = max(per_tile, per_row_sweep)
    from .po2_backward import ARRAY_DW_LATENCY, DW_LATENCY
    from .weight_memory import LATENCY

    dw_latency = ARRAY_DW_LATENCY if plan.po2_array(j) else DW_LATENCY
    # the sweep's last visit drains LATENCY cycles
    tiles = int(g.depth * per_row) + per_tile + dw_latency - 1 + LATENCY + tail + TILE_STAGE
    if plan.cfg.hw.dw_window:
        tiles += WINDOW_STAGE
    from .controller import bn_param_cycles

    beta = bn_param_cycles(plan.bn_param_layer(j), plan.cfg.hw, plan.cfg.hw.div_steps)["update"]
    return max(tiles, beta) + 2 + PHASE_OVERHEAD


def undo_cycles(plan, j: int) -> int:
    """``undo j`` (``hw.switch_undo``): the ``UNDO`` sweep of layer ``j``'s weight memory, counted as if it runs
    (it runs only when the re-run's loss rose; otherwise the phase takes ``PHASE_OVERHEAD + 1`` cycles), so the
    step of a switch_undo configuration is an upper bound."""
    from .weight_memory import LATENCY

    return plan.layers[j].sweep.visits + LATENCY + 2 + PHASE_OVERHEAD


def step_cycles(plan) -> CycleReport:
    rep = CycleReport(batch=plan.batch)
    fn = {"fwd": forward_cycles, "rfwd": forward_cycles, "bwd": backward_cycles, "dx": dx_cycles,
          "upd": update_cycles, "undo": undo_cycles}
    for kind, j in plan.phases():
        rep.phases[f"{kind}{j}"] = int(fn[kind](plan, j))
    rep.step = sum(rep.phases.values()) + 2
    rep.infer = infer_cycles(plan)
    return rep


def infer_cycles(plan, n: int | None = None) -> int:
    """Cycles of an ``infer`` command (the ``cycles`` register): the phases ``ifwd 0 .. L-1``. The datapath always
    runs the whole built batch (rows past the ``n`` uploaded samples hold stale data and are ignored), so the
    count does not depend on ``n`` (1 .. B); per inferred image it is this over ``n``."""
    if n is not None and not 1 <= n <= plan.batch:
        raise ValueError(f"infer of {n} samples: the accelerator takes 1 .. {plan.batch} (its batch size)")
    return sum(forward_cycles(plan, j, infer=True) for _, j in plan.infer_phases())


def conv_forward_cycles(*, batch: int, channels: int, height: int, width: int, out_channels: int, lanes_in: int,
                        lanes_out: int, kernel: int = 3, padding: str = "valid") -> int:
    """Cycles of :class:`rtl_gen.conv_forward.ConvForward` (one conv layer's forward phase with max pooling) from
    ``start`` to the transfer of the batch's last ``Y`` beat, both included, with no backpressure.

    With ``K = ceil(N / lanes_in)`` words per window (``N = channels kernel^2``), ``G = ceil(out_channels /
    lanes_out)`` groups and ``T = K G`` engine cycles per window: the first output row starts after the
    generator's first read, the read port and ``kernel`` row loads (``kernel + 2``), with ``same`` padding after
    the ``kernel^2 + 1`` calibration windows (``(kernel^2 + 1) T + 1``) if later; each output row then takes
    ``Wo`` windows of ``T`` cycles, and the register window loads the next row's ``kernel`` rows after its last
    window's ``K`` words, so consecutive rows start ``(Wo - 1) T + max(T, K + kernel)`` apart; the last window
    leaves the engine ``T - 1 + LATENCY`` cycles after its first word."""
    from .xnor_engine import LATENCY

    n_in = channels * kernel * kernel
    K, G = _ceil(n_in, lanes_in), _ceil(out_channels, lanes_out)
    T = K * G
    pad = (kernel - 1) // 2 if padding == "same" else 0
    Ho, Wo = height + 2 * pad - kernel + 1, width + 2 * pad - kernel + 1
    first = kernel + 2 if not pad else max(kernel + 2, (kernel * kernel + 1) * T + 1)
    period = (Wo - 1) * T + max(T, K + kernel)
    return first + (batch * Ho - 1) * period + Wo * T + LATENCY


def conv_layer_forward_cycles(geometry) -> int:
    """Cycles of :class:`rtl_gen.conv_layer.ConvLayerForward` (one conv layer's whole forward phase with max pooling,
    for a :class:`rtl_gen.conv_layer.ConvLayerGeometry`) from ``start`` to the transfer of the last ``stats`` beat,
    both included, with no backpressure and ``beta`` offered whenever the BN unit takes it.

    The engine's pass (:func:`conv_forward_cycles`) is BN pass 1; then the BN unit's stages after the last ``Y``
    beat (:data:`rtl_gen.bn_unit.BN_FWD_ACC_STAGES` and one), EPI1, the two replays of the ``Y`` buffer (its reader
    holds the first word before each pass starts) with EPI2 between them, and EPI3
    (:func:`rtl_gen.bn_unit.forward_cycles`). With one group the BN unit takes a beat every other cycle: with one
    word a window (``T = 1``) it paces pass 1, which then ends ``2 (n - 1)`` cycles after the first ``Y`` beat
    (plus ``(B Ho - 1) (k - Wo)`` when rows of ``Wo < k`` windows come in bursts between their row loads).

    ``before_bn`` (BN over the pooled positions): pass 1 ends with the last pooled beat, which leaves with the ``Y``
    beat of its window's last position (row ``2 Hp - 1``, column ``2 Wp - 1``), rows of ``period`` cycles and
    windows of ``T`` before the engine's last; pooled beats come at most every other cycle, at BN's rate."""
    from .bn_unit import BN_FWD_ACC_STAGES, forward_cycles
    from .xnor_engine import LATENCY

    c = geometry.conv
    engine = conv_forward_cycles(batch=c.batch, channels=c.channels, height=c.height, width=c.width,
                                 out_channels=c.out_channels, lanes_in=c.lanes_in, lanes_out=c.lanes_out,
                                 kernel=c.kernel, padding=c.padding)
    K = _ceil(c.channels * c.kernel * c.kernel, c.lanes_in)
    if geometry.before_bn:
        # BN pass 1 takes the pooled beats: it ends with the last pooled position's (row 2 Hp - 1 of the last
        # image, column 2 Wp - 1), before the engine's last row and column where the pool drops some
        p, T = geometry.pooling, K * geometry.bn.groups
        period = (c.out_width - 1) * T + max(T, K + c.kernel)
        engine -= (c.out_height - p.out_height * p.pool) * period + (c.out_width - p.out_width * p.pool) * T
    elif geometry.bn.groups == 1 and K == 1:
        # a window a cycle, a beat every other cycle into BN: beat i is taken at max(e_i, a_(i-1) + 2), e_i its
        # time unstalled (row r, column v: e_0 + r (Wo + k) + v; the engine's output buffer absorbs the stalls);
        # the largest of e_i + 2 (n - 1 - i) is at v = 0 of the first row, or of the last when Wo < k
        pad = (c.kernel - 1) // 2 if c.padding == "same" else 0
        first = c.kernel + 2 if not pad else max(c.kernel + 2, (c.kernel * c.kernel + 1) + 1)
        rows = c.batch * c.out_height
        engine = (first + 1 + LATENCY + 2 * (geometry.positions - 1)
                  + max(0, (rows - 1) * (c.kernel - c.out_width)))
    bn = forward_cycles(geometry.bn, geometry.div_steps)
    return engine + BN_FWD_ACC_STAGES + 1 + sum(bn[k] for k in ("epi1", "pass2", "epi2", "pass3", "epi3"))


def conv_layer_backward_cycles(geometry, *, codes: bool = False) -> int:
    """Cycles of :class:`rtl_gen.conv_backward.ConvLayerBackward` (a pooled conv layer's max-pool backward routing
    and BN backward, for a :class:`rtl_gen.conv_layer.ConvLayerGeometry`) from the first ``x`` or ``pooled``
    transfer to the transfer of the last ``q`` beat, both included, with no gaps, no backpressure and ``alpha``
    offered whenever the BN unit takes it: the load of both buffers at once (``max(n G, B Hp Wp G)`` beats), one
    cycle to start the routed passes, then :func:`rtl_gen.bn_unit.backward_cycles` of the ``n`` positions.

    ``codes``: :class:`rtl_gen.conv_backward.ConvLayerBackwardCodes`, to the last ``codes`` transfer, with ``S'``
    offered from the first cycle: the po2 unit's PRO (``M (1 + iterations)``) runs during the load and BN's first
    pass (where it outlasts them and the start of BN's second pass, up to BN's first ``Q`` beat, every later beat
    waits as long), its PASS1 ends 4 cycles after the last ``Q`` beat, then FIN, BIAS and PASS2
    (:func:`rtl_gen.po2_unit.po2_cycles`). With ``before_bn`` (``n`` the pooled positions) the route of the codes
    to every position starts the cycle after PASS2's first code and gives one of the ``B Ho Wo G`` beats a
    cycle."""
    from .bn_unit import backward_cycles
    from .conv_backward import po2_layer
    from .po2_unit import po2_cycles

    c, p = geometry.conv, geometry.pooling
    load = max(geometry.beats, c.batch * p.out_height * p.out_width * geometry.bn.groups)
    bwd = backward_cycles(geometry.bn)
    total = load + 1 + bwd["total"]
    if not codes:
        return total
    po2 = po2_cycles(po2_layer(geometry.bn))
    # BN's first Q beat leaves pass2 - n G cycles into its second pass; a PRO still running then holds it back
    late = max(0, po2["pro"] - (load + 1 + bwd["pass1"] + bwd["epi"] + bwd["pass2"] - geometry.beats))
    codes_end = total + late + po2["pass1"] - geometry.beats + po2["bias"] + po2["pass2"]
    if geometry.before_bn:  # the route follows the codes (one a cycle) from the cycle after the first
        return codes_end - geometry.beats + 1 + geometry.conv_beats
    return codes_end


def conv_update_cycles(geometry) -> int:
    """Cycles of :class:`rtl_gen.conv_update.ConvUpdate` (``sgn(dW)`` of a conv layer, for a
    :class:`rtl_gen.conv_update.ConvUpdateGeometry`) from ``start`` to the transfer of the last ``dw`` beat, both
    included, with no backpressure.

    The window generator starts the cycle after ``start`` and its first read leaves the map's read port a cycle
    later (3 cycles to the first row load); then the ``G K P`` sweeps over the map (one per tile and pass of the
    dW unit) follow one another without a gap (the generator restarts while the register window emits the last
    row's windows), each ``B Ho`` output rows of ``k`` row loads and ``Wo`` windows, one a cycle (with ``same``
    padding each window twice: ``copies``); the dW unit's finish slot after a pass's last window falls in the next
    row loads. The last tile's beat leaves :data:`rtl_gen.po2_backward.DW_LATENCY` cycles after its last window."""
    from .po2_backward import DW_LATENCY

    c = geometry.conv
    row = c.kernel + geometry.copies * c.out_width
    return 3 + geometry.sweeps * c.batch * c.out_height * row + DW_LATENCY


def conv_dx_cycles(geometry) -> int:
    """Cycles of :class:`rtl_gen.conv_dx.ConvDx` (``dX`` of a conv layer, the transposed convolution of its codes,
    for a :class:`rtl_gen.conv_dx.ConvDxGeometry`): the cycle of the last ``dx`` transfer counted from ``start``'s
    (cycle 0), with no backpressure.

    The generator reads every code row as ``RW = Wo G`` buffer beats, one a cycle; the first row is packed
    ``RW + 2`` cycles after ``start``. Per dX row: the register window loads its ``k`` rows (the first one already
    packed, each further one ``RW`` cycles), then emits its ``W`` windows, each taken after the engine's ``G'`` code
    beats and the next offered when the engine has run the window's ``K' G'`` cycles; it takes the next dX row's
    first row when the last window leaves, if the packer has it (``k RW`` cycles after it took the previous first
    row). The engine's last ``dx`` beat leaves :data:`rtl_gen.po2_backward.DX_LATENCY` cycles after its last
    window's ``K' G'`` cycles."""
    from .po2_backward import DX_LATENCY

    k, W, RW = geometry.kernel, geometry.width, geometry.row_words
    G2 = geometry.po2.bank.groups
    per = geometry.words * G2  # engine cycles a window
    load = geometry.row_words + 2  # the cycle the window takes a dX row's first row
    free = 0  # the first cycle the engine takes a new window
    for _ in range(geometry.batch * geometry.height):
        first = max(load + (k - 1) * RW + 1, free)  # the row's first window's first code beat
        free = first + W * per
        load = max(first + (W - 1) * per + G2, load + k * RW)
    return free + DX_LATENCY - 1
