"""What a configuration asks the hardware to be, in plain Python (no Amaranth objects): every weight layer's
sizes, lanes and unit geometries (:class:`LayerPlan`), which layers share which unit, and the controller's phases
(:class:`SystemPlan`). The cycle model (:mod:`rtl_gen.cycle_model`), the generator (:mod:`rtl_gen.top`) and the host
description (:mod:`rtl_gen.host_interface`, mixed into :class:`SystemPlan`) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.hw.arith import ArithParams
from sim.hw.widths import derive_widths, hw_supported
from sim.hw_config import layer_lanes
from sim.schema import ConfigError

from .bn_unit import BnLayer, divider_widths, merge_bounds
from .controller import (
    BnParamUnit,
)
from .host_interface import HostInterfacePlan, HostQuantity
from .loss_unit import OutputGeometry
from .po2_backward import Po2Geometry, array_mode
from .rng import RngGeometry
from .weight_memory import OptimizerSpec, SweepGeometry, WeightMemoryGeometry
from .xnor_engine import XnorGeometry

__all__ = ["HostQuantity", "LayerPlan", "SystemPlan", "TOP_NAME", "check_generator_support"]

TOP_NAME = "xnortrain_top"


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


def check_generator_support(cfg) -> None:
    """Raise a ConfigError naming the field when the RTL generator cannot build ``cfg`` whatever its lanes: a layer
    other than dense with batch norm, an 8-bit first layer, the windowed sign gradient. ``SystemPlan`` and the
    explorer call it first, so a search over lanes never reports such a configuration as "does not fit"."""
    h = cfg.hw
    if not hw_supported(cfg):
        bad = next(s for s in cfg.layer_shapes() if not (s.spec.type == "dense" and s.spec.bn))
        raise ConfigError(f"model.layers[{bad.index}]: the RTL generator supports dense layers with bn = true "
                          f"only (got {bad.spec.type!r})")
    if h.input_kind(cfg) != "binary":
        given = ("hw.input = 'int8'" if h.input == "int8" else
                 f"hw.input = 'auto' (int8 for model.input_format = {cfg.model.input_format!r})")
        raise ConfigError(f"{given}: the generated RTL has no 8-bit first-layer engine yet; "
                          "set hw.input = 'binary' (or model.input_format = 'binary'); "
                          "benchmarks/int8_first_layer.py estimates what an 8-bit first layer would cost")


class SystemPlan(HostInterfacePlan):
    """What a configuration asks the hardware to be (pure Python; no Amaranth objects)."""

    def __init__(self, cfg, *, name: str = TOP_NAME):
        self.cfg = cfg
        self.name = name
        h = cfg.hw
        check_generator_support(cfg)
        self.input_kind = h.input_kind(cfg)
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
        self._check_step_fields()
        self.label_bits = max(1, (self.classes - 1).bit_length())
        self.quantities: list[HostQuantity] = []
        self.kinds: dict[str, int] = {}
        self._declare_quantities()

    def _check_step_fields(self) -> None:
        """Refuse ``hw.mul_steps`` / ``hw.div_steps`` above the widths that the units' sequential multipliers
        and dividers work through (they depend on the batch and the fraction widths, so the configuration's own
        range cannot bound them): a ConfigError naming the field here, not a unit's ValueError at elaboration."""
        h = self.cfg.hw
        mul_max = min(self.bn_envelope(grp).s_width for grp in self.unit_groups["bn"])
        if h.mul_steps > mul_max:
            raise ConfigError(f"hw.mul_steps = {h.mul_steps}: the po2 unit's threshold multiplier takes at most "
                              f"{mul_max} bits a cycle here (the width of S' at batch {self.batch}); "
                              f"set hw.mul_steps <= {mul_max}")
        out = OutputGeometry.from_config(self.cfg, lanes=self.loss_lanes)
        limits = [(divider_widths(self.bn_envelope(grp))[2], "the BN forward unit's quotient alpha")
                  for grp in self.unit_groups["bn"]]
        limits.append((min(out.recip_bits, out.prob_recip_bits), "the loss unit's reciprocals"))
        div_max, what = min(limits)
        if h.div_steps > div_max:
            raise ConfigError(f"hw.div_steps = {h.div_steps}: the dividers resolve at most {div_max} quotient bits "
                              f"a cycle here ({what} has {div_max} bits); set hw.div_steps <= {div_max}")

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

    @property
    def code_window_groups(self) -> list[list[int]]:
        """``hw.dw_window``: the layers that share one ``CodeWindow`` (equal ``lanes_out`` and groups), in the order
        the wiring creates them (``code_window_pool{n}``); empty without a window."""
        if not self.cfg.hw.dw_window:
            return []
        return self._groups(lambda j: (self.layers[j].lanes_out, self.layers[j].groups))

    def dw_reads(self, j: int) -> int:
        """Times ``upd j`` streams each dW tile to the engine: ``dw_passes``, half on an array that takes the
        ternary codes of ``hw.dw_window`` two lanes a slice (:attr:`Po2Geometry.dw_pairs`)."""
        return self.po2_geometry(j).dw_reads if self.po2_array(j) else self.layers[j].dw_passes

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
