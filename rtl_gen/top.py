"""The top-level accelerator: host interface, controller, buffers and the datapath units the layers share.

See docs/architecture.md for the block diagram and the reasons behind it. In short:

- host interface: AXI4-Lite registers (:func:`rtl_gen.controller.build_regmap`, exported as JSON) and
  one 32-bit AXI-Stream in each direction (``s_axis``: batches and restores, ``m_axis``: read-backs),
  meant for one Xilinx AXI DMA on a Zynq HP port;
- :class:`SystemPlan`: everything the configuration decides (layer geometries, lanes, widths, the
  quantities the host can read back / restore and their stream layouts), in plain Python; the host
  description (``accelerator.json``) is derived from it;
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from host.driver import HASH_REGISTER, AcceleratorDescription, QuantityLayout, description_hash
from sim.hw.arith import ArithParams, loss_grad_scale
from sim.hw.optim import PROB_BITS
from sim.hw.widths import derive_widths, hw_supported
from sim.hw_config import layer_lanes
from sim.schema import ConfigError

from .axil import AXI4LiteCSR, AXI4LiteSignature, vivado_ports
from .bn_unit import BnBackwardUnit, BnForwardUnit, BnLayer, merge_bounds
from .buffers import (
    BEAT_BITS,
    BeatWriter,
    HostSequencer,
    MemoryReader,
    MemoryTarget,
    RowReader,
    RowWriter,
    SplitMemory,
    TileReader,
    WordSerializer,
    beats_for,
    fork,
    next_sample_row,
)
from .controller import (
    SPACE_A,
    SPACE_BETA,
    SPACE_E,
    SPACE_M,
    SPACE_MU,
    SPACE_S,
    BnParamUnit,
    bn_param_sizes,
    build_regmap,
)
from .loss_unit import LossGradUnit, OutputGeometry, OutputLogitUnit
from .po2_backward import Po2Backward, Po2Geometry, array_mode
from .po2_unit import Po2Unit
from .rng import RngEngine, RngGeometry
from .weight_memory import UNDO, UPDATE, OptimizerSpec, SweepGeometry, WeightMemory, WeightMemoryGeometry
from .xnor_engine import XnorEngineCore, XnorGeometry

__all__ = ["PORT_ATTRS", "Accelerator", "LayerPlan", "SystemPlan", "TOP_NAME", "top_ports"]

TOP_NAME = "xnortrain_top"
E_WIDTH = 16


@dataclass(frozen=True)
class LayerPlan:
    """One weight layer's hardware: sizes, lanes and the geometries of its units."""

    index: int
    n_in: int
    n_out: int
    lanes_in: int  # li: input bits per engine word
    lanes_out: int  # lo: channels per beat (engine, BN, po2, dX)
    lanes_b: int  # samples per dW beat
    update_lanes: int  # weights per update visit
    batch: int
    top: bool
    widths: dict = field(default_factory=dict)
    dw_passes: int = 1  # dW passes per tile
    dx_passes: int = 1  # dX passes per input word

    @property
    def geometry(self) -> XnorGeometry:
        return XnorGeometry(n_in=self.n_in, n_out=self.n_out, lanes_in=self.lanes_in, lanes_out=self.lanes_out)

    @property
    def sweep(self) -> SweepGeometry:
        return SweepGeometry(bank=self.geometry, update_lanes=self.update_lanes)

    @property
    def words(self) -> int:
        return self.geometry.words

    @property
    def groups(self) -> int:
        return self.geometry.groups

    @property
    def tiles(self) -> int:
        """dW beats per bank row: ``ceil(batch / lanes_b)``."""
        return -(-self.batch // self.lanes_b)

    @property
    def beats(self) -> int:
        """Beats of one batch pass in BN order: ``batch * groups``."""
        return self.batch * self.groups


@dataclass
class HostQuantity:
    """A quantity on the host path: its stream layout, the unit that holds it (``target``: ``("wm", j)``,
    ``("rng", j)``, ``("bnp", j)``, ``("logits",)``), the unit's storage ``space``, the number of accesses
    (``count``), ``inner`` positions per outer address, and the word width."""

    layout: QuantityLayout
    target: tuple
    space: int
    count: int
    inner: int
    width: int


class SystemPlan:
    """What a configuration asks the hardware to be (pure Python; no Amaranth objects)."""

    def __init__(self, cfg, *, name: str = TOP_NAME):
        self.cfg = cfg
        self.name = name
        h = cfg.hw
        if not hw_supported(cfg):
            bad = next(s for s in cfg.layer_shapes() if not (s.spec.type == "dense" and s.spec.bn))
            raise ConfigError(f"model.layers[{bad.index}]: the RTL generator supports dense layers with bn = true "
                              f"only (got {bad.spec.type!r})")
        self.input_kind = h.input_kind(cfg)
        if self.input_kind != "binary":
            given = ("hw.input = 'int8'" if h.input == "int8" else
                     f"hw.input = 'auto' (int8 for model.input_format = {cfg.model.input_format!r})")
            raise ConfigError(f"{given}: the generated RTL has no 8-bit first-layer engine yet; "
                              "set hw.input = 'binary' (or model.input_format = 'binary'); "
                              "benchmarks/int8_first_layer.py estimates what an 8-bit first layer would cost")
        # switch_undo: after the update the batch runs forward again (running statistics, logits and the correct
        # count kept from the first run); if its integer loss rose, every layer's weights are copied back
        self.undo = h.optimizer == "switch" and bool(h.switch_undo)
        self.opt = OptimizerSpec.from_hw(h)
        self.batch = B = int(cfg.train.batch_size)
        self.classes = int(cfg.model.num_classes)
        self.p = ArithParams.from_config(cfg)
        wl = cfg.weight_layers()
        widths = derive_widths(cfg)
        L = len(wl)
        # every layer's lanes, checked when the configuration is loaded (sim.hw_config.layer_lanes)
        self.layers: list[LayerPlan] = []
        for j, (s, ln) in enumerate(zip(wl, layer_lanes(cfg), strict=True)):
            n_in, n_out = s.weight_shape
            self.layers.append(LayerPlan(j, n_in, n_out, ln.lanes_in, ln.lanes_out, ln.lanes_b, ln.update_lanes, B,
                                         j == L - 1, widths[j], ln.dw_passes, ln.dx_passes))
        self.features = self.layers[0].n_in
        top = self.layers[-1]
        # the logit and loss units work on loss_lanes classes per beat: the output layer's Y beats are split and
        # its gradient beats joined to lanes_out (the output layer is used once per step; few lanes are enough)
        self.loss_lanes = min(h.loss_lanes, top.lanes_out)
        self.loss_groups = -(-self.classes // self.loss_lanes)  # logit / gradient beats per sample
        # layers whose po2 backward engines have the same lanes, batch, code bits, x_max and passes share one
        # engine (their phases never overlap); the engine picks the layer's words, groups and padding at run time
        self.backward_groups = self._groups(self._backward_key)
        # the units without state between phases (XNOR engine, BN forward and backward, po2 unit) are shared by
        # the layers that need the same unit (equal geometry), e.g. the paper MLP's hidden layers 1 .. 3
        self.unit_groups = {
            "engine": self._groups(lambda j: (self.layers[j].lanes_in, self.layers[j].lanes_out)),
            "bn": self._groups(self._bn_key),
        }
        # the generator engines: one per group of layers with equal update lanes (the jump matrices)
        self.rng_groups = self._groups(lambda j: self.layers[j].update_lanes)
        # the weight memories: one per group of layers with equal lanes (bank words, banks, update lanes)
        self.wmem_groups = self._groups(lambda j: (self.layers[j].lanes_in, self.layers[j].lanes_out,
                                                   self.layers[j].update_lanes))
        self.label_bits = max(1, (self.classes - 1).bit_length())
        self.quantities: list[HostQuantity] = []
        self.kinds: dict[str, int] = {}
        self._declare_quantities()

    # -- unit geometries (shared by the generator and the cycle model) ----------------------------------------

    def bn_layer(self, j: int) -> BnLayer:
        return BnLayer.from_config(self.cfg, j, lanes=self.layers[j].lanes_out)

    def _bn_key(self, j: int) -> tuple:
        # channels (groups, the padding of the last group), fan-in and x_max only bound the loops and |y|:
        # the BN and po2 units take the layer's channel geometry at run time, and are built for the largest
        # bound (exact for any bound >= |y|), so layers of one batch and lanes share one unit
        b = self.bn_layer(j)
        return (b.batch, b.lanes)

    def bn_envelope(self, grp: list[int]) -> BnLayer:
        """The BN geometry of a shared BN / po2 unit: the group's layers agree on batch and lanes and differ in
        channels (the output layer's classes against 256), fan-in (the first layer's 784 inputs against 256) and
        the backward bounds (the gradient reaching the last hidden layer comes from the narrow output layer);
        the unit takes the largest of each bound, so every layer's values fit its registers, and the layer's
        channels at run time (its ``layer`` input). The one place a bound is used as a value, the threshold
        clamp to ``[-(y+1), y+1]``, gives the same signs and masks for any bound >= |y|."""
        return merge_bounds([self.bn_layer(j) for j in grp])

    def bn_group(self, j: int) -> list[int]:
        return next(grp for grp in self.unit_groups["bn"] if j in grp)

    def bn_unit_layer(self, j: int) -> BnLayer:
        """Layer ``j`` as the BN forward/backward and po2 units that serve it see it: its group's bounds (widths),
        its own channels (loops, cycles) and kind (output layer or not)."""
        env = merge_bounds([self.bn_layer(i) for i in self.bn_group(j)], channels=self.layers[j].n_out)
        return replace(env, top=self.layers[j].top)

    def bn_param_unit(self) -> BnParamUnit:
        """The one BN parameter unit of all layers (beta, its optimiser state and the running statistics of
        every layer in one set of memories; the layers' phases never overlap)."""
        return BnParamUnit(layers=[self.bn_layer(j) for j in range(len(self.layers))], hw=self.cfg.hw,
                           div_steps=self.cfg.hw.div_steps)

    def bn_param_layer(self, j: int) -> BnLayer:
        """Layer ``j`` as the shared BN parameter unit sees it: every bound the largest of all layers' (widths,
        divider), the layer's own channels (cycles)."""
        return merge_bounds([self.bn_layer(i) for i in range(len(self.layers))], channels=self.layers[j].n_out)

    def po2_lanes(self, lanes: int) -> int:
        """Lanes of the po2 unit's first-pass datapath for a unit of ``lanes`` lanes (``hw.po2_lanes``, at most
        ``lanes``)."""
        return min(self.cfg.hw.po2_lanes, lanes)

    def po2_geometry(self, j: int) -> Po2Geometry:
        lp = self.layers[j]
        return Po2Geometry.from_config(self.cfg, j, lanes_in=lp.lanes_in, lanes_out=lp.lanes_out, lanes_b=lp.lanes_b,
                                       dw_passes=lp.dw_passes, dx_passes=lp.dx_passes, dx_dsp=self._dx_dsp)

    @property
    def _dx_dsp(self) -> bool:
        """``hw.dx_dsp``, where every layer's array dX words (``lanes_in / dw_passes`` values) are the BN beats
        of the layer below (``lanes_out``): the array writes them straight into its buffer."""
        L = self.layers
        return self.cfg.hw.dx_dsp and all(L[j].lanes_in // L[j].dw_passes == L[j - 1].lanes_out
                                          for j in range(1, len(L)))

    def po2_array(self, j: int) -> bool:
        """Layer ``j``'s po2 backward engine computes dX and dW on one array (:func:`array_mode`)."""
        grp = next(g for g in self.backward_groups if j in g)
        return array_mode([self.po2_geometry(i) for i in grp])

    def _groups(self, key) -> list[list[int]]:
        """The layers partitioned by ``key(j)`` (equal keys: one group), in layer order."""
        out: list[list[int]] = []
        for j in range(len(self.layers)):
            for grp in out:
                if key(grp[0]) == key(j):
                    grp.append(j)
                    break
            else:
                out.append([j])
        return out

    def _backward_key(self, j: int) -> tuple:
        g = self.po2_geometry(j)
        return (g.bank.lanes_in, g.bank.lanes_out, g.batch, g.dy_bits, g.x_max, g.lanes_b, g.dw_passes, g.dx_passes,
                g.dx_dsp)

    def wmem_geometry(self, j: int) -> WeightMemoryGeometry:
        return WeightMemoryGeometry(sweep=self.layers[j].sweep, optimizer=self.opt)

    def rng_geometry(self, j: int) -> RngGeometry:
        return RngGeometry(sweep=self.layers[j].sweep, block=self.cfg.hw.rng_block)

    # -- quantities -----------------------------------------------------------------------------------------

    def _kind(self, name: str) -> int:
        return self.kinds.setdefault(name, len(self.kinds))

    def _add(self, name, layer, shape, *, target, space, count, inner, width, elem_bits, elems_per_word, pad=None,
             reshape=None, transpose=None, signed=False, encoding="int", access="rw", skip=False):
        n = math.prod(shape) if shape else 1
        pad = tuple(pad) if pad is not None else (tuple(shape) if shape else ())
        if reshape is None:
            reshape = (math.prod(pad) if pad else 1,)
            transpose = (0,)
        if not shape:
            pad, reshape, transpose = (), (1,), (0,)
        q = QuantityLayout(name, layer, self._kind(name), tuple(shape), elem_bits, elems_per_word, pad, reshape,
                           transpose, signed=signed, encoding=encoding, access=access, skip_pad_words=skip)
        assert q.words == count, (name, layer, q.words, count)
        del n
        self.quantities.append(HostQuantity(q, target, space, count, inner, width))

    def _declare_quantities(self):
        h = self.cfg.hw
        for lp in self.layers:
            j, g = lp.index, lp.geometry
            W, G, li, lo, U = g.words, g.groups, lp.lanes_in, lp.lanes_out, lp.update_lanes
            sweep = lp.sweep
            # weight banks: bank l, row grp * words + k holds w[k*li:(k+1)*li, grp*lo + l]; one access per (row, lane)
            self._add("w", j, (lp.n_in, lp.n_out), target=("wm", j), space=0, count=g.depth * lo, inner=lo,
                      width=li, elem_bits=1, elems_per_word=li, pad=(W * li, G * lo), reshape=(W, li, G, lo),
                      transpose=(2, 0, 3, 1), encoding="sign")
            # optimiser state, each field in its own space: one row of U values per visit of the update sweep
            # (padding visits skipped)
            chunks = li // U
            wm_geo = self.wmem_geometry(j)
            for fname, bits in self.opt.fields:
                if fname == "undo":  # lives within one step (written by UPDATE, read by UNDO): not state
                    continue
                self._add(fname, j, (lp.n_in, lp.n_out), target=("wm", j), space=wm_geo.field_space(fname),
                          count=sweep.visits, inner=1, width=U * bits, elem_bits=bits, elems_per_word=U,
                          pad=(W * li, G * lo), reshape=(W, chunks, U, G, lo), transpose=(3, 0, 4, 1, 2),
                          signed=True, skip=True)
            ng = RngGeometry(sweep=sweep, block=h.rng_block).generators
            self._add("rng", j, (ng,), target=("rng", j), space=0, count=ng, inner=1, width=32, elem_bits=32,
                      elems_per_word=1)
            if h.optimizer == "switch":
                self._add("switch_table", j, (h.switch_cutoff + 1,), target=("wm", j), space=2,
                          count=h.switch_cutoff + 1, inner=1, width=PROB_BITS + 1, elem_bits=PROB_BITS + 1,
                          elems_per_word=1, access="wo")
            bnp = bn_param_sizes(self.bn_param_layer(j), h)
            M = lp.n_out
            for name, space, bits, sgn in (("beta", SPACE_BETA, bnp["beta"], True),
                                           ("m_beta", SPACE_M, bnp["m"], True),
                                           ("a_beta", SPACE_A, bnp["a"], False),
                                           ("mu_r", SPACE_MU, bnp["running"], True),
                                           ("s_r", SPACE_S, bnp["running"], True)):
                self._add(name, j, (M,), target=("bnp", j), space=space, count=M, inner=1, width=bits,
                          elem_bits=bits, elems_per_word=1, signed=sgn)
            self._add("e_beta", j, (), target=("bnp", j), space=SPACE_E, count=1, inner=1, width=E_WIDTH,
                      elem_bits=E_WIDTH, elems_per_word=1, signed=True)
        top = self.layers[-1]
        nl, ng = self.loss_lanes, self.loss_groups
        self._add("logits", top.index, (self.batch, top.n_out), target=("logits",), space=0,
                  count=self.batch * ng, inner=1, width=nl * self.logit_width,
                  elem_bits=self.logit_width, elems_per_word=nl,
                  pad=(self.batch, ng * nl), reshape=(self.batch * ng * nl,),
                  transpose=(0,), signed=True, access="ro")

        # infer: the predicted class of every sample, written into the labels memory (the batch's labels are not
        # needed after an infer); rows past the uploaded samples hold stale classes
        self._add("classes", None, (self.batch,), target=("labels",), space=0, count=self.batch, inner=1,
                  width=self.label_bits, elem_bits=self.label_bits, elems_per_word=1, access="ro")

        n_ph = len(self.phases()) + len(self.infer_phases())  # the step's phases, then infer's
        self._add("phase_cycles", None, (n_ph,), target=("plog",), space=0, count=n_ph, inner=1, width=32,
                  elem_bits=32, elems_per_word=1, access="ro")

    @property
    def logit_width(self) -> int:
        """Bits of a logit in the logits buffer: a training or an eval logit (``OutputGeometry.out_width``)."""
        return OutputGeometry.from_config(self.cfg, lanes=self.loss_lanes).out_width

    def quantity(self, name: str, layer: int) -> HostQuantity:
        for hq in self.quantities:
            if hq.layout.name == name and hq.layout.layer == layer:
                return hq
        raise KeyError((name, layer))

    @property
    def targets(self) -> list[tuple]:
        out = []
        for hq in self.quantities:
            if hq.target not in out:
                out.append(hq.target)
        return out

    # -- batch format ---------------------------------------------------------------------------------------

    @property
    def batch_layout(self) -> QuantityLayout:
        lp = self.layers[0]
        w = lp.words * lp.lanes_in
        return QuantityLayout("x", None, 0, (self.batch, self.features), 1, lp.lanes_in, pad=(self.batch, w),
                              reshape=(self.batch, w), transpose=(0, 1), encoding="sign")

    @property
    def label_layout(self) -> QuantityLayout:
        return QuantityLayout("labels", None, 0, (self.batch,), self.label_bits, 1, pad=(self.batch,),
                              reshape=(self.batch,), transpose=(0,))

    @property
    def loss_bits(self) -> int:
        """Width of the loss unit's integer loss (registers ``loss`` and, past 32 bits, ``loss_hi``)."""
        return OutputGeometry.from_config(self.cfg, lanes=self.loss_lanes).loss_q_width

    @property
    def regmap(self):
        return self._regmap(self.desc_hash)

    def _regmap(self, desc_hash: int):
        return build_regmap(name=self.name, layers=len(self.layers), batch=self.batch, classes=self.classes,
                            input_int8=self.input_kind == "int8", optimizer=self.cfg.hw.optimizer,
                            quantity_kinds=max(len(self.kinds), 2), loss_bits=self.loss_bits, desc_hash=desc_hash)

    @property
    def desc_hash(self) -> int:
        """The ``id_hash`` register's value: :func:`host.driver.description_hash` of :meth:`description` (which
        leaves the register's own value out, so the description with the map built with 0 gives it)."""
        if getattr(self, "_desc_hash", None) is None:
            self._desc_hash = description_hash(self._description(self._regmap(0)))
        return self._desc_hash

    def description(self) -> AcceleratorDescription:
        return self._description(self.regmap)

    def _description(self, regmap) -> AcceleratorDescription:
        h = self.cfg.hw
        sched = {
            "optimizer": h.optimizer, "lr0": float(self.cfg.lr), "switch_lambda": h.switch_lambda,
            "switch_cutoff": h.switch_cutoff, "switch_sigma": h.switch_sigma,
            "switch_anneal": h.switch_anneal,
            "bop_shift": h.bop_shift, "iir_alpha_shift": h.iir_alpha_shift,
            "iir_max_decay_shift": h.iir_max_decay_shift, "alpha_decay": self.cfg.optimizer.iir.alpha_decay,
            "decay_factor": self.cfg.optimizer.iir.decay_factor, "decay_every": self.cfg.optimizer.iir.decay_every,
            "epochs": self.cfg.train.epochs, "arith": dict(vars(self.p)),
        }  # fmt: skip
        return AcceleratorDescription(
            name=self.name, regmap=regmap, batch=self.batch, classes=self.classes, input=self.input_kind,
            features=self.features, layers=[(lp.n_in, lp.n_out) for lp in self.layers],
            batch_layout=self.batch_layout, label_layout=self.label_layout,
            quantities=[hq.layout for hq in self.quantities], kinds=dict(self.kinds), schedule=sched,
            config=self.cfg.to_toml(),
        )

    def phases(self) -> list[tuple[str, int]]:
        """The controller's phases of one training step, in order."""
        L = len(self.layers)
        out = [("fwd", j) for j in range(L)]
        for j in reversed(range(L)):
            out.append(("bwd", j))
            if j > 0:
                out.append(("dx", j))
            out.append(("upd", j))
        if self.undo:  # the re-run of the forward pass, then the undo of each layer (skipped if the loss fell)
            out += [("rfwd", j) for j in range(L)] + [("undo", j) for j in range(L)]
        return out

    def infer_phases(self) -> list[tuple[str, int]]:
        """The controller's phases of an ``infer`` command: the forward pass of every layer in evaluation mode
        (``ifwd j``: the datapath of ``fwd j`` with the running BN statistics; nothing is updated)."""
        return [("ifwd", j) for j in range(len(self.layers))]


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


class _PortMux:
    """Drivers of one memory port from several phases: ``add(cond, **values)``; ``emit`` assigns them in an
    if/elif chain (conditions are mutually exclusive; the first listed wins)."""

    def __init__(self, port, name: str):
        self.port = port
        self.name = name
        self.cases: list[tuple] = []

    def add(self, cond, **values):
        self.cases.append((cond, values))

    def emit(self, m):
        first = True
        full = len(getattr(self.port, "en", Const(0, 1))) > 1  # a write port with lanes: en=1 writes all of them
        for cond, values in self.cases:
            if full and isinstance(values.get("en"), int) and values["en"] == 1:
                values = {**values, "en": Const(-1, len(self.port.en))}
            ctx = m.If(cond) if first else m.Elif(cond)
            with ctx:
                m.d.comb += [getattr(self.port, k).eq(v) for k, v in values.items()]
            first = False


class _PackedPort:
    """A narrow memory seen through a :class:`_PortMux` of a wider one: word ``a`` of the narrow memory is lane
    ``a mod n`` (``gran`` bits) of row ``base + a div n`` (``n`` a power of two; the wide write port has lanes of
    ``gran`` bits). ``add`` as a :class:`_PortMux`. The callers are multiplexed at the narrow width and reach the
    wide port as one caller (a write's data is replicated into every lane after the multiplexer, its lane
    enabled). ``port.data`` (read) is the lane of the last row read, which holds while no read is issued (the
    read port contract)."""

    def __init__(self, mux: _PortMux, *, base: int, n: int, gran: int, width: int, read: bool):
        self.mux, self.base, self.n, self.gran, self.width, self.read = mux, base, n, gran, width, read
        self.shift = n.bit_length() - 1
        self.cases: list[tuple] = []
        name = mux.name
        self.port = SimpleNamespace(data=Signal(width, name=f"{name}_packed_data"))
        self._any = Signal(name=f"{name}_packed_any")
        self._addr = Signal(len(mux.port.addr), name=f"{name}_packed_addr")
        self._en = Signal(name=f"{name}_packed_en")
        self._lane = Signal(range(max(n, 2)), name=f"{name}_packed_lane")
        if read:
            mux.add(self._any, addr=self._addr, en=self._en)
        else:
            self._data = Signal(width, name=f"{name}_packed_wdata")
            word = Cat(*([self._data, Const(0, gran - width)] * n))
            mux.add(self._any, addr=self._addr, data=word, en=Mux(self._en, Const(1, n) << self._lane, 0))

    def add(self, cond, addr, en, data=None):
        self.cases.append((cond, addr, en, data))

    def emit(self, m):
        lane = Signal.like(self._lane, name=f"{self.mux.name}_packed_next_lane")
        for i, (cond, addr, en, data) in enumerate(self.cases):
            with (m.If if i == 0 else m.Elif)(cond):
                m.d.comb += [self._any.eq(1), self._addr.eq(self.base + (addr >> self.shift)), self._en.eq(en),
                             lane.eq(addr[: self.shift] if self.shift else 0)]
                if not self.read:
                    m.d.comb += self._data.eq(data)
        if not self.read:
            m.d.comb += self._lane.eq(lane)
            return
        with m.If(self._any & self._en):
            m.d.sync += self._lane.eq(lane)
        with m.Switch(self._lane):
            for i in range(self.n):
                with m.Case(i):
                    m.d.comb += self.port.data.eq(self.mux.port.data[i * self.gran:i * self.gran + self.width])


class _OffsetPort:
    """One layer's view of a :class:`_PortMux` of a memory that holds every layer's words from ``base`` on:
    ``add`` offsets the address; ``port`` is the shared port (its data)."""

    def __init__(self, mux: _PortMux, base: int):
        self.mux, self.base = mux, base

    @property
    def port(self):
        return self.mux.port

    def add(self, cond, addr, **values):
        self.mux.add(cond, addr=addr + self.base, **values)

    def emit(self, m):
        pass  # the shared _PortMux assigns the port


class Accelerator(wiring.Component):
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
        return to_verilog(self, self._plan.name, ports=top_ports(self), emit_src=False, missing_domain=_sync_domain)

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

        def sub(name, unit):
            m.submodules[name] = ResetInserter({"sync": abort})(unit)
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
        act = {}
        start = {}
        done = {}
        for i, key in enumerate(phases):
            a = Signal(name=f"act_{key[0]}{key[1]}")
            s = Signal(name=f"start_{key[0]}{key[1]}")
            m.d.comb += [a.eq(training & (ph == i)), s.eq(a & ph_start)]
            act[key], start[key] = a, s
            done[key] = Signal(name=f"done_{key[0]}{key[1]}")

        # ---- per-layer units ---------------------------------------------------------------------------------
        po2b = {}
        self.unit_names = []  # the shared units' submodule names
        self._pool = {}  # (name, params) -> [unit, uses]: readers shared by the phases of several layers (_pooled)
        self._wide_driven = set()  # ids of shared units' wide inputs that already have a default driver (_wide)
        fwd_act = {lp.index: act[("fwd", lp.index)] | act.get(("rfwd", lp.index), 0) | act[("ifwd", lp.index)]
                   for lp in LP}
        bwd_act = {lp.index: act[("bwd", lp.index)] for lp in LP}
        upd_act = {lp.index: act[("upd", lp.index)] for lp in LP}
        # units that keep every layer's state (in their memories, one region per layer) and take the layer
        # at their ``layer`` input: one BN parameter unit for all layers, one generator engine per group of
        # layers with equal update lanes; the host reaches them through the same facades (host_sel, driven
        # by _connect_targets)
        host_sel = {(kind, lp.index): Signal(name=f"{kind}_host{lp.index}") for kind in ("bnp", "rng", "wm")
                    for lp in LP}
        # weight memories: layer j's is read in fwd j (XNOR engine) and dx j (po2 backward engine) and swept in
        # upd j; one memory (banks, state, sweep datapath) per group of layers with equal lanes
        wm = self._shared_state(m, sub, "wmem", plan.wmem_groups,
                                lambda j: (fwd_act[j] | act.get(("dx", j), 0) | upd_act[j] | act.get(("undo", j), 0)
                                           | host_sel[("wm", j)]),
                                lambda grp: WeightMemory(geometries=[plan.wmem_geometry(j) for j in grp]))
        bnp = self._shared_state(m, sub, "bn_param", [[lp.index for lp in LP]],
                                 lambda j: fwd_act[j] | bwd_act[j] | upd_act[j] | host_sel[("bnp", j)],
                                 lambda grp: plan.bn_param_unit())
        rng = self._shared_state(m, sub, "rng", plan.rng_groups, lambda j: upd_act[j] | host_sel[("rng", j)],
                                 lambda grp: RngEngine(geometries=[plan.rng_geometry(j) for j in grp]))
        groups = plan.unit_groups
        eng = self._shared_state(m, sub, "engine", groups["engine"], lambda j: fwd_act[j],
                                 lambda grp: XnorEngineCore(geometries=[LP[j].geometry for j in grp]))
        def chans(grp):
            return [LP[j].n_out for j in grp]

        bnf = self._shared_state(m, sub, "bn_fwd", groups["bn"], lambda j: fwd_act[j],
                                 lambda grp: BnForwardUnit(layer=plan.bn_envelope(grp), div_steps=cfg.hw.div_steps,
                                                           channels=chans(grp)))
        bnb = self._shared_state(m, sub, "bn_bwd", groups["bn"], lambda j: bwd_act[j],
                                 lambda grp: BnBackwardUnit(layer=plan.bn_envelope(grp), channels=chans(grp),
                                                            pass2_lanes=plan.po2_lanes(LP[grp[0]].lanes_out)))
        po2 = self._shared_state(m, sub, "po2_", groups["bn"], lambda j: bwd_act[j],
                                 lambda grp: Po2Unit(layer=plan.bn_envelope(grp), mul_steps=cfg.hw.mul_steps,
                                                     channels=chans(grp), tops=[LP[j].top for j in grp],
                                                     pass1_lanes=plan.po2_lanes(LP[grp[0]].lanes_out)))
        for grp in plan.backward_groups:  # one po2 backward engine per group of layers
            unit = sub("po2b_" + "_".join(map(str, grp)),
                       Po2Backward(shapes=[plan.po2_geometry(j) for j in grp]))
            for j in grp:
                po2b[j] = unit
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

        ports = {}

        def pm(key, port):
            ports[key] = _PortMux(port, key)
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
                    ports[f"xb{lp.index}_0_{rw}"] = _OffsetPort(ports[f"xb_{rw}"], xb_base[lp.index])
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
                ports[f"cb0_{rw}"] = _PackedPort(ports[f"ydx_{rw}"], base=ydx_d, n=cb_n, gran=ydx_w // cb_n,
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
                    ports[f"{name}{lp.index}_{rw}"] = _OffsetPort(ports[f"{name}_{rw}"], chan_base[lp.index])

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
        m.d.comb += [
            writer.i.valid.eq(self.s_axis_tvalid),
            writer.i.payload.data.eq(self.s_axis_tdata),
            writer.i.payload.last.eq(self.s_axis_tlast),
            self.s_axis_tready.eq(writer.i.ready),
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
        cmds = {c: getattr(regs.cmd, c) for c in ("upload", "train", "readback", "restore", "abort", "infer")}
        n_cmds = Signal(range(7))
        any_cmd = Signal()
        m.d.comb += [n_cmds.eq(sum(s_.as_unsigned() for s_ in cmds.values())), any_cmd.eq(n_cmds != 0),
                     abort.eq(cmds["abort"])]

        # ---- host quantity selection -------------------------------------------------------------------------
        nq = len(plan.quantities)
        q_match, q_wo, q_ro = Signal(), Signal(), Signal()
        q_index = Signal(range(max(nq, 2)))
        for i, hq in enumerate(plan.quantities):
            with m.If((regs.arg.quantity == hq.layout.kind) & (regs.arg.layer == (hq.layout.layer or 0))):
                m.d.comb += [q_match.eq(1), q_wo.eq(hq.layout.access == "wo"), q_ro.eq(hq.layout.access == "ro"),
                             q_index.eq(i)]
        sel = Signal(range(max(nq, 2)))
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
        tsel = Signal(range(max(len(targets), 2)))  # target of the selected quantity
        with m.Switch(sel):
            for i, hq in enumerate(plan.quantities):
                with m.Case(i):
                    m.d.comb += tsel.eq(targets.index(hq.target))
        host_on = Signal()  # the host sequencer owns the targets
        m.d.comb += host_on.eq(restoring | reading)
        self._connect_targets(m, plan, seq, targets, tsel, host_on, wm, rng, bnp, host_sel,
                              {"logits": lgb_r, "plog": plog_r, "labels": lab_r},
                              ports)
        # restore words from the beat writer go to the sequencer
        m.d.comb += [
            seq.w_valid.eq(writer.w_en & restoring),
            seq.w_data.eq(writer.w_data),
            writer.w_ready.eq(Mux(restoring, seq.w_ready, 1)),
        ]
        # upload words
        m.d.comb += [up_rows.valid.eq(writer.w_en & uploading & ~target_x), up_rows.data.eq(writer.w_data)]
        for i in range(l0.lanes_b):
            ports[f"xb0_{i}_w"].add(uploading, addr=up_rows.w_addr, data=up_rows.w_data, en=up_rows.w_en[i])
        ports["lab_w"].add(uploading & target_x, addr=writer.w_addr, data=writer.w_data[: plan.label_bits],
                           en=writer.w_en)
        with m.If(writer.w_en & uploading & target_x & (writer.w_data[:BEAT_BITS] >= plan.classes)):
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
        with m.Switch(ph):
            for i, key in enumerate(phases):
                with m.Case(i):
                    m.d.comb += phase_done.eq(done[key])

        with m.FSM():
            with m.State("idle"):
                m.d.comb += state_code.eq(0)
                with m.If(any_cmd & ~abort):
                    with m.If(n_cmds > 1):
                        m.d.comb += err_set["multiple"].eq(1)
                    with m.Elif(cmds["upload"]):
                        with m.If((regs.arg.batch == 0) | (regs.arg.batch > B)):
                            m.d.comb += err_set["batch"].eq(1)
                        with m.Else():
                            m.d.sync += [batch_loaded.eq(0), label_bad.eq(0), target_x.eq(0), up_n.eq(regs.arg.batch)]
                            m.d.comb += [writer.start.eq(1), writer.count.eq(regs.arg.batch * l0.words),
                                         writer.final.eq(0), writer.beats.eq(beats_for(l0.lanes_in)),
                                         up_rows.start.eq(1)]
                            m.next = "upload"
                    with m.Elif(cmds["train"]):
                        with m.If(~batch_loaded):
                            m.d.comb += err_set["no_batch"].eq(1)
                        with m.Elif(n_loaded != B):
                            m.d.comb += err_set["batch"].eq(1)
                        with m.Else():
                            m.d.sync += [cycles.eq(0), counting.eq(1), batch_loaded.eq(0), ph.eq(0),
                                         training.eq(1), ph_start.eq(1)]
                            m.next = "train"
                    with m.Elif(cmds["infer"]):  # the eval forward pass over all B rows (past n: stale, ignored)
                        with m.If(~batch_loaded):
                            m.d.comb += err_set["no_batch"].eq(1)
                        with m.Else():
                            m.d.sync += [cycles.eq(0), counting.eq(1), batch_loaded.eq(0), ph.eq(n_train),
                                         training.eq(1), ph_start.eq(1)]
                            m.next = "train"
                    with m.Else():  # readback / restore
                        with m.If(regs.arg.layer >= L):
                            m.d.comb += err_set["layer"].eq(1)
                        with m.Elif(~q_match | (cmds["restore"] & q_ro) | (cmds["readback"] & q_wo)):
                            m.d.comb += err_set["quantity"].eq(1)
                        with m.Elif(cmds["readback"]):
                            m.d.sync += [sel.eq(q_index), reader_beats.eq(sel_beats)]
                            m.d.comb += [seq.start.eq(1), seq.write.eq(0), seq.count.eq(sel_count),
                                         seq.inner_n.eq(sel_inner), seq.space.eq(sel_space)]
                            m.next = "readback"
                        with m.Else():
                            m.d.sync += sel.eq(q_index)
                            m.d.comb += [writer.start.eq(1), writer.count.eq(sel_count), writer.final.eq(1),
                                         writer.beats.eq(sel_beats),
                                         seq.start.eq(1), seq.write.eq(1), seq.count.eq(sel_count),
                                         seq.inner_n.eq(sel_inner), seq.space.eq(sel_space)]
                            m.next = "restore"
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
                    m.next = "idle"
                with m.Elif(phase_done & ~ph_start):
                    m.d.comb += [plog_wp.addr.eq(ph), plog_wp.data.eq(cycles + 1), plog_wp.en.eq(1)]
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
                    m.next = "idle"
                with m.Elif(~seq.busy & ~ser.o.valid):
                    m.d.comb += done_set["readback"].eq(1)
                    m.next = "idle"
            with m.State("restore"):
                m.d.comb += [busy.eq(1), state_code.eq(7), restoring.eq(1)]
                with m.If(abort):
                    m.next = "idle"
                with m.Elif(writer.done):
                    with m.If(writer.error):
                        m.d.comb += err_set["framing"].eq(1)
                        m.next = "idle"
                    with m.Else():
                        m.next = "restore_drain"
            with m.State("restore_drain"):  # the last word may still be on its way into the unit
                m.d.comb += [busy.eq(1), state_code.eq(7), restoring.eq(1)]
                with m.If(~seq.busy):
                    m.d.comb += done_set["restore"].eq(1)
                    m.next = "idle"
        with m.If(busy & any_cmd & ~abort):
            m.d.comb += err_set["busy"].eq(1)
        m.d.comb += [writer.abort.eq(abort), seq.abort.eq(abort)]

        for pmux in {id(p): p for p in ports.values()}.values():  # (scratch may share YDX's ports)
            pmux.emit(m)
        self.debug = {"training": training, "ph": ph, "cycles": cycles, "done": done, "act": act, "wm": wm,
                      "rng": rng, "bnp": bnp, "po2b": po2b, "po2": po2, "bnb": bnb, "bnf": bnf}
        return m

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
    def _connect_targets(self, m, plan, seq, targets, tsel, host_on, wm, rng, bnp, host_sel, mems, ports):
        req = seq.req.payload
        resp_valid = Signal()
        resp_data = Signal(len(seq.resp.payload))
        req_ready = Signal()
        for ti, t in enumerate(targets):
            here = Signal(name=f"tgt{ti}_sel")
            m.d.comb += here.eq(host_on & (tsel == ti))
            if t[0] == "wm":
                u = wm[t[1]]
                hp = u.host.payload
                m.d.comb += host_sel[("wm", t[1])].eq(here)
                m.d.comb += [
                    u.host.valid.eq(here & seq.req.valid),
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
                    u.host.valid.eq(here & seq.req.valid),
                    hp.write.eq(req.write), hp.addr.eq(req.outer), hp.data.eq(req.data),
                    u.host_rdata.ready.eq(here & seq.resp.ready),
                ]
                rv, rd, rr = u.host_rdata.valid, u.host_rdata.payload, u.host.ready
            elif t[0] == "bnp":
                u = bnp[t[1]]
                hp = u.host.payload
                m.d.comb += host_sel[("bnp", t[1])].eq(here)
                m.d.comb += [
                    u.host.valid.eq(here & seq.req.valid),
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
                    tgt.req.valid.eq(here & seq.req.valid),
                    tgt.req.payload.write.eq(req.write), tgt.req.payload.outer.eq(req.outer),
                    tgt.resp.ready.eq(here & seq.resp.ready),
                    tgt.r_data.eq(rp.data),
                ]
                ports[{"logits": "lgb_r", "labels": "lab_r"}.get(t[0], "plog_r")].add(here, addr=tgt.r_addr,
                                                                                        en=tgt.r_en)
                rv, rd, rr = tgt.resp.valid, tgt.resp.payload, tgt.req.ready
            with m.If(tsel == ti):
                m.d.comb += [resp_valid.eq(rv), resp_data.eq(rd), req_ready.eq(rr)]
        m.d.comb += [
            seq.resp.valid.eq(host_on & resp_valid),
            seq.resp.payload.eq(resp_data),
            seq.req.ready.eq(host_on & req_ready),
        ]

    # ---- forward phase of one layer ----------------------------------------------------------------------------
    def _forward(self, m, plan, lp, act, start, done, eng, wm, bnf, bnp, xb, mx, ports, logit, loss,
                 sub, correct):
        j = lp.index
        B, G, W, lo = plan.batch, lp.groups, lp.words, lp.lanes_out
        key = ("fwd", j)
        # the switch_undo re-run (rfwd j) runs the same datapath; it leaves the running statistics, the logits
        # and the correct count of the first run alone
        rkey = ("rfwd", j)
        rerun = act.get(rkey, Const(0))
        # infer (ifwd j): the same datapath in evaluation mode (``ev``): thresholds and logit constants from the
        # running statistics; the running statistics, the loss unit and the step's registers are left alone
        ikey = ("ifwd", j)
        ev = act[ikey]
        a = Signal(name=f"fwd_any{j}")
        st = Signal(name=f"fwd_any_start{j}")
        m.d.comb += [a.eq(act[key] | rerun | ev), st.eq(start[key] | start.get(rkey, 0) | start[ikey])]
        e, bn, par = eng[j], bnf[j], bnp[j]
        m.d.comb += [bn.eval_mode.eq(ev), par.eval_mode.eq(ev), bn.run.eq(par.run)]
        # rows of X_j -> engine
        xr = sub(f"fwd_rows{j}", RowReader(width=lp.lanes_in, banks=lp.lanes_b, words=W, rows=B))
        m.d.comb += xr.start.eq(st)
        for i in range(lp.lanes_b):
            ports[f"xb{j}_{i}_r"].add(a, addr=xr.r_addr, en=xr.r_en)
            m.d.comb += xr.r_data[i].eq(ports[f"xb{j}_{i}_r"].port.data)
        m.d.comb += [
            e.x.valid.eq(a & xr.o.valid),
            e.x.payload.data.eq(xr.o.payload.data),
            e.x.payload.last.eq(xr.o.payload.row_last),
            xr.o.ready.eq(a & e.x.ready),
        ]
        # weights: the engine reads the weight memory
        m.d.comb += [wm[j].read.addr.eq(e.weights.addr), wm[j].read.en.eq(e.weights.en),
                     e.weights.data.eq(wm[j].read.data)]
        # Y: to BN pass 1 and into the Y buffer
        yw = lp.widths["y"]
        y_count = Signal(range(lp.beats + 1), name=f"y_count{j}")
        y_word = Signal(lo * yw, name=f"y_word{j}")
        for lane in range(lo):
            m.d.comb += [bn.y.payload.y[lane].eq(e.y.payload.y[lane]), y_word[lane * yw:(lane + 1) * yw].eq(
                e.y.payload.y[lane])]
        m.d.comb += [bn.y.payload.last.eq(e.y.payload.last), bn.y.valid.eq(a & e.y.valid),
                     e.y.ready.eq(a & bn.y.ready)]
        y_take = Signal(name=f"y_take{j}")
        m.d.comb += y_take.eq(a & e.y.valid & bn.y.ready)
        ports["ydx_w"].add(y_take, addr=y_count, data=y_word, en=1)
        with m.If(st):
            m.d.sync += y_count.eq(0)
        with m.Elif(y_take):
            m.d.sync += y_count.eq(y_count + 1)
        # replays of Y: two for BN (passes 2, 3), a third for the logits of the output layer
        reps = 3 if lp.top else 2
        rd_depth = max(q.beats for q in plan.layers)
        ry = max(q.lanes_out * q.widths["y"] for q in plan.layers)  # one reader for every layer's Y words
        rr = self._pooled(m, sub, "y_replay", (ry,), lambda: MemoryReader(width=ry, depth=rd_depth, repeat=3), a)
        replay_started = Signal(name=f"replay_started{j}")
        with m.If(st):
            m.d.sync += replay_started.eq(0)
        with m.Elif(a & (y_count == lp.beats) & ~replay_started):
            m.d.sync += replay_started.eq(1)
            m.d.comb += [rr.start.eq(1), rr.base.eq(0), rr.count.eq(reps * lp.beats), rr.wrap.eq(lp.beats)]
        ports["ydx_r"].add(a, addr=rr.r_addr, en=rr.r_en)
        m.d.comb += rr.r_data.eq(ports["ydx_r"].port.data[:ry])
        r_count = Signal(range(reps * lp.beats + 1), name=f"replay_count{j}")
        to_bn = Signal(name=f"replay_to_bn{j}")
        m.d.comb += to_bn.eq(r_count < 2 * lp.beats)
        with m.If(st):
            m.d.sync += r_count.eq(0)
        with m.Elif(rr.o.valid & rr.o.ready):
            m.d.sync += r_count.eq(r_count + 1)
        groups_last = Signal(name=f"replay_last{j}")
        rg = Signal(range(G), name=f"replay_g{j}")
        with m.If(st):
            m.d.sync += rg.eq(0)
        with m.Elif(rr.o.valid & rr.o.ready):
            m.d.sync += rg.eq(Mux(rg == G - 1, 0, rg + 1))
        m.d.comb += groups_last.eq(rg == G - 1)
        for lane in range(lo):
            m.d.comb += bn.y_replay.payload.y[lane].eq(rr.o.payload.data[lane * yw:(lane + 1) * yw].as_signed())
        m.d.comb += [bn.y_replay.payload.last.eq(groups_last), bn.y_replay.valid.eq(a & to_bn & rr.o.valid)]
        if not lp.top:
            m.d.comb += rr.o.ready.eq(a & bn.y_replay.ready)
        self._bn_replay_ready = bn.y_replay.ready
        # beta per channel
        m.d.comb += [par.beta_start.eq(st), bn.beta.valid.eq(a & par.beta.valid), bn.beta.payload.eq(par.beta.payload),
                     par.beta.ready.eq(a & bn.beta.ready)]
        # x_hat and mask: MX_j; x_hat packed into X_{j+1}
        x_count = Signal(range(lp.beats + 1), name=f"x_count{j}")
        x_take = Signal(name=f"x_take{j}")
        m.d.comb += [bn.x.ready.eq(a), x_take.eq(a & bn.x.valid)]
        mx_data = Cat(bn.x.payload.x_hat, bn.x.payload.mask) if lp.top else bn.x.payload.mask
        ports[f"mx{j}_w"].add(x_take, addr=x_count, data=mx_data, en=1)
        with m.If(st):
            m.d.sync += x_count.eq(0)
        with m.Elif(x_take):
            m.d.sync += x_count.eq(x_count + 1)
        if not lp.top:
            self._pack_next(m, plan, lp, st, x_take, bn.x.payload.x_hat, ports, sub)
        # per-channel statistics: S', alpha; running statistics; (output layer) logit constants
        st_count = Signal(range(lp.n_out + 1), name=f"stats_count{j}")
        to_par = _StreamView(Signal(name=f"stats_par_valid{j}"), Signal(name=f"stats_par_ready{j}"))
        m.d.comb += [par.stats.valid.eq(to_par.valid & ~rerun & ~ev), to_par.ready.eq(par.stats.ready | rerun | ev)]
        dsts = [to_par] + ([logit.consts] if lp.top else [])
        stats_valid = Signal(name=f"stats_valid{j}")
        m.d.comb += stats_valid.eq(a & bn.stats.valid)
        src = _StreamView(stats_valid, bn.stats.ready)
        move = fork(m, src, dsts, name=f"stats_fork{j}")
        sp = bn.stats.payload
        m.d.comb += [par.stats.payload.sum_y.eq(sp.sum_y), par.stats.payload.S.eq(sp.S)]
        if lp.top:
            m.d.comb += [logit.consts.payload.c.eq(sp.C), logit.consts.payload.s.eq(sp.S_eff),
                         logit.consts.payload.last.eq(sp.last)]
        ports[f"seff{j}_w"].add(move, addr=st_count, data=sp.S_eff, en=1)
        pad = Const(0, self._alpha_w - len(sp.alpha_q))
        ports[f"alpha{j}_w"].add(move, addr=st_count, data=Cat(sp.alpha_q, pad, sp.S == 0), en=1)
        with m.If(st):
            m.d.sync += st_count.eq(0)
        with m.Elif(move):
            m.d.sync += st_count.eq(st_count + 1)
        fin = (st_count == lp.n_out) & (x_count == lp.beats) & ~par.busy
        if lp.top:
            fin = fin & self._output(m, plan, lp, a, st, rr, to_bn, rg, logit, loss, ports, correct, rerun, ev)
        m.d.comb += [done[key].eq(fin), done[ikey].eq(fin)]
        if rkey in done:
            m.d.comb += done[rkey].eq(fin)

    def _output(self, m, plan, lp, a, st, rr, to_bn, rg, logit, loss, ports, correct, rerun, ev):
        """Logits (third Y replay), loss gradient g into the top of YDX, logits into their buffer, correct count.

        The logit and loss units take ``nl = plan.loss_lanes`` classes per beat: each Y beat of ``lo`` lanes is
        split into ``lo / nl`` beats (those past the classes dropped), and the gradient beats are joined back
        into words of ``lo`` lanes for YDX (lanes past the classes 0)."""
        B, G, lo = plan.batch, lp.groups, lp.lanes_out
        nl, C = plan.loss_lanes, plan.classes
        parts = lo // nl
        yw = lp.widths["y"]
        sb = Signal(range(max(parts, 2)), name="logit_part")  # part of the Y beat going to the logit unit
        c0 = Signal(range(G * lo + 1), name="logit_class")  # its first class
        end = Signal(name="logit_sample_end")  # the sample's last part
        part_end = Signal(name="logit_part_end")  # the Y beat's last part
        m.d.comb += [c0.eq(rg * lo + sb * nl), end.eq(c0 + nl >= C), part_end.eq((sb == parts - 1) | end)]
        part = Signal(nl * yw, name="logit_y_part")
        with m.Switch(sb):
            for s_ in range(parts):
                with m.Case(s_):
                    m.d.comb += part.eq(rr.o.payload.data[s_ * nl * yw:(s_ + 1) * nl * yw])
        for lane in range(nl):
            m.d.comb += logit.y.payload.y[lane].eq(part[lane * yw:(lane + 1) * yw].as_signed())
        m.d.comb += [
            logit.y.payload.last.eq(end),
            logit.y.valid.eq(a & ~to_bn & rr.o.valid),
            rr.o.ready.eq(a & Mux(to_bn, self._bn_replay_ready, logit.y.ready & part_end)),
        ]
        with m.If(st):
            m.d.sync += sb.eq(0)
        with m.Elif(logit.y.valid & logit.y.ready):
            m.d.sync += sb.eq(Mux(part_end, 0, sb + 1))
        # logits -> loss unit and the logits buffer
        lw = plan.logit_width
        lg_count = Signal(range(B * plan.loss_groups + 1), name="logit_count")
        m.d.comb += logit.eval_mode.eq(ev)
        for lane in range(nl):  # a training logit fits the loss unit's narrower lanes
            m.d.comb += loss.x.payload.x[lane].eq(logit.x.payload.x[lane])
        m.d.comb += [loss.x.payload.last.eq(logit.x.payload.last), loss.x.valid.eq(a & ~ev & logit.x.valid),
                     logit.x.ready.eq(a & (ev | loss.x.ready))]
        lg_take = Signal(name="logit_take")
        m.d.comb += lg_take.eq(a & logit.x.valid & (ev | loss.x.ready))
        cls_done = self._argmax(m, plan, st, lg_take & ev, logit.x.payload, ports)
        lg_word = Signal(nl * lw, name="logit_word")
        for lane in range(nl):
            m.d.comb += lg_word[lane * lw:(lane + 1) * lw].eq(logit.x.payload.x[lane])
        ports["lgb_w"].add(lg_take & ~rerun, addr=lg_count, data=lg_word, en=1)
        with m.If(st):
            m.d.sync += lg_count.eq(0)
        with m.Elif(lg_take):
            m.d.sync += lg_count.eq(lg_count + 1)
        # labels
        labr = self._sub("labels_reader", MemoryReader(width=plan.label_bits, depth=B))
        # not started in infer: a reader left holding a word would hand it to the next step's loss unit
        m.d.comb += [labr.start.eq(st & ~ev), labr.base.eq(0), labr.count.eq(B), labr.wrap.eq(0)]
        ports["lab_r"].add(a, addr=labr.r_addr, en=labr.r_en)
        m.d.comb += [labr.r_data.eq(ports["lab_r"].port.data), loss.label.payload.eq(labr.o.payload.data),
                     loss.label.valid.eq(a & ~ev & labr.o.valid), labr.o.ready.eq(a & ~ev & loss.label.ready)]
        # gradient: nl lanes per beat joined into words of lo lanes (a word ends after lo / nl parts or with the
        # sample); the parts taken so far wait in g_held
        gw = len(loss.g.payload.g[0])
        g_count = Signal(range(lp.beats + 1), name="g_count")
        g_take = Signal(name="g_take")
        m.d.comb += [loss.g.ready.eq(a), g_take.eq(a & loss.g.valid)]
        incoming = Signal(nl * gw, name="g_part")
        for lane in range(nl):
            m.d.comb += incoming[lane * gw:(lane + 1) * gw].eq(loss.g.payload.g[lane])
        g_word = Signal(lo * gw, name="g_word")
        if parts == 1:
            g_flush = g_take
            m.d.comb += g_word.eq(incoming)
        else:
            gs = Signal(range(parts), name="g_part_index")
            g_held = Signal(lo * gw, name="g_held")
            g_flush = Signal(name="g_flush")
            m.d.comb += g_flush.eq(g_take & ((gs == parts - 1) | loss.g.payload.last))
            for s_ in range(parts):
                sl = slice(s_ * nl * gw, (s_ + 1) * nl * gw)
                m.d.comb += g_word[sl].eq(Mux(gs == s_, incoming, g_held[sl]))
            with m.If(st | g_flush):
                m.d.sync += [gs.eq(0), g_held.eq(0)]
            with m.Elif(g_take):
                m.d.sync += [gs.eq(gs + 1), g_held.eq(g_word)]
        ports["ydx_w"].add(g_flush, addr=self._g_base + g_count, data=g_word, en=1)
        with m.If(st):
            m.d.sync += g_count.eq(0)
        with m.Elif(g_flush):
            m.d.sync += g_count.eq(g_count + 1)
        loss_done = Signal(name="loss_done")
        with m.If(st):
            m.d.sync += loss_done.eq(0)
        with m.Elif(loss.done):
            m.d.sync += loss_done.eq(1)
            if plan.undo:  # the loss register keeps the first run's loss, which the re-run's is compared with
                with m.If(rerun):
                    m.d.sync += self._loss_rose.eq(loss.loss_q > self._loss_q)
                with m.Else():
                    m.d.sync += [self._loss_q.eq(loss.loss_q), self._loss_rose.eq(0), correct.eq(loss.correct)]
            else:
                m.d.sync += [self._loss_q.eq(loss.loss_q), correct.eq(loss.correct)]
        return Mux(ev, cls_done, loss_done & (g_count == lp.beats))

    def _argmax(self, m, plan, st, take, payload, ports):
        """Infer: the class of every sample, the argmax of its eval logits (the first on ties, as numpy's argmax
        and the ``correct`` count of :func:`sim.hw.arith.loss_grad`), written into the labels memory at the
        sample's row; ``take``: a logit beat of ``nl`` classes (``last`` on a sample's last beat). Returns the
        signal that every sample of the batch has its class."""
        B, C, nl = plan.batch, plan.classes, plan.loss_lanes
        ng = plan.loss_groups
        real_last = C - (ng - 1) * nl
        lw = plan.logit_width
        og = Signal(range(max(ng, 2)), name="cls_beat")  # beat within the sample
        sample = Signal(range(B + 1), name="cls_sample")
        best_v = Signal(signed(lw), name="cls_best")
        best_i = Signal(range(max(C, 2)), name="cls_best_i")
        # the first maximum of this beat's real lanes (a lane past the classes only in the last beat)
        cand_v, cand_i = payload.x[0], Const(0, range(max(nl, 2)))
        for lane in range(1, nl):
            real = Const(1) if lane < real_last else (og != ng - 1)
            v = Signal(signed(lw), name=f"cls_v{lane}")
            i = Signal(range(max(nl, 2)), name=f"cls_i{lane}")
            better = real & (payload.x[lane] > cand_v)
            m.d.comb += [v.eq(Mux(better, payload.x[lane], cand_v)), i.eq(Mux(better, lane, cand_i))]
            cand_v, cand_i = v, i
        new = Signal(name="cls_new")
        nv = Signal(signed(lw), name="cls_new_v")
        ni = Signal(range(max(C, 2)), name="cls_new_i")
        m.d.comb += [new.eq((og == 0) | (cand_v > best_v)), nv.eq(Mux(new, cand_v, best_v)),
                     ni.eq(Mux(new, og * nl + cand_i, best_i))]
        end = Signal(name="cls_end")
        m.d.comb += end.eq(take & payload.last)
        ports["lab_w"].add(end, addr=sample, data=ni, en=1)
        with m.If(st):
            m.d.sync += [og.eq(0), sample.eq(0)]
        with m.Elif(take):
            m.d.sync += [best_v.eq(nv), best_i.eq(ni), og.eq(Mux(payload.last, 0, og + 1))]
            with m.If(payload.last):
                m.d.sync += sample.eq(sample + 1)
        return sample == B

    def _sub(self, name, unit):
        self._m.submodules[name] = ResetInserter({"sync": self._abort})(unit)
        return unit

    def _pack_next(self, m, plan, lp, st, x_take, x_hat, ports, sub):
        """x_hat beats of layer j (lo bits) packed into the words of X_{j+1} (li_{j+1} bits), sample-major."""
        j = lp.index
        nxt = plan.layers[j + 1]
        lo, li, G = lp.lanes_out, nxt.lanes_in, lp.groups
        r = li // lo
        wr = sub(f"pack_rows{j + 1}", RowWriter(width=li, banks=nxt.lanes_b, words=nxt.words, rows=plan.batch))
        acc = Signal(li, name=f"pack_acc{j}")
        slot = Signal(range(max(r, 2)), name=f"pack_slot{j}")
        g = Signal(range(max(G, 2)), name=f"pack_g{j}")
        word = Signal(li, name=f"pack_word{j}")
        cases = [acc | (x_hat << (s * lo)) for s in range(r)]
        with m.Switch(slot):
            for s in range(r):
                with m.Case(s):
                    m.d.comb += word.eq(cases[s])
        flush = Signal(name=f"pack_flush{j}")
        m.d.comb += [flush.eq(x_take & ((slot == r - 1) | (g == G - 1))), wr.start.eq(st), wr.valid.eq(flush),
                     wr.data.eq(word)]
        with m.If(st):
            m.d.sync += [acc.eq(0), slot.eq(0), g.eq(0)]
        with m.Elif(x_take):
            m.d.sync += g.eq(Mux(g == G - 1, 0, g + 1))
            with m.If(flush):
                m.d.sync += [acc.eq(0), slot.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(word), slot.eq(slot + 1)]
        a = Signal(name=f"pack_act{j}")
        m.d.comb += a.eq(x_take)
        for i in range(nxt.lanes_b):
            ports[f"xb{j + 1}_{i}_w"].add(flush, addr=wr.w_addr, data=wr.w_data, en=wr.w_en[i])

    def _x_hat_from_next(self, m, plan, lp, st, a, feed, ports):
        """x_hat of hidden layer ``j`` in BN beat order, read from ``XB_{j+1}`` (where ``_pack_next`` put it) in
        step with ``feed`` (beat ``b * G + g`` of each of its two passes): word ``g // r`` of row ``b``, slot ``g % r``
        (``r = li_{j+1} / lo``). The selects are taken with each read; the word waits on the read port with the
        feed's."""
        j = lp.index
        nxt = plan.layers[j + 1]
        lo, li, G, B, lb, W = lp.lanes_out, nxt.lanes_in, lp.groups, plan.batch, nxt.lanes_b, nxt.words
        r = li // lo
        g = Signal(range(max(G, 2)), name=f"xh_g{j}")
        slot = Signal(range(max(r, 2)), name=f"xh_slot{j}")
        k = Signal(range(max(W, 2)), name=f"xh_k{j}")
        b = Signal(range(max(B, 2)), name=f"xh_b{j}")
        bank = Signal(range(max(lb, 2)), name=f"xh_bank{j}")
        base = Signal(range(max(-(-B // lb) * W, 2)), name=f"xh_base{j}")  # (b // lanes_b) * W
        s_slot = Signal.like(slot, name=f"xh_s_slot{j}")
        s_bank = Signal.like(bank, name=f"xh_s_bank{j}")
        issue = Signal(name=f"xh_issue{j}")
        m.d.comb += issue.eq(a & feed.r_en)
        for i in range(lb):
            ports[f"xb{j + 1}_{i}_r"].add(a, addr=base + k, en=feed.r_en)
        with m.If(st):
            m.d.sync += [g.eq(0), slot.eq(0), k.eq(0), b.eq(0), bank.eq(0), base.eq(0)]
        with m.Elif(issue):
            m.d.sync += [s_slot.eq(slot), s_bank.eq(bank)]
            with m.If(g == G - 1):  # next row (after the last row: the second pass from row 0)
                m.d.sync += [g.eq(0), slot.eq(0), k.eq(0)]
                with m.If(b == B - 1):
                    m.d.sync += [b.eq(0), bank.eq(0), base.eq(0)]
                with m.Else():
                    m.d.sync += b.eq(b + 1)
                    next_sample_row(m, bank, base, lb, W)
            with m.Else():
                m.d.sync += g.eq(g + 1)
                with m.If(slot == r - 1):
                    m.d.sync += [slot.eq(0), k.eq(k + 1)]
                with m.Else():
                    m.d.sync += slot.eq(slot + 1)
        words = Signal(li * lb, name=f"xh_words{j}")
        for i in range(lb):
            m.d.comb += words[i * li:(i + 1) * li].eq(ports[f"xb{j + 1}_{i}_r"].port.data)
        word = Signal(li, name=f"xh_word{j}")
        xh = Signal(lo, name=f"xh{j}")
        m.d.comb += word.eq(words.word_select(s_bank, li))
        m.d.comb += xh.eq(word.word_select(s_slot, lo))
        return xh

    # ---- backward: BN backward and po2 codes -----------------------------------------------------------------
    def _backward(self, m, plan, lp, act, start, done, bnb, bnp, po2, mx, ports, scale, unit_exp, sub,
                  lb):
        j = lp.index
        B, G, lo = plan.batch, lp.groups, lp.lanes_out
        key = ("bwd", j)
        a, st = act[key], start[key]
        bu, pu, par = bnb[j], po2[j], bnp[j]
        # per-channel S' -> po2 (PRO); alpha -> BN backward (EPI)
        for name, dst in (("seff", pu.s_eff), ("alpha", bu.alpha)):
            rw = len(ports[f"{name}{j}_r"].port.data)
            ch_max = max(q.n_out for q in plan.layers)
            rd = self._pooled(m, sub, f"{name}_reader", (rw,),
                              lambda rw=rw, ch_max=ch_max: MemoryReader(width=rw, depth=ch_max), a)
            m.d.comb += [rd.start.eq(st), rd.base.eq(0), rd.count.eq(lp.n_out), rd.wrap.eq(0)]
            ports[f"{name}{j}_r"].add(a, addr=rd.r_addr, en=rd.r_en)
            m.d.comb += [rd.r_data.eq(ports[f"{name}{j}_r"].port.data), dst.payload.eq(rd.o.payload.data),
                         dst.valid.eq(a & rd.o.valid), rd.o.ready.eq(a & dst.ready)]
        # dx (twice): g (output layer) or dX times the mask, both from YDX, with x_hat
        dxw = lp.widths["dx"]
        src_name = "ydx"  # dX of the layer above, or (output layer) the loss gradient g from YDX word _g_base on
        src_base = self._g_base if lp.top else 0
        src_w = len(ports[f"{src_name}_r"].port.data)
        rd_depth = max(q.beats for q in plan.layers)
        feed = self._pooled(m, sub, "dx_feed", (src_w + 2 * lo,),
                            lambda: MemoryReader(width=src_w + 2 * lo, depth=rd_depth, repeat=2), a)
        m.d.comb += [feed.start.eq(st), feed.base.eq(0), feed.count.eq(2 * lp.beats), feed.wrap.eq(lp.beats)]
        # (the port is the feed's until its last word is taken; then the po2 scratch reader's, which may share it)
        ports[f"{src_name}_r"].add(a & feed.busy, addr=feed.r_addr + src_base, en=feed.r_en)
        ports[f"mx{j}_r"].add(a, addr=feed.r_addr, en=feed.r_en)
        m.d.comb += feed.r_data.eq(Cat(ports[f"{src_name}_r"].port.data, ports[f"mx{j}_r"].port.data))
        fd = feed.o.payload.data
        if lp.top:
            xh = fd[src_w:src_w + lo]
            mask = fd[src_w + lo:src_w + 2 * lo]
        else:
            mask = fd[src_w:src_w + lo]
            xh = self._x_hat_from_next(m, plan, lp, st, a, feed, ports)
        f_count = Signal(range(2 * lp.beats + 1), name=f"dx_count{j}")
        first = Signal(name=f"dx_first{j}")
        m.d.comb += first.eq(f_count < lp.beats)
        fg = Signal(range(max(G, 2)), name=f"dx_g{j}")
        with m.If(st):
            m.d.sync += [f_count.eq(0), fg.eq(0)]
        with m.Elif(feed.o.valid & feed.o.ready):
            m.d.sync += [f_count.eq(f_count + 1), fg.eq(Mux(fg == G - 1, 0, fg + 1))]
        sw = len(plan.layers) and (len(bnb[j].dx.payload.dx[0]))
        for dst in (bu.dx, bu.dx_replay):
            for lane in range(lo):
                if lp.top:
                    gw = self._g_lane
                    v = fd[lane * gw:(lane + 1) * gw].as_signed()
                else:
                    v = Mux(mask[lane], fd[lane * dxw:(lane + 1) * dxw].as_signed(), 0)
                m.d.comb += dst.payload.dx[lane].eq(v)
            m.d.comb += [dst.payload.x_hat.eq(xh), dst.payload.last.eq(fg == G - 1)]
        del sw
        m.d.comb += [
            bu.dx.valid.eq(a & first & feed.o.valid),
            bu.dx_replay.valid.eq(a & ~first & feed.o.valid),
            feed.o.ready.eq(a & Mux(first, bu.dx.ready, bu.dx_replay.ready)),
        ]
        # P1 -> BN parameters; Q -> po2
        m.d.comb += [par.p1.valid.eq(a & bu.p1.valid), par.p1.payload.eq(bu.p1.payload.p1),
                     bu.p1.ready.eq(a & par.p1.ready)]
        m.d.comb += [pu.q.payload.eq(bu.q.payload), pu.q.valid.eq(a & bu.q.valid), bu.q.ready.eq(a & pu.q.ready)]
        m.d.comb += pu.scale.eq(scale[j])
        # po2 scratch out and back; bias; codes into the code buffer (banked by sample)
        scr_count = Signal(range(lp.beats + 1), name=f"scr_count{j}")
        m.d.comb += pu.scratch.ready.eq(a)
        scr_take = Signal(name=f"scr_take{j}")
        m.d.comb += scr_take.eq(a & pu.scratch.valid)
        sbits = len(pu.scratch.payload.as_value()) - 1
        ports["scr_w"].add(scr_take, addr=scr_count, data=pu.scratch.payload.as_value()[:sbits], en=1)
        with m.If(st):
            m.d.sync += scr_count.eq(0)
        with m.Elif(scr_take):
            m.d.sync += scr_count.eq(scr_count + 1)
        rd_depth = max(q.beats for q in plan.layers)
        srd = self._pooled(m, sub, "scratch_reader", (sbits,), lambda: MemoryReader(width=sbits, depth=rd_depth), a)
        m.d.comb += pu.bias.ready.eq(a)
        with m.If(a & pu.bias.valid):
            m.d.sync += unit_exp[j].eq(pu.bias.payload.unit_exp)
            m.d.comb += [srd.start.eq(1), srd.base.eq(0), srd.count.eq(lp.beats), srd.wrap.eq(0)]
        ports["scr_r"].add(a, addr=srd.r_addr, en=srd.r_en)
        sg = Signal(range(max(G, 2)), name=f"scr_g{j}")
        with m.If(st):
            m.d.sync += sg.eq(0)
        with m.Elif(srd.o.valid & srd.o.ready):
            m.d.sync += sg.eq(Mux(sg == G - 1, 0, sg + 1))
        m.d.comb += [
            srd.r_data.eq(ports["scr_r"].port.data[:sbits]),
            pu.scratch_in.payload.as_value().eq(Cat(srd.o.payload.data, sg == G - 1)),
            pu.scratch_in.valid.eq(a & srd.o.valid),
            srd.o.ready.eq(a & pu.scratch_in.ready),
        ]
        cw = sub(f"codes_rows{j}", RowWriter(width=lo * plan.p.k, banks=lb, words=G, rows=B))
        c_take = Signal(name=f"codes_take{j}")
        m.d.comb += [pu.codes.ready.eq(a), c_take.eq(a & pu.codes.valid), cw.start.eq(st), cw.valid.eq(c_take),
                     cw.data.eq(pu.codes.payload.as_value()[: lo * plan.p.k])]
        for i in range(lb):
            ports[f"cb{i}_w"].add(c_take, addr=cw.w_addr, data=cw.w_data, en=cw.w_en[i])
        m.d.comb += done[key].eq((cw.count == lp.beats) & ~par.busy)

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

    @staticmethod
    def _select_layer(m, plan, unit, j):
        """Point a po2 backward engine shared by a group of layers at layer ``j`` (no-op when not shared)."""
        grp = next(g for g in plan.backward_groups if j in g)
        if len(grp) > 1:
            m.d.comb += unit.layer.eq(grp.index(j))

    # ---- dX of layer j into the buffer of layer j-1 --------------------------------------------------------------
    def _dx(self, m, plan, lp, act, start, done, po2b, wm, ports, sub, lb):
        j = lp.index
        B, G, lo, li = plan.batch, lp.groups, lp.lanes_out, lp.lanes_in
        below = plan.layers[j - 1]
        key = ("dx", j)
        a, st = act[key], start[key]
        u = po2b[j]
        k_bits = plan.p.k
        if u.array:
            self._array_dx(m, plan, lp, a, st, done[key], u, wm, ports)
            return
        cr = self._pooled(m, sub, "codes_reader", (lo * k_bits, lb, G, B),
                          lambda: RowReader(width=lo * k_bits, banks=lb, words=G, rows=B), a)
        m.d.comb += cr.start.eq(st)
        for i in range(lb):
            ports[f"cb{i}_r"].add(a, addr=cr.r_addr, en=cr.r_en)
            m.d.comb += cr.r_data[i].eq(ports[f"cb{i}_r"].port.data[: lo * k_bits])
        # the engine may serve several layers: its inputs are driven only while this phase is active
        with m.If(a):
            self._select_layer(m, plan, u, j)
            m.d.comb += u.dy.valid.eq(cr.o.valid)
        self._wide(m, a, [(u.dy.payload.as_value(), Cat(cr.o.payload.data, cr.o.payload.row_last))])
        m.d.comb += cr.o.ready.eq(a & u.dy.ready)
        # the dX unit reads the weights (the memory is idle: no sweep runs during this phase)
        with m.If(a):
            m.d.comb += [wm[j].read.addr.eq(u.weights.addr), wm[j].read.en.eq(u.weights.en)]
        self._wide(m, a, [(u.weights.data, wm[j].read.data)])
        # re-cut the dX beats (ls values: one pass of an input word) into the BN beats of layer j-1 (lo' values),
        # dropping padding beats: split each beat in r, or join c beats
        lo2, G2 = below.lanes_out, below.groups
        ls = u.dx.payload.dx.shape().length
        dxw = below.widths["dx"]
        vw = len(u.dx.payload.dx[0])
        per_row = lp.words * li // lo2  # BN beats per dX row, padding included
        q = Signal(range(max(per_row, 2)), name=f"split_q{j}")
        wcount = Signal(range(below.beats + 1), name=f"split_count{j}")
        word = Signal(lo2 * dxw, name=f"split_word{j}")
        keep = Signal(name=f"split_keep{j}")
        emit = Signal(name=f"split_emit{j}")  # a BN beat (real or padding) is complete this cycle
        m.d.comb += keep.eq(emit & (q < G2))
        ports["ydx_w"].add(keep, addr=wcount, data=word, en=1)
        # every BN beat the engine sends, padding included: the phase ends when the last row's padding beats have
        # left the engine too (a shared engine would otherwise start its next layer's dX with them)
        ecount = Signal(range(B * per_row + 1), name=f"split_emitted{j}")
        with m.If(emit):
            m.d.sync += [q.eq(Mux(q == per_row - 1, 0, q + 1)), ecount.eq(ecount + 1)]
            with m.If(keep):
                m.d.sync += wcount.eq(wcount + 1)

        if ls > lo2:
            r = ls // lo2
            full = Signal(name=f"split_full{j}")
            hold = Signal(len(u.dx.payload.dx.as_value()), name=f"split_hold{j}")
            sub_i = Signal(range(max(r, 2)), name=f"split_sub{j}")
            with m.If(a):
                m.d.comb += u.dx.ready.eq(~full | (sub_i == r - 1))
            with m.Switch(sub_i):
                for s_ in range(r):
                    with m.Case(s_):
                        for lane in range(lo2):
                            src = (s_ * lo2 + lane) * vw
                            m.d.comb += word[lane * dxw:(lane + 1) * dxw].eq(hold[src:src + vw].as_signed())
            # a shared engine hands other layers' dX beats out while this phase is idle: only this phase's beats
            # load the holding register, and none leaves in the phase's first cycle, when the write position
            # still points past the end of the previous step's buffer (into the codes packed above YDX's words)
            m.d.comb += emit.eq(a & full & ~st)
            with m.If(emit):
                m.d.sync += sub_i.eq(sub_i + 1)
                with m.If(sub_i == r - 1):
                    m.d.sync += full.eq(0)
            with m.If(a & u.dx.valid & u.dx.ready):  # (re)load: the next beat follows the last sub-beat directly
                m.d.sync += [full.eq(1), hold.eq(u.dx.payload.dx.as_value()), sub_i.eq(0)]
            with m.If(st):
                m.d.sync += [full.eq(0), sub_i.eq(0)]
        else:  # join c beats (c = 1: each beat is written straight from the unit's output register, the same
            # data for every layer, so the YDX write port needs no multiplexer for it)
            c = lo2 // ls
            take = Signal(name=f"split_take{j}")
            incoming = Signal(ls * dxw, name=f"split_in{j}")
            for lane in range(ls):
                m.d.comb += incoming[lane * dxw:(lane + 1) * dxw].eq(u.dx.payload.dx[lane])
            m.d.comb += take.eq(a & u.dx.valid)
            with m.If(a):
                m.d.comb += u.dx.ready.eq(1)
            if c == 1:
                m.d.comb += [word.eq(incoming), emit.eq(take)]
            else:
                gath = Signal(lo2 * dxw, name=f"split_gather{j}")  # beats shift in from the top
                n = Signal(range(c), name=f"split_n{j}")
                m.d.comb += [word.eq(Cat(gath[ls * dxw:], incoming)), emit.eq(take & (n == c - 1))]
                with m.If(take):
                    m.d.sync += [gath.eq(word), n.eq(Mux(n == c - 1, 0, n + 1))]
                with m.If(st):
                    m.d.sync += n.eq(0)
        with m.If(st):
            m.d.sync += [q.eq(0), wcount.eq(0), ecount.eq(0)]
        m.d.comb += done[key].eq(ecount == B * per_row)

    def _array_dx(self, m, plan, lp, a, st, done, u, wm, ports):
        """dX on the po2 backward engine's array: it reads the codes and the weights itself and writes each word
        of the layer below's buffer (one sample's BN beat) with its address."""
        j = lp.index
        below = plan.layers[j - 1]
        with m.If(a):
            self._select_layer(m, plan, u, j)
            m.d.comb += [u.dx_start.eq(st), u.dx.ready.eq(1)]
        cb = ports["cb0_r"]
        cb.add(a, addr=u.codes.addr, en=u.codes.en)
        self._wide(m, a, [(u.codes.data.as_value(), cb.port.data[: len(u.codes.data.as_value())])])
        with m.If(a):
            m.d.comb += [wm[j].read.addr.eq(u.weights.addr), wm[j].read.en.eq(u.weights.en)]
        self._wide(m, a, [(u.weights.data, wm[j].read.data)])
        dxw = below.widths["dx"]
        vals = u.dx.payload.dx
        word = Signal(len(vals) * dxw, name=f"array_dx_word{j}")
        for lane in range(len(vals)):
            m.d.comb += word[lane * dxw:(lane + 1) * dxw].eq(vals[lane])
        keep = Signal(name=f"array_dx_keep{j}")
        wcount = Signal(range(below.beats + 1), name=f"array_dx_count{j}")
        m.d.comb += keep.eq(a & u.dx.valid)
        ports["ydx_w"].add(keep, addr=u.dx.payload.addr, data=word, en=1)
        with m.If(st):
            m.d.sync += wcount.eq(0)
        with m.Elif(keep):
            m.d.sync += wcount.eq(wcount + 1)
        m.d.comb += done.eq(wcount == below.beats)

    # ---- dW, the update sweep and the beta update -------------------------------------------------------------
    def _update(self, m, plan, lp, act, start, done, po2b, wm, rng, bnp, xb, ports, sub, scale, regs, sched_shift,
                lb):
        j = lp.index
        G, lo, li, W = lp.groups, lp.lanes_out, lp.lanes_in, lp.words
        key = ("upd", j)
        a, st = act[key], start[key]
        u, w, g, par = po2b[j], wm[j], rng[j], bnp[j]
        k_bits = plan.p.k
        tr = sub(f"tiles{j}", TileReader(a_width=li, c_width=lo * k_bits, banks=lb, words=W, groups=G,
                                         tiles=lp.tiles, passes=lp.dw_passes))
        m.d.comb += tr.start.eq(st)
        for i in range(lb):
            ports[f"xb{j}_{i}_r"].add(a, addr=tr.a_addr, en=tr.r_en)
            ports[f"cb{i}_r"].add(a, addr=tr.c_addr, en=tr.r_en)
            m.d.comb += [tr.a_data[i].eq(ports[f"xb{j}_{i}_r"].port.data),
                         tr.c_data[i].eq(ports[f"cb{i}_r"].port.data[: lo * k_bits])]
        with m.If(a):  # the engine may serve several layers
            self._select_layer(m, plan, u, j)
            m.d.comb += [u.xdy.valid.eq(tr.o.valid), u.dw.ready.eq(w.grad.ready)]
        self._wide(m, a, [(u.xdy.payload.as_value(), Cat(tr.o.payload.a.as_value(), tr.o.payload.c.as_value(),
                                                          tr.o.payload.last))])
        m.d.comb += [tr.o.ready.eq(a & u.xdy.ready), w.grad.valid.eq(a & u.dw.valid), w.grad.payload.eq(u.dw.payload)]
        wiring.connect(m, g.u, w.rng)
        cmd_sent = Signal(name=f"upd_cmd_sent{j}")
        m.d.comb += [w.cmd.valid.eq(a & ~cmd_sent), w.cmd.payload.op.eq(UPDATE), w.cmd.payload.shift.eq(sched_shift),
                     w.cmd.payload.gate.eq(regs.sched.switch_gate)]
        settle = Signal(2, name=f"upd_settle{j}")
        with m.If(st):
            m.d.sync += [cmd_sent.eq(0), settle.eq(0)]
        with m.Elif(a & (settle != 3)):
            m.d.sync += settle.eq(settle + 1)
        with m.If(w.cmd.valid & w.cmd.ready):  # may be the phase's first cycle: this wins over the reset
            m.d.sync += cmd_sent.eq(1)
        m.d.comb += [g.start.eq(st), par.update.eq(st), par.scale.eq(scale[j]), par.lr_shift.eq(regs.sched.lr_shift)]
        m.d.comb += done[key].eq(cmd_sent & (settle == 3) & ~w.busy & ~g.busy & ~tr.busy & ~par.busy)


    def _undo(self, m, lp, act, start, done, wm):
        """switch_undo, layer j: an ``UNDO`` sweep of its weight memory if the re-run's loss rose; else nothing."""
        j = lp.index
        key = ("undo", j)
        a, st = act[key], start[key]
        w = wm[j]
        sent = Signal(name=f"undo_sent{j}")
        settle = Signal(2, name=f"undo_settle{j}")
        with m.If(a):  # overrides the update phase's command (the same port)
            m.d.comb += [w.cmd.valid.eq(self._loss_rose & ~sent), w.cmd.payload.op.eq(UNDO),
                         w.cmd.payload.shift.eq(0)]
        with m.If(st):
            m.d.sync += [sent.eq(0), settle.eq(0)]
        with m.Elif(a & (settle != 3)):
            m.d.sync += settle.eq(settle + 1)
        with m.If(a & w.cmd.valid & w.cmd.ready):
            m.d.sync += sent.eq(1)
        m.d.comb += done[key].eq(~st & (~self._loss_rose | (sent & (settle == 3) & ~w.busy)))


class _StreamView:
    """``valid``/``ready`` of a stream whose payload is assigned field by field (for :func:`fork`)."""

    def __init__(self, valid, ready):
        self.valid = valid
        self.ready = ready
