"""Design-space exploration: the fewest cycles per training image that fit a device.

``xnortrain explore --config FILE --device xc7z020`` searches the ``[hw]`` lane parameters of the generator
(:data:`GRID`: engine lanes, dW / dX passes and so whether dX runs on the dW engine's DSP48 array or on fabric
adder trees, the po2, update, divider, multiplier and loss lanes) with the cycle model (:mod:`rtl_gen.cycle_model`)
and the calibrated resource model (:mod:`rtl_gen.resource_model`), keeps the designs that fit the device (LUT at
most :data:`LUT_SHARE` of the device, FF, BRAM36 and DSP48 within it, and UltraRAM on a die with it: the model
puts there the memories the synthesis sends there, :func:`boards.devices.uram_rule`) and reports the Pareto front of
cycles per image against LUT and against BRAM36. On UltraScale+ (``xck26``, ``xczu7ev``) LUT, FF and DSP are still
the xc7z020 calibration's: estimates for another family (docs/results.md).

Search. The cycle model builds units to ask their cycle counts (hundreds of ms per design) and a plan takes tens
of ms, so the full product of :data:`GRID` (about 300,000 designs) is not evaluated one by one. For every
combination of the *main* parameters (:data:`MAIN`: lanes_in, lanes_out, dw_passes, dx_passes) the design with the
configuration's own values of the *fine* parameters (:data:`FINE`) is evaluated, and then each fine parameter moved
alone to each of its values; every combination of fine values is then priced as the base plus the sum of the
moves (each fine parameter acts on its own phases and units, so the sum is close). The front's designs are then
evaluated again in full (a plan, :func:`~rtl_gen.cycle_model.step_cycles`, the resource model): every number
printed is exact for the two models. Invalid combinations are pruned by the
configuration's own checks (:class:`~sim.schema.ConfigError`).

Fixed: ``lanes_b = 1`` and ``dw_dsp = true`` (dW on DSP48s, two weights per slice): the resource model has no
calibration of the fabric dW arithmetic (``lanes_b > 1`` costs more LUTs than the passes it saves,
docs/results.md).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from boards.devices import DEVICES, Device, get_device, uram_rule
from sim.schema import ConfigError

__all__ = ["FINE", "GRID", "LUT_SHARE", "MAIN", "Design", "Exploration", "explore", "fast_cycles", "pareto"]

#: The LUT budget: a share of the device's LUTs (routing and timing closure need the rest).
LUT_SHARE = 0.70

#: The parameters searched and their values.
GRID: dict[str, tuple] = {
    "lanes_in": (32, 64, 128, 256),
    "lanes_out": (8, 16, 32, 64),
    "dw_passes": (1, 2, 4, 8, 16),
    "dx_passes": (1, 2, 4, 8),
    "po2_lanes": (1, 2, 4, 8, 16),
    "update_lanes": (8, 16, 32, 64),
    "div_steps": (1, 2, 4, 8),
    # 8 is left out: with 8 bits a cycle the po2 unit's sqrt2 multiplier closes at 96.5 MHz on the ECP5 proxy,
    # below the 100 MHz every unit must reach (docs/results.md, "The ZCU104 design"); div_steps 8 closes.
    "mul_steps": (1, 2, 4),
    "loss_lanes": (1, 2, 4, 8, 16),
}
MAIN = ("lanes_in", "lanes_out", "dw_passes", "dx_passes")
FINE = tuple(k for k in GRID if k not in MAIN)
#: Held at these values (the resource model is calibrated for them).
FIXED = {"lanes_b": 1, "dw_dsp": True, "dx_dsp": True}

RESOURCE_KEYS = ("LUT", "FF", "BRAM36", "DSP")


@dataclass
class Design:
    """One point of the search: its ``[hw]`` values, cycles per image and resources (model totals)."""

    hw: dict
    cycles: float
    resources: dict
    exact: bool = False
    units: list = field(default_factory=list)  # (kind, part, {resource: amount}) when exact

    def key(self) -> tuple:
        return tuple(self.hw[k] for k in GRID)

    def to_dict(self) -> dict:
        d = {"hw": dict(self.hw), "cycles_per_image": round(self.cycles, 2),
             "resources": {k: round(v, 1) for k, v in self.resources.items()}, "exact": self.exact}
        if self.units:
            d["units"] = [{"kind": k, "part": p, **{r: round(v, 1) for r, v in res.items()}}
                          for k, p, res in self.units]
        return d


def limits_of(device: Device) -> dict[str, float]:
    """The resource limits the explorer holds a design to on ``device``."""
    missing = [k for k in RESOURCE_KEYS if k not in device.limits]
    if missing:
        xilinx = ", ".join(d.name for d in DEVICES.values() if all(k in d.limits for k in RESOURCE_KEYS))
        raise ValueError(f"--device {device.name}: no {'/'.join(missing)} limit (the resource model counts Xilinx "
                         f"LUT6 / FF / BRAM36 / DSP48 primitives); devices it can check: {xilinx}")
    # UltraRAM too where the die has it: the model puts the memories synthesis sends there (boards.devices.uram_rule)
    keys = RESOURCE_KEYS + (("URAM",) if uram_rule(device.family) is not None and "URAM" in device.limits else ())
    lim = {k: float(device.limits[k]) for k in keys}
    lim["LUT"] = math.floor(LUT_SHARE * lim["LUT"])
    return lim


def fits(resources: dict, limits: dict) -> bool:
    """Whether ``resources`` are within every limit of :func:`limits_of`."""
    return all(resources[k] <= limits[k] for k in limits)


def over(resources: dict, limits: dict) -> list[str]:
    return [f"{k} {resources[k]:,.0f} > {limits[k]:,.0f}" for k in limits if resources[k] > limits[k]]


# -- the cycle model, with the unit-building phases memoised -------------------------------------------------------


class _Cycles:
    """``step_cycles(plan).per_image`` without the infer phases, with every phase memoised on the lanes it depends
    on for one base configuration (the cycle model's phase functions build units to ask their cycle counts): a
    phase of layer ``j`` reads that layer's geometry and the BN / po2 unit layers (the ``lanes_out`` of every layer
    decide the unit groups and envelopes), ``fwd`` also the dividers and loss lanes, ``bwd`` the po2 and multiplier
    lanes, ``dx`` / ``upd`` the passes (and ``upd`` the update lanes and dividers). The test compares it with
    :func:`~rtl_gen.cycle_model.step_cycles` on designs that move every searched field."""

    def __init__(self):
        self.memo: dict = {}

    def __call__(self, plan) -> float:
        from . import cycle_model as cm

        h = plan.cfg.hw
        lis = tuple(lp.lanes_in for lp in plan.layers)
        los = tuple(lp.lanes_out for lp in plan.layers)
        passes = tuple((lp.dw_passes, lp.dx_passes, lp.lanes_b) for lp in plan.layers)
        keys = {
            "fwd": (lis, los, h.div_steps, plan.loss_lanes),
            "rfwd": (lis, los, h.div_steps, plan.loss_lanes),
            "bwd": (los, h.po2_lanes, h.mul_steps),
            "dx": (lis, los, passes, h.dx_dsp, h.dw_dsp),
            "upd": (lis, los, passes, h.dx_dsp, h.dw_dsp, tuple(lp.update_lanes for lp in plan.layers), h.div_steps),
            "undo": (lis, los, tuple(lp.update_lanes for lp in plan.layers)),
        }
        fns = {"fwd": cm.forward_cycles, "rfwd": cm.forward_cycles, "bwd": cm.backward_cycles, "dx": cm.dx_cycles,
               "upd": cm.update_cycles, "undo": cm.undo_cycles}
        total = 0
        for kind, j in plan.phases():
            key = (kind, j, keys[kind])
            if key not in self.memo:
                self.memo[key] = int(fns[kind](plan, j))
            total += self.memo[key]
        return (total + 2) / plan.batch


class _SearchPlan:
    """A :class:`~rtl_gen.top.SystemPlan` without its host-path quantities (most of its construction time), for the
    search; the front is re-evaluated with the real plan."""

    cls = None

    @classmethod
    def make(cls, cfg):
        if cls.cls is None:
            from .top import SystemPlan

            class SearchPlan(SystemPlan):
                def _declare_quantities(self):
                    pass

            cls.cls = SearchPlan
        return cls.cls(cfg)


def fast_cycles(plan, memo: _Cycles | None = None) -> float:
    """Cycles per training image of ``plan`` (the cycle model's ``per_image``), memoised across calls with ``memo``."""
    return (memo or _Cycles())(plan)


# -- the search -------------------------------------------------------------------------------------------------


@dataclass
class Exploration:
    device: Device
    limits: dict
    base_hw: dict
    evaluated: int = 0
    candidates: int = 0  # combinations priced (main x fine)
    fitting: int = 0
    fronts: dict = field(default_factory=dict)  # "LUT" / "BRAM36" -> [Design] (exact), by cycles
    best: Design | None = None
    base: Design | None = None  # the configuration as given
    cloud: np.ndarray | None = None  # (n, 3): cycles, LUT, BRAM36 of a sample of the fitting priced designs
    seconds: float = 0.0
    limiting: list = field(default_factory=list)  # what keeps the fastest priced designs out

    def to_dict(self) -> dict:
        return {
            "device": self.device.name, "limits": self.limits, "lut_share": LUT_SHARE, "grid": GRID, "fixed": FIXED,
            "evaluated": self.evaluated, "priced": self.candidates, "fitting": self.fitting,
            "seconds": round(self.seconds, 1),
            "base": self.base.to_dict() if self.base else None,
            "best": self.best.to_dict() if self.best else None,
            "fronts": {k: [d.to_dict() for d in v] for k, v in self.fronts.items()},
            "limiting": self.limiting,
        }


class _Evaluator:
    def __init__(self, cfg, model, family: str = "xc7"):
        self.cfg = cfg
        self.model = model
        self.family = family
        self.cycles = _Cycles()
        self.count = 0

    def plan(self, hw: dict, *, exact: bool = False):
        from sim.config import apply_overrides

        from .top import SystemPlan

        try:
            cfg = apply_overrides(self.cfg, {f"hw.{k}": v for k, v in hw.items()})
            return SystemPlan(cfg) if exact else _SearchPlan.make(cfg)
        except ConfigError:
            return None

    def __call__(self, hw: dict, *, exact: bool = False) -> Design | None:
        plan = self.last_plan = self.plan(hw, exact=exact)
        self.count += 1
        if plan is None:
            return None
        pred = self.model.predict(plan, self.family)
        if exact:
            from .cycle_model import step_cycles

            cyc = step_cycles(plan).per_image
            units = [(i.kind, i.part, r) for i, r in pred["units"]]
        else:
            cyc, units = self.cycles(plan), []
        return Design(dict(hw), cyc, dict(pred["total"]), exact, units)


def pareto(points: list[Design], res: str) -> list[Design]:
    """The designs no other design beats in both cycles per image and ``res`` (ties: the first), by cycles."""
    out: list[Design] = []
    for d in sorted(points, key=lambda d: (d.cycles, d.resources[res])):
        if not out or d.resources[res] < out[-1].resources[res]:
            out.append(d)
    return out


def explore(cfg, device: str | Device, *, model=None, grid: dict | None = None, log: Callable | None = None,
            max_front: int = 40) -> Exploration:
    """Search ``grid`` (default :data:`GRID`) for ``cfg`` on ``device``; ``log`` gets progress lines."""
    from .plan import check_generator_support
    from .resource_model import load_model

    check_generator_support(cfg)  # what no choice of lanes changes is said as it is, not as "nothing fits"
    t0 = time.perf_counter()
    dev = get_device(device)
    limits = limits_of(dev)
    grid = dict(GRID if grid is None else grid)
    model = model or load_model()
    ev = _Evaluator(cfg, model, dev.family)
    keys = tuple(limits)
    log = log or (lambda _m: None)
    h = cfg.hw
    base_hw = {k: getattr(h, k) for k in GRID}
    result = Exploration(dev, limits, base_hw)
    result.base = ev({**base_hw, **FIXED}, exact=True) if ev.plan({**base_hw, **FIXED}) else None
    fine = [k for k in FINE if k in grid]
    mains = list(itertools.product(*(grid[k] for k in MAIN)))
    log(f"explore: {len(mains)} combinations of {', '.join(MAIN)}; {', '.join(fine)} priced by single moves "
        f"(device {dev.name}: LUT <= {limits['LUT']:,.0f} ({LUT_SHARE:.0%}), BRAM36 <= {limits['BRAM36']:g}, "
        f"DSP <= {limits['DSP']:g}" + (f", URAM <= {limits['URAM']:g}" if "URAM" in limits else "") + ")")
    priced = []  # (cycles, resources[4], hw) arrays per main combination
    seen_main = set()
    best_seen = math.inf
    last = time.perf_counter()
    for n, vals in enumerate(mains):
        hw0 = {**dict(zip(MAIN, vals, strict=True)), **{k: base_hw[k] for k in fine}}
        if time.perf_counter() - last > 10:
            last = time.perf_counter()
            log(f"  [{n}/{len(mains)}] {ev.count} designs evaluated, {result.fitting} priced designs fit; fastest "
                f"so far {best_seen:,.0f} cycles/image")
        base = ev({**hw0, **FIXED})
        if base is None:
            continue
        # dX on the dW array ignores dx_passes: evaluate one of them (the configuration's, when it is in the grid)
        plan = ev.last_plan
        if plan.po2_array(len(plan.layers) - 1) and plan._dx_dsp:
            if base_hw["dx_passes"] in grid["dx_passes"] and vals[3] != base_hw["dx_passes"]:
                continue
            mk = (vals[0], vals[1], vals[2])
            if mk in seen_main:
                continue
            seen_main.add(mk)
        if base.resources["DSP"] > limits["DSP"] or base.resources["LUT"] > 1.5 * limits["LUT"]:
            continue  # the fine parameters move neither far enough
        moves = []  # per fine parameter: [(value, dcycles, dres)]
        for k in fine:
            opts = []
            for v in grid[k]:
                if v == hw0[k]:
                    opts.append((v, 0.0, np.zeros(len(keys))))
                    continue
                d = ev({**hw0, k: v, **FIXED})
                if d is not None:
                    opts.append((v, d.cycles - base.cycles,
                                 np.array([d.resources[r] - base.resources[r] for r in keys])))
            moves.append(opts)
        combos = list(itertools.product(*moves))
        cyc = base.cycles + np.array([sum(o[1] for o in c) for c in combos])
        res = np.array([base.resources[r] for r in keys]) + np.array([sum(o[2] for o in c) for c in combos])
        lim = np.array([limits[r] for r in keys])
        ok = np.all(res <= lim, axis=1)
        result.candidates += len(combos)
        result.fitting += int(ok.sum())
        if not ok.any():
            i = int(np.argmin(cyc))
            priced.append((cyc[i], res[i], {**hw0, **{k: c[0] for k, c in zip(fine, combos[i], strict=True)}}, False))
            continue
        for i in np.flatnonzero(ok):
            priced.append((cyc[i], res[i], {**hw0, **{k: c[0] for k, c in zip(fine, combos[i], strict=True)}}, True))
        best_seen = min(best_seen, float(cyc[ok].min()))
    result.evaluated = ev.count
    fit_pts = [Design(hw, float(c), dict(zip(keys, map(float, r), strict=True))) for c, r, hw, f in priced
               if f]
    if fit_pts:
        arr = np.array([[d.cycles, d.resources["LUT"], d.resources["BRAM36"]] for d in fit_pts])
        step = max(1, len(arr) // 4000)
        result.cloud = arr[::step]
    # the limits that keep faster designs out: the fastest priced designs that do not fit
    faster = sorted((p for p in priced if not p[3] and (not fit_pts or p[0] < min(d.cycles for d in fit_pts))),
                    key=lambda p: p[0])[:20]
    counts: dict[str, int] = {}
    for _, r, _, _ in faster:
        for k, v, lim in zip(keys, r, (limits[x] for x in keys), strict=True):
            if v > lim:
                counts[k] = counts.get(k, 0) + 1
    result.limiting = [f"{k}: {v} of the {len(faster)} fastest priced designs that do not fit" for k, v in
                       sorted(counts.items(), key=lambda kv: -kv[1])]
    # fronts on the priced values, then every front design exactly
    exact: dict[tuple, Design] = {}
    for res in ("LUT", "BRAM36"):
        front = pareto(fit_pts, res)
        if len(front) > max_front:  # keep the fastest and an even spread of the rest
            idx = sorted(set(np.linspace(0, len(front) - 1, max_front).round().astype(int)))
            front = [front[i] for i in idx]
        for d in front:
            k = d.key()
            if k not in exact:
                e = ev({**d.hw, **FIXED}, exact=True)
                if e is not None:
                    exact[k] = e
        log(f"  {res} front: {len(front)} designs re-evaluated exactly")
    exact_fit = [d for d in exact.values() if fits(d.resources, limits)]
    for res in ("LUT", "BRAM36"):
        result.fronts[res] = pareto(exact_fit, res)
    if exact_fit:
        result.best = min(exact_fit, key=lambda d: (round(d.cycles, 6), d.resources["LUT"]))
    result.evaluated = ev.count
    result.seconds = time.perf_counter() - t0
    return result


# -- output -----------------------------------------------------------------------------------------------------

_SHORT = {"lanes_in": "li", "lanes_out": "lo", "dw_passes": "dw", "dx_passes": "dx", "po2_lanes": "po2",
          "update_lanes": "upd", "div_steps": "div", "mul_steps": "mul", "loss_lanes": "loss"}


def _pct(v: float, limit: float) -> str:
    return f"{100 * v / limit:.0f}%"


def format_front(result: Exploration, res: str) -> str:
    dev = result.device.limits
    lines = [f"Pareto front, cycles per image against {res} ({result.device.name}):",
             f"  {'cycles/img':>10} {'LUT':>14} {'FF':>8} {'BRAM36':>12}"
             + (f" {'URAM':>10}" if "URAM" in result.limits else "") + f" {'DSP':>10}  "
             + " ".join(f"{_SHORT[k]:>4}" for k in GRID)]
    for d in result.fronts.get(res, []):
        r = d.resources
        mark = " *" if d is result.best or (result.best and d.key() == result.best.key()) else ""
        lines.append(f"  {d.cycles:>10,.0f} {r['LUT']:>7,.0f} ({_pct(r['LUT'], dev['LUT']):>4}) {r['FF']:>8,.0f} "
                     f"{r['BRAM36']:>5.1f} ({_pct(r['BRAM36'], dev['BRAM36']):>4}) "
                     + (f"{r['URAM']:>4.0f} ({_pct(r['URAM'], dev['URAM']):>4}) " if "URAM" in result.limits else "")
                     + f"{r['DSP']:>4.0f} ({_pct(r['DSP'], dev['DSP']):>4})  "
                     + " ".join(f"{d.hw[k]:>4}" for k in GRID) + mark)
    return "\n".join(lines)


def format_text(result: Exploration) -> str:
    lim = result.limits
    out = [f"explore on {result.device.name}: limits LUT {lim['LUT']:,.0f} ({LUT_SHARE:.0%} of "
           f"{result.device.limits['LUT']:,}), FF {lim['FF']:,.0f}, BRAM36 {lim['BRAM36']:g}, DSP {lim['DSP']:g}"
           + (f", URAM {lim['URAM']:g}" if "URAM" in lim else "") + "; "
           f"{result.evaluated:,} designs evaluated, {result.candidates:,} priced, {result.fitting:,} fit "
           f"({result.seconds:.0f} s)"]
    if result.base is not None:
        b = result.base
        verdict = "fits" if fits(b.resources, lim) else "does not fit: " + ", ".join(over(b.resources, lim))
        out.append(f"the configuration as given: {b.cycles:,.0f} cycles/image, LUT {b.resources['LUT']:,.0f}, "
                   f"BRAM36 {b.resources['BRAM36']:.1f}, "
                   + (f"URAM {b.resources['URAM']:.0f}, " if "URAM" in lim else "")
                   + f"DSP {b.resources['DSP']:.0f} ({verdict})")
    out += ["", format_front(result, "LUT"), "", format_front(result, "BRAM36"), ""]
    if result.best is None:
        out.append("no design of the grid fits the device")
    else:
        b = result.best
        out.append(f"fastest that fits (*): {b.cycles:,.0f} cycles/image: "
                   + ", ".join(f"hw.{k}={b.hw[k]}" for k in GRID))
    if result.limiting:
        out.append("what keeps faster designs out: " + "; ".join(result.limiting))
    out.append(f"(columns: {', '.join(f'{v} = hw.{k}' for k, v in _SHORT.items())}; lanes_b = 1, dw_dsp and dx_dsp "
               "on; resources from rtl_gen.resource_model, cycles from rtl_gen.cycle_model)")
    return "\n".join(out)


def best_overrides(design: Design) -> list[str]:
    return [f"hw.{k}={v}" for k, v in {**design.hw, **FIXED}.items()]


def write_best(cfg, design: Design, path) -> str:
    """The input configuration with the design's ``[hw]`` values, as TOML (``sim.config.load_config`` reads it)."""
    from pathlib import Path

    from sim.config import apply_overrides

    text = apply_overrides(cfg, {f"hw.{k}": v for k, v in {**design.hw, **FIXED}.items()}).to_toml()
    Path(path).write_text(text)
    return text


def plot(result: Exploration, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, res, col in ((axes[0], "LUT", 1), (axes[1], "BRAM36", 2)):
        if result.cloud is not None:
            ax.scatter(result.cloud[:, col], result.cloud[:, 0], s=3, c="0.8", label="fitting designs (priced)")
        f = result.fronts.get(res, [])
        if f:
            ax.plot([d.resources[res] for d in f], [d.cycles for d in f], "o-", c="C0", ms=4, label="Pareto front")
        if result.best is not None:
            ax.plot([result.best.resources[res]], [result.best.cycles], "*", c="C3", ms=14, label="fastest")
        if result.base is not None:
            ax.plot([result.base.resources[res]], [result.base.cycles], "s", c="C2", ms=7, label="configuration")
        ax.axvline(result.limits[res], c="C3", ls="--", lw=1)
        ax.set_xlabel(f"{res} (limit {result.limits[res]:,.0f})")
        ax.set_ylabel("cycles per training image")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"design-space exploration on {result.device.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
