"""Running the generated accelerator in simulation and checking it against the bit-exact model.

- :func:`run_system`: one cocotb run of ``tb/system_tb.py`` on the whole accelerator (Verilator with VPI; the
  host driver on a cocotb transport, with random stalls and backpressure when asked): the testbenches' runner;
- :func:`verify` (``xnortrain verify``): build the accelerator, run training steps on real batches through the host
  driver, compare every read-back quantity with :class:`sim.hw.model.HwModel` after every step.

Training on the accelerator over whole epochs is :mod:`host.train_target` on :mod:`host.simboard`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rtl_gen.toolchain import COCOTB_MODEL_OPT, build_root, run_cocotb

__all__ = ["VerifyResult", "run_system", "verify", "verify_main", "check_data_arg"]


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
    """Build the accelerator for ``cfg`` and run ``tb/system_tb.py`` in ``mode``; returns its report.

    ``lr`` (one learning rate for every step) or ``lrs`` (one per step) and ``progress`` (one per step, the
    iir alpha decay's position) give the schedule of ``mode="train"``, default the configuration's initial rate
    at progress 0. ``state``: a :meth:`sim.hw.model.HwModel.state_dict` (e.g. of a model trained in Python) that
    the run starts from, restored into the model and the accelerator, instead of the power-on state.
    ``tb_params``: more testbench parameters (tb/system_tb.py), e.g. ``infer_n`` for ``mode="infer"``.

    ``model_overrides`` (for tests of the comparison itself) give the testbench's bit-exact model a configuration
    that differs from the hardware's by these ``key=value`` settings: a setting the datapath depends on must then
    show up as a mismatch (the way to check that the comparison can fail).

    Raises :class:`rtl_gen.toolchain.CocotbFailure` when the testbench fails (a mismatch, a hang); the
    report written so far is then in the exception's ``report`` attribute.
    """
    from rtl_gen.toolchain import CocotbFailure
    from rtl_gen.top import Accelerator, SystemPlan

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
        from rtl_gen.cycle_model import step_cycles

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
    from rtl_gen.cycle_model import step_cycles
    from rtl_gen.toolchain import CocotbFailure
    from rtl_gen.top import SystemPlan

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


def verify_main(args) -> int:
    """``xnortrain verify --config FILE --steps N [--data PATH]``: exit status 0 only when every step
    matched, 4 (a mismatch) when the comparison failed or the simulation did not finish the steps."""
    from host.common import EXIT_MISMATCH, EXIT_OK, build_config

    cfg = build_config(args)
    check_data_arg(getattr(args, "data", None))
    resources = _energy_resources(getattr(args, "energy_estimate", None))
    res = verify(cfg, int(args.steps), data=getattr(args, "data", None))
    if res.ok and resources is not None:
        from rtl_gen.top import SystemPlan

        from .energy_estimate import estimate_energy, measure_activity

        plan = SystemPlan(cfg)
        est = estimate_energy(resources, measure_activity(cfg), clock_mhz=plan.description().clock_mhz,
                              batch=plan.batch)
        print(est.format_text())
    return EXIT_OK if res.ok else EXIT_MISMATCH


def _energy_resources(path) -> dict | None:
    """``verify --energy-estimate REPORT_JSON``: the resources of a generate report, read before anything runs."""
    if path is None:
        return None
    from host.common import UserError

    from .energy_estimate import resources_from_report

    try:
        return resources_from_report(path)
    except FileNotFoundError:
        raise UserError(f"--energy-estimate {path}: no such file (a `xnortrain generate` report.json)") from None
    except (ValueError, OSError) as e:
        raise UserError(f"--energy-estimate {e}") from None


def check_data_arg(data) -> None:
    """``verify --data``: an ``.npz`` file holding ``x`` and ``y``, or a dataset folder; checked before the
    accelerator is elaborated (minutes), so a wrong path fails at once with one line."""
    from host.common import UserError

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
