"""Resource model of the generated accelerator: LUT, FF, BRAM36 and DSP48 of every unit as a function of its
geometry (:class:`rtl_gen.top.SystemPlan`), calibrated on per-unit Yosys synthesis.

Why: synthesising the paper MLP unit by unit takes about 35 minutes (the weight memory alone 36), so a search
over the lane parameters (:mod:`rtl_gen.explore`) cannot synthesise its candidates. The model answers in well
under a millisecond per design.

How each resource is modelled, per unit kind (:data:`KINDS`; one instance per group of layers sharing a unit):

- **LUT, FF, DSP48**: a least-squares fit with non-negative coefficients on a few features of the unit's
  geometry (:data:`FEATURES`: e.g. ``lanes_in * lanes_out`` popcount inputs for the XNOR engine, the
  multiply-accumulates of the po2 backward engine's DSP48 array), on the calibration points of
  ``rtl_gen/data/resource_calibration.json`` (``benchmarks/calibrate_resources.py``: every unit synthesised on its
  own with Yosys ``synth_xilinx`` at several lane geometries, :func:`rtl_gen.synth.synthesize_parts`). The fit is
  done when the model is loaded, from the JSON: no fitted number is written in this file.
- **BRAM36** of the weight memory and of the top level's buffers (the block RAM that moves with the lanes):
  computed from the memories' shapes (:func:`memory_shapes`: width x depth of every bank and buffer from the
  plan's geometries) tiled onto RAMB36E1 / RAMB18E1 modes as Yosys ``memory_libmap`` maps them
  (:func:`bram36`). The small units' few block RAMs (per-channel memories of the BN units, the generators'
  states) are fitted like the LUTs.

The test (tests/rtl_gen/test_resource_model.py) holds the model within 10 % of every calibration point for each
resource (with an absolute floor for small counts: :data:`FLOOR`) and checks that the calibration's Verilog is
still what the generator emits.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from boards.devices import uram_rule

__all__ = [
    "CALIBRATION_PATH",
    "FEATURES",
    "FLOOR",
    "KINDS",
    "RESOURCES",
    "ResourceModel",
    "UnitInstance",
    "bram36",
    "load_model",
    "memory_shapes",
    "unit_instances",
    "unit_kind",
]

CALIBRATION_PATH = Path(__file__).resolve().parent / "data" / "resource_calibration.json"

#: The modelled resources (names of :attr:`boards.devices.Device.limits` / ``rtl_gen.synth`` reports).
RESOURCES = ("LUT", "FF", "BRAM36", "DSP")

#: Absolute tolerance under which a relative error is not meaningful (a unit of 40 LUT off by 6 is 15 %): the test
#: accepts ``|model - synthesis| <= max(10 % of synthesis, FLOOR)``.
FLOOR = {"LUT": 50, "FF": 50, "BRAM36": 1.0, "DSP": 2}

#: Exceptions to the 10 % tolerance, each with its reason: the BN backward unit's flip-flops move with something the
#: features do not capture (1,549 at 8 lanes / 2 pass-2 lanes, 1,195 at 8 / 8; 3,051 and 3,050 at 16 / 4 and 16 / 8);
#: FF is nowhere near a limit (23 % of the xc7z020 for the paper MLP).
TOLERANCE = {("bn_bwd", "FF"): 0.15}

#: Unit kinds, by the prefix of the part's name in the generated top level (``engine0_1_2_3_4`` ...).
KINDS = ("engine", "bn_fwd", "bn_bwd", "po2", "po2b", "wmem", "rng", "bn_param", "logit", "loss", "top", "io",
         "code_window")
_PREFIXES = (("engine", "engine"), ("bn_fwd", "bn_fwd"), ("bn_bwd", "bn_bwd"), ("po2b_", "po2b"), ("po2_", "po2"),
             ("wmem", "wmem"), ("rng", "rng"), ("bn_param", "bn_param"), ("code_window", "code_window"))
_NAMES = {"logit": "logit", "loss": "loss"}  # whole names (``logits_target`` is a host-path part)
TOP_PART = "(top level)"  # rtl_gen.synth.TOP_PART

KIND_TITLES = {
    "engine": "XNOR engine", "bn_fwd": "BN forward", "bn_bwd": "BN backward", "po2": "po2 unit",
    "po2b": "po2 backward / dW array", "wmem": "weight memory", "rng": "generator engine",
    "bn_param": "BN parameter unit", "logit": "logit unit", "loss": "loss unit",
    "top": "top level (own logic, buffers)", "io": "readers, writers, CSR, host sequencer",
    "code_window": "column maxima of hw.dw_window",
}


def unit_kind(part: str) -> str:
    """The unit kind of a part of the generated top level (:func:`rtl_gen.synth.part_texts` names)."""
    if part == TOP_PART:
        return "top"
    if part in _NAMES:
        return _NAMES[part]
    for prefix, kind in _PREFIXES:
        if part.startswith(prefix):
            return kind
    return "io"


# -- block RAM from memory shapes ------------------------------------------------------------------------------

#: RAMB36E1 modes (depth, width) Yosys uses for a simple dual-port memory (UG473: 512 x 72 only in SDP).
_RAMB36 = ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))
#: RAMB18E1 modes (half a RAMB36 site each).
_RAMB18 = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))
#: Memories of at most this depth, or of at most :data:`LUTRAM_BITS` bits, go to distributed RAM (LUTRAM) in
#: Yosys's cost model, not block RAM (4 x 100 bits: LUTRAM; 32 x 100: a RAMB18).
LUTRAM_DEPTH = 64
LUTRAM_BITS = 512
#: Write-enable lanes of a block RAM mode at least 9 bits wide: one per 9 bits (8 data + 1 parity bit).
BYTE_BITS = 9


def bram36(width: int, depth: int, gran: int | None = None) -> float:
    """BRAM36 sites of a ``width x depth`` memory with one read and one write port as Yosys ``synth_xilinx`` maps it:
    0 for a small memory (distributed RAM), else the cheapest tiling over the RAMB36E1 / RAMB18E1 modes (a
    RAMB18 is half a site) where the rows of whole blocks of one mode may end in a shallower tiling of the rest
    (``memory_libmap`` maps 2,768 x 56 bits as 2,048 rows of 2K x 9 RAMB18s and 720 rows of 1K x 18 ones: 5.5).
    ``gran``: the write port's granularity (bits per write enable); a block RAM's write-enable lanes (9 bits in
    the 9-bit and wider modes, the whole word below) never straddle two of its groups. Checked against the
    synthesised memories of the calibration points (tests/rtl_gen/test_resource_model.py)."""
    if width <= 0 or depth <= LUTRAM_DEPTH or width * depth <= LUTRAM_BITS:
        return 0.0
    g = width if gran is None else gran
    if width % g:
        raise ValueError(f"write granularity {g} does not divide the width {width}")
    return _tiles(width, depth, g)


@cache
def _tiles(width: int, depth: int, gran: int) -> float:
    best = math.inf
    for modes, cost in ((_RAMB36, 1.0), (_RAMB18, 0.5)):
        for d, w in modes:
            lane = BYTE_BITS if w >= BYTE_BITS else w
            lanes = (width // gran) * math.ceil(gran / lane)  # enable lanes the memory needs
            across = math.ceil(lanes / (w // lane)) * cost
            if depth <= d:
                best = min(best, across)
            else:
                rest = depth % d
                best = min(best, (depth // d) * across + (_tiles(width, rest, gran) if rest else 0.0))
    return best


def split_bram36(width: int, depth: int, block: int) -> float:
    """:func:`bram36` of a :class:`rtl_gen.buffers.SplitMemory`: a bulk of whole ``block``-word blocks and a tail."""
    from .buffers import split_segments

    return sum(bram36(width, n) for _, n in split_segments(depth, block))


def lutram_luts(width: int, depth: int, gran: int | None = None) -> int:
    """LUTs of a small memory in distributed RAM: RAM64M primitives (four LUTs, three data bits of a 64-deep
    simple dual-port memory), none straddling two write-enable groups (the weight banks of a small network:
    16 x 57 x 64 bits in groups of 16 -> 1,536 LUTs, checked through the weight memory's calibration)."""
    g = width if gran is None else gran
    return 4 * (width // g) * math.ceil(g / 3) * math.ceil(depth / 64)


@dataclass(frozen=True)
class MemoryShape:
    name: str
    width: int
    depth: int
    block: int | None = None  # a SplitMemory's block
    gran: int | None = None  # the write port's granularity

    @property
    def bram36(self) -> float:
        """BRAM36 sites on a family without UltraRAM (``xc7``)."""
        if self.block:
            return split_bram36(self.width, self.depth, self.block)
        return bram36(self.width, self.depth, self.gran)

    def segments(self) -> list[int]:
        """Depths of the memories Yosys sees: a :class:`rtl_gen.buffers.SplitMemory`'s bulk and tail, else one."""
        if not self.block:
            return [self.depth]
        from .buffers import split_segments

        return [n for _, n in split_segments(self.depth, self.block)]

    def mapped(self, family: str = "xc7") -> dict[str, float]:
        """``{"BRAM36": sites, "URAM": blocks}`` on ``family``: the memories (segments) the family's
        :func:`boards.devices.uram_rule` selects in URAM288 blocks, the others in block RAM as :func:`bram36`."""
        rule = uram_rule(family)
        if rule is None:
            return {"BRAM36": self.bram36, "URAM": 0}
        out = {"BRAM36": 0.0, "URAM": 0}
        for depth in self.segments():
            if rule.selects(self.width, depth):
                out["URAM"] += rule.blocks(self.width, depth, None if self.block else self.gran)
            else:
                out["BRAM36"] += bram36(self.width, depth, None if self.block else self.gran)
        return out

    @property
    def lutram(self) -> int:
        """LUTs when the memory is small enough for distributed RAM (0 when it maps to block RAM)."""
        if self.block or self.bram36:
            return 0
        return lutram_luts(self.width, self.depth, self.gran)


def memory_shapes(plan, kind: str, group: list[int]) -> list[MemoryShape]:
    """The memories of the weight memory (``kind = "wmem"``, the layers of ``group``), the generator engine
    (``"rng"``) and the top level's buffers (``"top"``) that may map to block RAM, from the plan's geometries (as
    ``rtl_gen.top``, ``rtl_gen.rng`` and ``rtl_gen.weight_memory`` size them)."""

    if kind == "wmem":
        geos = [plan.wmem_geometry(j) for j in group]
        g0 = geos[0]
        D_all = sum(g.bank.depth for g in geos)
        V_all = sum(g.sweep.visits for g in geos)
        out = [MemoryShape(f"wbank{i}", g0.bank.lanes_in, max(D_all, 2), gran=g0.sweep.update_lanes)
               for i in range(g0.bank.lanes_out)]
        out += [MemoryShape(f"state_{n}", g0.field_width(n), max(V_all, 2), 4096) for n, _ in g0.optimizer.fields]
        return out
    if kind == "rng":  # one 32-bit xorshift state per generator (rtl_gen.rng)
        return [MemoryShape("states", 32, max(sum(plan.rng_geometry(j).generators for j in group), 2))]
    if kind == "top":
        LP = plan.layers
        top = LP[-1]
        out = []
        if len({(lp.lanes_b, lp.lanes_in) for lp in LP}) == 1 and LP[0].lanes_b == 1 and len(LP) > 1:
            out.append(MemoryShape("xb", LP[0].lanes_in, sum(lp.tiles * lp.words for lp in LP)))
        else:
            out += [MemoryShape(f"xb{lp.index}_{i}", lp.lanes_in, lp.tiles * lp.words) for lp in LP
                    for i in range(lp.lanes_b)]
        out += [MemoryShape(f"mx{lp.index}", (2 if lp.top else 1) * lp.lanes_out, lp.beats) for lp in LP]
        # (the per-channel S' and alpha memories are submodules of their own: part of the "io" kind)
        ydx_w = max(lp.lanes_out * max(lp.widths["y"], lp.widths["dx"]) for lp in LP)
        ydx_d = max(max(lp.beats for lp in LP), 2 * top.beats)
        cb_d = max(lp.tiles * lp.groups for lp in LP)
        cw_bits = max(lp.lanes_out for lp in LP) * plan.p.k
        cb_n = 1 << max(0, (ydx_w // cw_bits).bit_length() - 1) if cw_bits <= ydx_w else 0
        while cb_n and ydx_w % cb_n:
            cb_n //= 2
        cb_rows = -(-cb_d // cb_n) if cb_n else 0
        if LP[0].lanes_b == 1 and cb_n and ydx_d + cb_rows <= max(1 << (ydx_d - 1).bit_length(), 512):
            out.append(MemoryShape("ydx", ydx_w, ydx_d + cb_rows, gran=ydx_w // cb_n))
        else:
            out.append(MemoryShape("ydx", ydx_w, ydx_d))
            out += [MemoryShape(f"cb{i}", cw_bits, cb_d) for i in range(LP[0].lanes_b)]
        out.append(MemoryShape("logits", plan.loss_lanes * plan.logit_width, plan.batch * plan.loss_groups))
        out.append(MemoryShape("labels", plan.label_bits, plan.batch))
        return out
    raise ValueError(f"kind {kind!r} has no memory model (only {', '.join(BRAM_FROM_SHAPES)})")


#: Kinds whose BRAM36 comes from :func:`memory_shapes` (the others' is fitted).
BRAM_FROM_SHAPES = ("wmem", "rng", "top")


# -- unit instances and their features --------------------------------------------------------------------------


@dataclass
class UnitInstance:
    """One unit of a plan: its kind, part name in the generated top level, layers, and features."""

    kind: str
    part: str
    group: list[int]
    features: dict[str, float] = field(default_factory=dict)
    memories: list[MemoryShape] = field(default_factory=list)


def _lanes(plan, grp, attr):
    return max(getattr(plan.layers[j], attr) for j in grp)


def _engine(plan, grp):
    li, lo = _lanes(plan, grp, "lanes_in"), _lanes(plan, grp, "lanes_out")
    return {"one": 1, "li_lo": li * lo, "lo": lo, "li": li}


def _bn(plan, grp):
    lo = _lanes(plan, grp, "lanes_out")
    h = plan.cfg.hw
    po2 = plan.po2_lanes(lo)
    # ``ser``: the lanes of a beat that BN backward's pass 2 takes ``po2`` at a time (its lane multiplexers and
    # the serialiser exist only when ``po2 < lo``; with every lane at once the unit has neither)
    return {"one": 1, "lo": lo, "lo_div": lo * h.div_steps, "po2": po2, "lo_mul": lo * h.mul_steps,
            "ser": lo if po2 < lo else 0}


def _po2b(plan, grp):
    geos = [plan.po2_geometry(j) for j in grp]
    g = geos[0]
    li, lo = g.bank.lanes_in, g.bank.lanes_out
    array = plan.po2_array(grp[0])
    dsp = plan.cfg.hw.dw_dsp and g.lanes_b == 1
    macs = li * lo // g.dw_passes  # dW accumulators (two per DSP48 when packed)
    return {"one": 1, "lo": lo, "li_lo": li * lo, "macs": macs if dsp else 0, "fabric_dw": 0 if dsp else macs,
            "fabric_dx": 0 if array else li * lo // g.dx_passes, "array_lo": lo if array else 0,
            "array_li_lo": li * lo if array else 0}


def _wmem(plan, grp):
    g = plan.wmem_geometry(grp[0])
    U = g.sweep.update_lanes
    bits = sum(b for _, b in g.optimizer.fields)
    return {"one": 1, "li_lo": g.bank.lanes_in * g.bank.lanes_out, "U": U, "U_bits": U * bits, "lo": g.bank.lanes_out}


def _rng(plan, grp):
    U = plan.layers[grp[0]].update_lanes
    return {"one": 1, "U": U}


def _bn_param(plan, grp):
    return {"one": 1, "div": plan.cfg.hw.div_steps}


def _output(plan, grp):
    n = plan.loss_lanes
    return {"one": 1, "n": n, "n_div": n * plan.cfg.hw.div_steps}


def _top(plan, grp):
    LP = plan.layers
    li = max(lp.lanes_in for lp in LP)
    lo = max(lp.lanes_out for lp in LP)
    ydx_w = max(lp.lanes_out * max(lp.widths["y"], lp.widths["dx"]) for lp in LP)
    array = plan.po2_array(len(LP) - 1) and plan._dx_dsp
    return {"one": 1, "li": li, "lo": lo, "ydx_w": ydx_w, "fabric_li": 0 if array else li}


def _io(plan, grp):
    return {"one": 1, "layers": len(plan.layers)}


def _code_window(plan, grp):
    """``rtl_gen.code_window.CodeWindow``: ``lo (k - 1)`` field bits compared per tracked beat, a ring of ``groups``
    such entries (its tail multiplexer only when ``groups > 1``) and the rewrite of ``lo x lanes_b`` codes."""
    lp = plan.layers[grp[0]]
    fields = lp.lanes_out * (plan.p.k - 1)
    return {"one": 1, "fields": fields, "ring": fields if lp.groups > 1 else 0, "ring_bits": fields * lp.groups,
            "codes": lp.lanes_out * lp.lanes_b}


#: kind -> (features of an instance, resource -> the feature names its fit may use)
FEATURES: Mapping[str, tuple[Callable, Mapping[str, tuple[str, ...]]]] = {
    "engine": (_engine, {"LUT": ("li_lo", "lo"), "FF": ("li_lo", "lo", "li", "one"), "DSP": ("one",)}),
    "bn_fwd": (_bn, {"LUT": ("lo", "lo_div", "one"), "FF": ("lo", "lo_div", "one"), "DSP": ("lo", "one"),
                     "BRAM36": ("one",)}),
    "bn_bwd": (_bn, {"LUT": ("lo", "po2", "ser", "one"), "FF": ("lo", "lo_div", "lo_mul", "one"), "DSP": ("po2", "one"),
                     "BRAM36": ("one",)}),
    "po2": (_bn, {"LUT": ("lo", "po2", "lo_mul"), "FF": ("lo", "po2", "lo_mul"), "DSP": ("po2", "one"),
                  "BRAM36": ("one",)}),
    "po2b": (_po2b, {"LUT": ("li_lo", "macs", "lo", "fabric_dx"), "FF": ("array_li_lo", "li_lo", "macs", "lo"),
                     "DSP": ("macs", "array_lo"), "BRAM36": ("one",)}),
    "wmem": (_wmem, {"LUT": ("li_lo", "U_bits", "one"), "FF": ("li_lo", "U_bits", "one"), "DSP": ("one",)}),
    "rng": (_rng, {"LUT": ("U", "one"), "FF": ("U", "one"), "DSP": ("one",)}),
    "bn_param": (_bn_param, {"LUT": ("div", "one"), "FF": ("div", "one"), "DSP": ("one",), "BRAM36": ("one",)}),
    "logit": (_output, {"LUT": ("n", "n_div", "one"), "FF": ("n", "n_div", "one"), "DSP": ("n",),
                        "BRAM36": ("one",)}),
    "loss": (_output, {"LUT": ("n", "n_div", "one"), "FF": ("n", "n_div", "one"), "DSP": ("n",),
                       "BRAM36": ("one",)}),
    "top": (_top, {"LUT": ("ydx_w", "li", "fabric_li", "one"), "FF": ("ydx_w", "li", "fabric_li", "one"),
                   "DSP": ("one",)}),
    "io": (_io, {"LUT": ("one",), "FF": ("one",), "DSP": ("one",), "BRAM36": ("one",)}),
    "code_window": (_code_window, {"LUT": ("fields", "ring", "codes"), "FF": ("ring_bits",), "DSP": ("one",)}),
}


def _name(prefix: str, grp: list[int]) -> str:
    return prefix + "_".join(map(str, grp))


def unit_instances(plan) -> list[UnitInstance]:
    """Every unit the generator builds for ``plan``, with the part name ``rtl_gen.synth.part_texts`` gives it (the
    group of layers it serves: ``engine0_1_2_3_4``); the small parts (readers, writers, CSR, sequencer) are one
    ``io`` instance."""
    L = list(range(len(plan.layers)))
    out = []

    def add(kind, part, grp):
        fn, _ = FEATURES[kind]
        inst = UnitInstance(kind, part, list(grp), fn(plan, grp))
        if kind in BRAM_FROM_SHAPES:
            inst.memories = memory_shapes(plan, kind, grp)
        out.append(inst)

    for grp in plan.unit_groups["engine"]:
        add("engine", _name("engine", grp), grp)
    for grp in plan.unit_groups["bn"]:
        add("bn_fwd", _name("bn_fwd", grp), grp)
        add("bn_bwd", _name("bn_bwd", grp), grp)
        add("po2", _name("po2_", grp), grp)
    for grp in plan.backward_groups:
        add("po2b", _name("po2b_", grp), grp)
    for grp in plan.wmem_groups:
        add("wmem", _name("wmem", grp), grp)
    for grp in plan.rng_groups:
        add("rng", _name("rng", grp), grp)
    add("bn_param", _name("bn_param", L), L)
    add("logit", "logit", L)
    add("loss", "loss", L)
    add("top", TOP_PART, L)
    add("io", "io", L)
    for n, grp in enumerate(plan.code_window_groups):  # hw.dw_window: one CodeWindow per layer geometry
        add("code_window", f"code_window_pool{n}", grp)
    return out


# -- fitting ----------------------------------------------------------------------------------------------------


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients, by trying every subset of the (few) columns: the smallest
    relative residual among the subsets whose unconstrained solution is non-negative."""
    n = X.shape[1]
    best, best_err = np.zeros(n), np.inf
    scale = np.maximum(np.abs(y), 1.0)  # relative errors: small and large instances count alike
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            A = X[:, cols] / scale[:, None]
            coef, *_ = np.linalg.lstsq(A, y / scale, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((A @ coef - y / scale) ** 2))
            if err < best_err - 1e-12:
                best_err = err
                best = np.zeros(n)
                best[list(cols)] = coef
    return best


def _lutram(inst: UnitInstance, res: str) -> int:
    """LUTs (and the read port's register bits, FF) of the instance's memories that go to distributed RAM."""
    if res == "LUT":
        return sum(m.lutram for m in inst.memories)
    if res == "FF":
        return sum(m.width for m in inst.memories if m.lutram)
    return 0


@dataclass
class Fit:
    features: tuple[str, ...]
    coef: tuple[float, ...]

    def __call__(self, feats: Mapping[str, float]) -> float:
        return float(sum(c * feats[f] for f, c in zip(self.features, self.coef, strict=True)))


class ResourceModel:
    """Per-kind fits from a calibration table; :meth:`predict` gives a plan's resources per unit and in total."""

    def __init__(self, calibration: dict, *, samples: dict | None = None, strict: bool = True):
        self.calibration = calibration
        self.samples = self._samples(calibration) if samples is None else samples
        self.fits: dict[str, dict[str, Fit]] = {}
        for kind, (_, allowed) in FEATURES.items():
            rows = self.samples.get(kind, [])
            if not rows:
                if not strict:
                    continue
                raise ValueError(f"the calibration has no synthesised {kind!r} unit")
            self.fits[kind] = {}
            for res, names in allowed.items():
                X = np.array([[r["features"][f] for f in names] for r in rows], float)
                # LUT / FF: the fit covers the logic; small memories in LUTRAM are added from their shapes
                y = np.array([r["measured"][res] - _lutram(r["instance"], res) for r in rows], float)
                self.fits[kind][res] = Fit(names, tuple(float(c) for c in _nnls(X, y)))

    @staticmethod
    def _samples(calibration: dict) -> dict[str, list[dict]]:
        """Per kind: one sample per (point, instance): features and the measured resources (the sum of the
        instance's rows; all ``io`` rows of a point in one)."""
        from sim.config import apply_overrides, load_config

        from .top import SystemPlan

        out: dict[str, list[dict]] = {}
        for pname, point in calibration["points"].items():
            plan = SystemPlan(apply_overrides(load_config(point["preset"]), point["set"]))
            rows = point["rows"]
            kinds = point.get("kinds")
            for inst in unit_instances(plan):
                if kinds is not None and inst.kind not in kinds:
                    continue
                if inst.kind == "io":
                    mine = [r for r in rows if unit_kind(r["part"]) == "io"]
                else:
                    mine = [r for r in rows if r["part"] == inst.part]
                if not mine:
                    continue
                measured = {k: sum(r[k] for r in mine) for k in (*RESOURCES, "RAMB36E1", "RAMB18E1")}
                out.setdefault(inst.kind, []).append({"point": pname, "part": inst.part, "instance": inst,
                                                      "features": inst.features, "measured": measured})
        return out

    def predict_instance(self, inst: UnitInstance, family: str = "xc7") -> dict[str, float]:
        """The instance's resources; on a family with UltraRAM (``xcup``) also ``URAM``, the memories of
        :func:`memory_shapes` that :func:`boards.devices.uram_rule` sends there counted in URAM288 instead of
        BRAM36 (LUT, FF and DSP are the calibration's, synthesised for the xc7z020, whatever the family)."""
        fits = self.fits[inst.kind]
        out = {}
        for res in RESOURCES:
            if res == "BRAM36" and inst.kind in BRAM_FROM_SHAPES:
                out[res] = sum(m.mapped(family)["BRAM36"] for m in inst.memories)
            elif res in fits:
                out[res] = max(0.0, fits[res](inst.features)) + _lutram(inst, res)
            else:
                out[res] = 0.0
        if "BRAM36" in fits and inst.kind not in BRAM_FROM_SHAPES:
            out["BRAM36"] = round(2 * out["BRAM36"]) / 2  # whole RAMB18s
        if uram_rule(family) is not None:
            out["URAM"] = sum(m.mapped(family)["URAM"] for m in inst.memories)
        return out

    def predict(self, plan, family: str = "xc7") -> dict:
        """``{"units": [(instance, {resource: amount})], "total": {resource: amount}}`` for ``plan`` synthesised for
        ``family`` (``xcup`` adds ``URAM``: :meth:`predict_instance`)."""
        units = [(inst, self.predict_instance(inst, family)) for inst in unit_instances(plan)]
        total = {r: sum(u[1][r] for u in units) for r in units[0][1]}
        return {"units": units, "total": total}


@cache
def _load(path: str, mtime: float) -> ResourceModel:
    return ResourceModel(json.loads(Path(path).read_text()))


def load_model(path: str | Path = CALIBRATION_PATH) -> ResourceModel:
    """The model fitted on a calibration JSON (cached while the file is unchanged)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no resource calibration at {p}; run benchmarks/calibrate_resources.py")
    return _load(str(p.resolve()), p.stat().st_mtime)


# -- reporting ----------------------------------------------------------------------------------------------------


def calibration_errors(model: ResourceModel) -> list[dict]:
    """Per calibration sample and resource: model, synthesis, relative error and whether it is within the test's
    tolerance (10 % or :data:`FLOOR`)."""
    out = []
    for kind in KINDS:
        for s in model.samples.get(kind, []):
            pred = model.predict_instance(s["instance"])
            for res in RESOURCES:
                got, want = pred[res], s["measured"][res]
                out.append({"kind": kind, "point": s["point"], "part": s["part"], "resource": res, "model": got,
                            "synthesis": want, "error": (got - want) / want if want else (0.0 if not got else 1.0),
                            "ok": abs(got - want) <= max(TOLERANCE.get((kind, res), 0.10) * want, FLOOR[res])})
    return out


def leave_one_out(model: ResourceModel) -> list[dict]:
    """Each calibration point predicted by the model fitted on the other points (kinds with at least three samples):
    how far the fits carry beyond their data, unlike :func:`calibration_errors`."""
    out = []
    points = {s["point"] for rows in model.samples.values() for s in rows}
    for p in sorted(points):
        rest = {k: [s for s in rows if s["point"] != p] for k, rows in model.samples.items()}
        sub = ResourceModel(model.calibration, samples=rest, strict=False)
        for kind, rows in model.samples.items():
            if len(rows) < 3 or kind not in sub.fits:
                continue
            for s in rows:
                if s["point"] != p:
                    continue
                pred = sub.predict_instance(s["instance"])
                for res in RESOURCES:
                    got, want = pred[res], s["measured"][res]
                    out.append({"kind": kind, "point": p, "resource": res, "model": got, "synthesis": want,
                                "error": (got - want) / want if want else 0.0})
    return out


def format_calibration(model: ResourceModel) -> str:
    """A Markdown table: per unit kind, the calibration samples and the largest error of each resource."""
    errs = calibration_errors(model)
    lines = ["| unit | samples | " + " | ".join(f"{r} range (synthesis) | {r} worst error" for r in RESOURCES) + " |",
             "| --- | ---: | " + " | ".join("---: | ---:" for _ in RESOURCES) + " |"]
    for kind in KINDS:
        mine = [e for e in errs if e["kind"] == kind]
        if not mine:
            continue
        n = len({e["point"] for e in mine})
        cells = []
        for r in RESOURCES:
            rs = [e for e in mine if e["resource"] == r]
            lo, hi = min(e["synthesis"] for e in rs), max(e["synthesis"] for e in rs)
            worst = max(rs, key=lambda e: abs(e["model"] - e["synthesis"]))
            diff = worst["model"] - worst["synthesis"]
            rel = f"{100 * worst['error']:+.1f} %" if worst["synthesis"] else "-"
            cells.append(f"{_n(lo)}-{_n(hi)} | {_n(diff, sign=True)} ({rel})" if hi != lo
                         else f"{_n(lo)} | {_n(diff, sign=True)} ({rel})")
        lines.append(f"| {KIND_TITLES[kind]} | {n} | " + " | ".join(cells) + " |")
    loo = leave_one_out(model)
    if loo:
        lines += ["", "Leave one point out (kinds with 3+ samples; each point predicted by the fit on the others):", "",
                  "| unit | point | " + " | ".join(RESOURCES) + " |", "| --- | --- | " + " | ".join("---:" for _ in
                                                                                                RESOURCES) + " |"]
        for kind in KINDS:
            for p in sorted({e["point"] for e in loo if e["kind"] == kind}):
                es = {e["resource"]: e for e in loo if e["kind"] == kind and e["point"] == p}
                lines.append(f"| {KIND_TITLES[kind]} | {p} | " + " | ".join(
                    f"{_n(es[r]['model'])} vs {_n(es[r]['synthesis'])}" + (f" ({100 * es[r]['error']:+.0f} %)"
                                                                           if es[r]["synthesis"] else "")
                    for r in RESOURCES) + " |")
    bad = [e for e in errs if not e["ok"]]
    lines.append("")
    lines.append(f"{len(errs)} checks, {len(errs) - len(bad)} within 10 % or the floor "
                 f"({', '.join(f'{k} {v:g}' for k, v in FLOOR.items())}; "
                 + ", ".join(f"{k} {r}: {100 * t:.0f} %" for (k, r), t in TOLERANCE.items()) + ")")
    return "\n".join(lines)


def _n(x: float, sign: bool = False) -> str:
    s = f"{x:+,.1f}" if sign else f"{x:,.1f}"
    return s.removesuffix(".0")


def compare_synthesis(cfg, device: str = "xc7z020", *, model: ResourceModel | None = None, jobs: int = 1,
                      log=None) -> list[dict]:
    """Per unit of ``cfg``'s accelerator: the model's resources for ``device``'s family beside the unit-by-unit
    Yosys synthesis (:func:`rtl_gen.synth.synthesize_parts`, cached: after ``xnortrain generate --synth-by-unit
    --device DEVICE`` of the same configuration it only reads the cache). One row per unit instance (the ``io``
    parts in one) and a ``"total"`` row; each row has ``kind``, ``part``, ``model`` and ``synthesis`` dicts."""
    from boards.devices import get_device

    from . import synth
    from .top import Accelerator, SystemPlan

    dev = get_device(device)
    model = model or load_model()
    plan = SystemPlan(cfg)
    keys = RESOURCES + (("URAM",) if uram_rule(dev.family) is not None else ())
    measured: dict[str, dict] = {}
    for name, rep, _i, _n in synth.synthesize_parts(Accelerator(plan).verilog(), plan.name, device=dev, jobs=jobs):
        if log is not None:
            log(f"  {name}: {rep.resources['LUT']:,} LUT" + (" (cached)" if rep.cached else ""))
        measured[name] = {k: rep.resources.get(k, 0) for k in keys}
    rows = []
    for inst in unit_instances(plan):
        mine = [m for n, m in measured.items() if (unit_kind(n) == "io" if inst.kind == "io" else n == inst.part)]
        pred = model.predict_instance(inst, dev.family)
        rows.append({"kind": inst.kind, "part": inst.part, "model": {k: pred.get(k, 0) for k in keys},
                     "synthesis": {k: sum(m[k] for m in mine) for k in keys}})
    rows.append({"kind": "total", "part": "total", **{w: {k: sum(r[w][k] for r in rows) for k in keys}
                                                     for w in ("model", "synthesis")}})
    return rows


def format_comparison(rows: list[dict]) -> str:
    """A Markdown table of :func:`compare_synthesis`: per unit, model vs synthesis and the relative error."""
    keys = list(rows[0]["model"])
    lines = ["| unit | " + " | ".join(f"{k} model | {k} synthesis" for k in keys) + " |",
             "| --- | " + " | ".join("---: | ---:" for _ in keys) + " |"]
    for r in rows:
        cells = []
        for k in keys:
            m, y = r["model"][k], r["synthesis"][k]
            err = f" ({100 * (m - y) / y:+.0f} %)" if y and abs(m - y) > FLOOR.get(k, 0) else ""
            cells.append(f"{_n(m)} | {_n(y)}{err}")
        title = "**total**" if r["kind"] == "total" else KIND_TITLES[r["kind"]]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m rtl_gen.resource_model",
                                 description="the calibration table; with --config, the model against the "
                                             "unit-by-unit synthesis of that design")
    ap.add_argument("--config", help="a configuration TOML: compare its units with their Yosys synthesis")
    ap.add_argument("--device", default="xc7z020", help="die of the synthesis (xc7z020, xck26, xczu7ev)")
    ap.add_argument("--jobs", type=int, default=1, help="units synthesised at once when not cached")
    args = ap.parse_args(argv)
    if args.config is None:
        print(format_calibration(load_model()))
        return 0
    from sim.config import load_config

    rows = compare_synthesis(load_config(args.config), args.device, jobs=args.jobs,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_comparison(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
