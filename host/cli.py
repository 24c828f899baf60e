"""The ``xnortrain`` command line.

Every subcommand builds one :class:`sim.config.Config` from ``--model`` (a
preset name) or ``--config`` (a TOML file), then ``--scheme``, ``--optimizer``
and the other shortcuts, then ``--set key=value`` overrides, in that order.
User mistakes print one line and exit with status 2; no traceback. The exit
statuses (``EXIT_*`` below, the one definition every command uses) are listed
in ``xnortrain --help`` and README.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from boards.devices import xilinx_devices
from host.common import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_TOOL,
    EXIT_USER_ERROR,
    UserError,
    build_config,
)
from host.common import add_config_args as _add_config_args
from host.common import output_file as _output_file
from host.common import write_json as _write_json
from sim.config import Config, ConfigError, tomllib


def cmd_config(args) -> int:
    cfg = build_config(args)
    print(cfg.to_toml(), end="")
    return 0


_TRAIN_CONFIG_OPTIONS = ("model", "config", "scheme", "optimizer", "batch_size", "epochs", "seed", "max_steps",
                         "overrides")
# --optimizer with --arith hw: the bit-exact model's optimiser (hw.optimizer) of the same family.
_HW_OPTIMIZER = {"switch": "switch", "bop": "bop", "iir": "iir", "sgdm": "sgd"}


def _train_config(args, arith: str, base: Config | None = None) -> Config:
    """The configuration of ``xnortrain train``: ``--optimizer`` picks ``hw.optimizer`` with ``--arith hw``.
    ``base``: a resumed run's configuration, which the options change (unless --model / --config replace it)."""
    if arith == "hw" and args.optimizer:
        hw_opt = _HW_OPTIMIZER.get(args.optimizer)
        if hw_opt is None:
            raise UserError(
                f"--optimizer {args.optimizer} has no hardware equivalent with --arith hw (the bit-exact model "
                "trains with switch, bop, iir or sgdm = hw sgd with momentum)"
            )
        args = argparse.Namespace(**{**vars(args), "overrides": [f"hw.optimizer={hw_opt}", *args.overrides]})
    cfg = build_config(args, base)
    if arith == "hw":
        cfg = _hw_settings(cfg, args)
    if arith == "hw" and args.optimizer == "sgdm" and cfg.hw.sgd_momentum_shift == 0:
        raise UserError("--optimizer sgdm with --arith hw is hw sgd with momentum, but hw.sgd_momentum_shift = 0 "
                        "(no momentum); use --set hw.optimizer=sgd for plain sgd")
    return cfg


_HW_ARITH = ("the hardware arithmetic is fixed (docs/arithmetic.md): L1 batch normalisation, power-of-two "
             "gradient codes of approx.dy_bits bits, sign weight gradients, integer state")
_HW_OPT = "the hardware optimiser (hw.optimizer, hw.* fields) has no such setting"
#: float-reference fields that do nothing with the hardware arithmetic: what the hardware does instead
_HW_FIXED = {
    "approx.scheme": _HW_ARITH, "approx.bn": _HW_ARITH, "approx.dy": _HW_ARITH, "approx.dw": _HW_ARITH,
    "approx.storage": _HW_ARITH,
    "approx.bn_eps": "the hardware's L1 batch normalisation divides by the channel's mean |x| with no epsilon",
    "e2train.psg": "the hardware takes sgn(dW) from the power-of-two codes (hw.dw_window), not from predictors",
    "e2train.psg_msb_bits": "the hardware has no predictive sign gradient (e2train.psg)",
    "e2train.psg_beta": "the hardware has no predictive sign gradient (e2train.psg)",
    "optimizer.clip": "the hardware's weights are signs (and hw.sgd_latent_bits latent integers), never clipped",
    "optimizer.beta_optimizer": "the hardware updates beta with its own sign EMAs (hw.beta_momentum_shift)",
    "optimizer.adam.beta1": _HW_OPT, "optimizer.adam.beta2": _HW_OPT, "optimizer.adam.eps": _HW_OPT,
    "optimizer.sgdm.weight_decay": _HW_OPT, "optimizer.bop.tau": "the hardware's bop flips at hw.bop_threshold",
    "optimizer.switch.mode": "the hardware's switch optimiser is the accumulate mode (hw.switch_*)",
    "optimizer.switch.momentum": _HW_OPT, "optimizer.switch.sigma_prime": _HW_OPT,
}


def _shift_of(rate: float, lo: int, hi: int) -> int | None:
    """``s`` with ``rate == 2**-s`` and lo <= s <= hi, else None."""
    import math

    s = -math.log2(rate) if rate > 0 else math.inf
    return int(s) if s == int(s) and lo <= s <= hi else None


#: float-reference fields with a hardware twin: (hw field, value or None when the twin cannot hold it, the rule)
_HW_TWIN = {
    "optimizer.switch.lam": ("switch_lambda", lambda v: v, "the same probability"),
    "optimizer.switch.sigma": ("switch_sigma", lambda v: v, "the same fraction"),
    "optimizer.switch.undo": ("switch_undo", lambda v: v, "the same switch"),
    "optimizer.switch.acc_cutoff": ("switch_cutoff", lambda v: v, "the same saturation"),
    "approx.bn_momentum": ("running_shift", lambda v: _shift_of(v, 1, 12), "a rate 2**-s, s in 1..12"),
    "optimizer.sgdm.momentum": ("sgd_momentum_shift", lambda v: _shift_of(1 - v, 1, 12), "1 - momentum = 2**-s"),
    "optimizer.bop.gamma": ("bop_shift", lambda v: _shift_of(v, 1, 14), "a rate 2**-s, s in 1..14"),
    "optimizer.iir.gamma": ("iir_gamma_shift", lambda v: _shift_of(v, 1, 14), "a rate 2**-s, s in 1..14"),
    "optimizer.iir.alpha": ("iir_alpha_shift", lambda v: _shift_of(v, 1, 20), "a rate 2**-s, s in 1..20"),
}


def _hw_reference(cfg: Config) -> Config | None:
    """What the float-only fields of ``cfg`` would be had nobody set them: its preset, or the defaults."""
    from sim.config import PRESETS, config_from_dict, load_config

    try:
        if cfg.preset in PRESETS:
            return load_config(cfg.preset)
        d = cfg.to_dict()
        return config_from_dict({k: d[k] for k in ("model", "data", "hw") if k in d})
    except (ConfigError, ValueError):
        return None


def _hw_settings(cfg: Config, args) -> Config:
    """With the hardware arithmetic, every float-reference field that differs from the preset's (or default)
    value either maps onto its ``hw.*`` twin or is refused naming it and what the hardware does instead."""
    from sim.config import apply_overrides
    from sim.train_loop import _flatten

    ref = _hw_reference(cfg)
    if ref is None:
        return cfg
    now, was = _flatten(cfg.to_dict()), _flatten(ref.to_dict())
    explicit = {o.split("=", 1)[0].strip() for o in args.overrides if "=" in o}
    mapped = []
    for key in list(_HW_FIXED) + list(_HW_TWIN):
        if now.get(key) == was.get(key):
            continue
        value = now.get(key)
        given = f"{key} = {value!r}" + (" (--scheme)" if key == "approx.scheme" and args.scheme else "")
        if key in _HW_FIXED:
            raise UserError(f"{given} does nothing with the hardware arithmetic (--target sim|model|board): "
                            f"{_HW_FIXED[key]}; use --arith float for the float reference")
        twin, convert, rule = _HW_TWIN[key]
        hw_value = convert(value)
        if hw_value is None:
            raise UserError(f"{given}: its hardware twin hw.{twin} holds {rule}; give a value it can hold or set "
                            f"hw.{twin} instead")
        if f"hw.{twin}" in explicit and getattr(cfg.hw, twin) != hw_value:
            raise UserError(f"{given} and hw.{twin} = {getattr(cfg.hw, twin)!r} contradict each other (the first "
                            f"maps onto the second with the hardware arithmetic); give one")
        mapped.append(f"hw.{twin}={str(hw_value).lower() if isinstance(hw_value, bool) else hw_value}")
    return apply_overrides(cfg, mapped) if mapped else cfg


def _train_outputs(args, cfg: Config, arith: str, resume) -> tuple[Path | None, Path | None, Path | None]:
    """(--json, --plot, checkpoint) paths, all checked before training starts: writable, distinct from each other
    and from the inputs, and holding no earlier run's results unless --force or --resume names that run."""
    from host.outputs import check_distinct, refuse_existing

    json_out = _output_file("--json", args.json) if args.json else None
    plot = _output_file("--plot", args.plot, ".png") if args.plot else None
    if args.no_checkpoint:
        ckpt = None
    elif args.checkpoint:
        ckpt = _output_file("--checkpoint", args.checkpoint)
    elif args.resume:
        ckpt = _output_file("--checkpoint (default: the --resume file)", args.resume)
    elif json_out is not None:
        ckpt = _output_file("--checkpoint (default: next to --json)", str(json_out.with_suffix(".ckpt.npz")))
    else:
        default = Path("results") / f"{cfg.name}-{arith}.ckpt.npz"
        ckpt = _output_file("--checkpoint (default: results/)", str(default))
    named = [(o, p) for o, p in (("--json", json_out), ("--plot", plot), ("--checkpoint", ckpt)) if p is not None]
    inputs = [("--config", args.config), ("--resume", args.resume), ("--bitstream", args.bitstream),
              ("--init", args.init), ("--data", args.data)]
    check_distinct(named, inputs, allow=[("--checkpoint", "--resume")])
    allowed = [args.resume] if args.resume else []
    if resume is not None:  # the files of the run --resume continues
        recorded = resume.meta["history"]["meta"].get("outputs")
        allowed += [p for p in (recorded.values() if isinstance(recorded, dict) else ()) if isinstance(p, str)]
    refuse_existing(named, force=args.force, allowed=allowed)
    for _, path in named:
        path.parent.mkdir(parents=True, exist_ok=True)
    return json_out, plot, ckpt


def _continue_command(args, arith: str, target: str, json_out, plot, ckpt) -> str:
    """The whole command that continues this run with the same outputs and options."""
    import shlex

    parts = ["xnortrain", "train", "--resume", str(ckpt)]
    parts += ["--arith", "float"] if arith == "float" else ["--target", target]
    for option, value in (("--bitstream", args.bitstream), ("--data", args.data),
                          ("--check-every", args.check_every or None),
                          ("--eval-every", args.eval_every or None), ("--json", json_out), ("--plot", plot)):
        if value is not None:
            parts += [option, str(value)]
    if args.no_progress:
        parts.append("--no-progress")
    return shlex.join(parts)


def _default_target() -> str:
    """``board`` on a PYNQ board (the ``pynq`` package importable and an FPGA manager present), else ``sim``."""
    import importlib.util
    import os

    if importlib.util.find_spec("pynq") is not None and (
            os.environ.get("BOARD") or Path("/sys/class/fpga_manager/fpga0").exists()):
        return "board"
    return "sim"


def _train_kind(args, resume) -> tuple[str, str]:
    """(arith, target) of ``xnortrain train``: arith ``float`` (the float reference; target ``float``) or
    ``hw`` with target ``model`` (the bit-exact model), ``sim`` (the simulated board) or ``board``."""
    ckpt_arith = None if resume is None else ("hw" if resume.engine == "hw" else "float")
    if resume is not None and args.arith and args.arith != ckpt_arith:
        raise UserError(f"--arith {args.arith}: {args.resume} was written with --arith {ckpt_arith}")
    if args.target and (args.arith == "float" or ckpt_arith == "float"):
        why = "--arith float" if args.arith == "float" else f"{args.resume} was written by the float reference"
        raise UserError(f"--target {args.target}: {why}; the targets train the hardware arithmetic")
    arith = args.arith or ckpt_arith or "hw"
    if arith == "float":
        return "float", "float"
    if args.target:
        return "hw", args.target
    if args.arith == "hw":
        return "hw", "model"  # --arith hw alone: the bit-exact model, as before --target existed
    if resume is not None:
        was = resume.meta["history"]["meta"].get("target")
        return "hw", was if was in ("sim", "board", "model") else "model"
    return "hw", _default_target()


def _accelerator_engine(args, cfg: Config, target: str, stack):
    """The :class:`host.train_target.AcceleratorEngine` of ``--target sim|board`` (resources on ``stack``)."""
    from host.driver import Driver
    from host.train_target import AcceleratorEngine

    if target == "sim":
        from host.simboard import SimBoard

        board = stack.enter_context(SimBoard.build(cfg, log=print))
        driver = Driver(board.description, board.transport)
    else:
        from host.board import open_board

        driver = stack.enter_context(open_board(cfg, args.bitstream, log=print))
    return AcceleratorEngine(cfg, driver, check_every=args.check_every, target=target)


def cmd_train(args) -> int:
    import contextlib

    from host.outputs import OutputLock
    from sim.train_loop import load_checkpoint, load_training_data, run_training

    if args.eval_every < 0:
        raise UserError(f"--eval-every {args.eval_every}: must be >= 0 (0 = after every epoch only)")
    if args.check_every < 0:
        raise UserError(f"--check-every {args.check_every}: must be >= 0 (0 = no comparison with the model)")
    if args.no_checkpoint and args.checkpoint:
        raise UserError(f"--no-checkpoint and --checkpoint {args.checkpoint} contradict each other; give one")
    resume = load_checkpoint(args.resume) if args.resume else None
    arith, target = _train_kind(args, resume)
    if args.init and (resume is not None or arith == "float"):
        why = f"--resume {args.resume} continues a run" if resume is not None else "--arith float trains from scratch"
        raise UserError(f"--init {args.init}: {why}; --init starts the hardware arithmetic from another model")
    if args.check_every and target not in ("sim", "board"):
        raise UserError(f"--check-every compares the accelerator with the bit-exact model; --target {target} "
                        "has no accelerator (use --target sim or board)")
    if args.bitstream and target != "board":
        raise UserError(f"--bitstream is for --target board (this run: {target})")
    cfg = _train_config(args, arith, base=resume.config if resume is not None else None)
    if arith == "float" and cfg.train.batch_size < 2 and any(s.spec.type == "dense" for s in cfg.layer_shapes()):
        raise UserError(f"train.batch_size = {cfg.train.batch_size}: the float reference normalises a dense layer "
                        "with the batch's statistics, undefined for one image; give a batch of 2 or more")
    if target in ("float", "model"):
        _check_host_memory(cfg)
    label = "float" if arith == "float" else ("hw" if target == "model" else target)
    json_out, plot, ckpt = _train_outputs(args, cfg, label, resume)
    outputs = {k: str(p.resolve()) for k, p in (("json", json_out), ("plot", plot), ("checkpoint", ckpt))
               if p is not None}
    with contextlib.ExitStack() as stack:
        stack.enter_context(OutputLock([("--json", json_out), ("--plot", plot), ("--checkpoint", ckpt)]))
        try:
            # the data and the --init model are checked before any elaboration or simulator build
            data = load_training_data(cfg, _data_arg(args.data, cfg) if args.data else None)
            init = _init_arg(args.init, cfg) if args.init else None
            engine, what = _train_engine(args, cfg, arith, target, stack)
            if init is not None:
                from host.init_state import load_init

                load_init(engine, *init, cfg, data)
        except KeyboardInterrupt:
            kept = f"; {args.resume} is unchanged" if args.resume else ""
            print(f"xnortrain: interrupted before training started (loading the data or building the {target} "
                  f"target): nothing was saved{kept}", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(
            f"xnortrain: training {cfg.name} ({what}, B={cfg.train.batch_size}, {cfg.train.epochs} epochs, "
            f"seed {cfg.train.seed}); checkpoint: {ckpt if ckpt is not None else 'none (--no-checkpoint)'}"
        )
        if (resume is not None and resume.stopped in ("finished", "max_steps")
                and cfg.train.epochs == resume.config.train.epochs
                and cfg.train.max_steps == resume.config.train.max_steps):
            print(f"{args.resume}: the run had stopped ({resume.stopped}) after {resume.step} steps; "
                  "nothing to resume (give --epochs N to continue it to N epochs)")
        try:
            history = run_training(cfg, engine, data, progress=not args.no_progress, history_json=json_out,
                                   state_file=ckpt, resume=resume, eval_every=args.eval_every,
                                   meta={"outputs": outputs})
        except Exception as e:
            from host.train_target import TargetMismatch

            if not isinstance(e, TargetMismatch):
                raise
            print(f"xnortrain: mismatch: {e}", file=sys.stderr)
            if ckpt is not None and ckpt.is_file():
                print(f"the last checkpoint written between whole steps is kept in {ckpt}", file=sys.stderr)
            return EXIT_MISMATCH
        cycles = getattr(engine, "cycles", 0)
    if json_out is not None:
        print(f"history written to {json_out}")
    if plot is not None:
        print(f"plot written to {history.plot(plot)}")
    if history.epoch:
        secs = sum(history.seconds) / len(history.seconds)
        print(
            f"best test accuracy {100 * history.best:.2f} % after {len(history.epoch)} epoch(s), "
            f"{history.total_steps} steps, {secs:.1f} s/epoch ({history.meta.get('stopped', '')})"
        )
    else:
        print("no epoch finished")
    if cycles and history.total_steps:
        steps_here = history.total_steps - (history.meta.get("resumed") or [{"step": 0}])[-1]["step"]
        if steps_here > 0:
            per = cycles / steps_here
            print(f"accelerator: {per:,.0f} cycles per training step, {per / cfg.train.batch_size:,.0f} per image")
    if history.meta.get("stopped") == "interrupted":
        return _report_interrupt(args, history, arith, target, json_out, plot, ckpt)
    return EXIT_OK


def _data_arg(path: str, cfg):
    from host.adapt import load_data_file

    return load_data_file(path, cfg)


def _init_arg(path: str, cfg):
    from host.init_state import hw_state, read_source

    src = read_source(path)
    return src, hw_state(cfg, src)


#: bytes of host memory per weight of a layer that the float reference and the bit-exact model hold (weights,
#: latent weights, optimiser state, gradients; measured: 64-74 B for a 784 x 8192 layer, batch 100)
_BYTES_PER_WEIGHT = 80
#: bytes per activation element of one image (the forward values, their codes and the backward gradients)
_BYTES_PER_ACTIVATION = 64


def _available_memory() -> int | None:
    """Bytes this machine can still give (Linux ``MemAvailable``), else None (no check)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_host_memory(cfg: Config) -> None:
    """Refuse, before anything is allocated, a network whose training state cannot fit this machine's memory,
    naming the largest layer and its size (a MemoryError traceback after minutes of swapping otherwise)."""
    import math

    have = _available_memory()
    if have is None:
        return
    shapes = cfg.layer_shapes()
    widest = max(math.prod(s.out_shape) for s in shapes)
    # training holds every layer's activations of a batch; evaluation a couple of layers' at a time
    sizes = [(s.index, s.spec.type, math.prod(s.weight_shape) * _BYTES_PER_WEIGHT
              + math.prod(s.out_shape) * cfg.train.batch_size * _BYTES_PER_ACTIVATION) for s in shapes]
    need = sum(b for *_, b in sizes) + widest * cfg.train.eval_batch_size * _BYTES_PER_ACTIVATION // 4
    if need > have:
        i, kind, big = max(sizes, key=lambda t: t[2])
        gib = 1 << 30
        raise UserError(f"model.layers[{i}] ({kind}) needs about {big / gib:,.1f} GiB of training state (the "
                        f"network {need / gib:,.1f} GiB); this machine has {have / gib:,.1f} GiB available")


def _train_engine(args, cfg: Config, arith: str, target: str, stack):
    """(engine, description) of a training run."""
    if arith == "float":
        from sim.reference.engine import ReferenceEngine

        return ReferenceEngine(cfg), f"float arithmetic, scheme {cfg.approx.scheme}, optimizer {cfg.optimizer.name}"
    if target == "model":
        from sim.hw.engine import HwEngine

        return HwEngine(cfg), f"bit-exact hardware model, hw optimizer {cfg.hw.optimizer}"
    engine = _accelerator_engine(args, cfg, target, stack)
    where = "simulated board (Verilator)" if target == "sim" else "PYNQ board"
    check = f", compared with the bit-exact model every {args.check_every} steps" if args.check_every else ""
    return engine, f"on the accelerator, {where}, hw optimizer {cfg.hw.optimizer}{check}; test accuracy by its infer"


def _report_interrupt(args, history, arith, target, json_out, plot, ckpt) -> int:
    """What an interrupted run left: the checkpoint and the whole command that continues it, or that nothing
    was saved and why."""
    sig, steps = history.meta.get("signal"), history.meta.get("total_steps", 0)
    saved = history.meta.get("checkpoint")
    if ckpt is None:
        print(f"interrupted ({sig}) after {steps} steps; no checkpoint (--no-checkpoint)")
    elif saved:
        cut = "" if saved["step"] == steps else f" (as it was after step {saved['step']}: the running step was cut)"
        print(f"interrupted ({sig}) after {steps} steps; training state saved to {ckpt}{cut}; "
              f"continue with: {_continue_command(args, arith, target, json_out, plot, ckpt)}")
    else:
        print(f"interrupted ({sig}) after {steps} steps; nothing was saved: the running step was cut on the "
              "accelerator (a second signal) before this run wrote its first checkpoint")
        if args.resume and Path(args.resume).is_file():
            again = _continue_command(args, arith, target, json_out, plot, Path(args.resume))
            print(f"{args.resume} still holds the state it was resumed from; continue with: {again} --force")
    return EXIT_INTERRUPTED


def _report_cmd(module_name: str):
    def run(args) -> int:
        import importlib

        module = importlib.import_module(module_name)
        cfg = build_config(args)
        options = {k: getattr(args, k) for k in ("convention", "memory", "float_ops") if getattr(args, k, None)}
        text, data = module.report(cfg, **options)
        print(text)
        if args.json:
            _write_json(args.json, data)
            print(f"written to {args.json}")
        return 0

    return run


def _lazy(module: str, func: str):
    """A command implemented in another module, imported only when it runs (Amaranth/cocotb load slowly)."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module), func)(args)

    return run


def package_version() -> str:
    """The installed package's version, else the one in pyproject.toml (a source tree run in place)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("xnortrain")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as fh:
            return tomllib.load(fh)["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def _exit_code_epilog() -> str:
    return "exit status:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xnortrain",
        description="Generate, verify and drive FPGA accelerators that train binary neural networks on chip.",
        epilog=_exit_code_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train", help="train on the accelerator (simulated or on a board), the bit-exact model or the float reference",
        description="Train on the generated accelerator: --target sim (the default off a board) builds the "
        "accelerator for the configuration and its Verilator simulator once (cached) and trains through the host "
        "driver as on a board; --target board uses a PYNQ board's overlay (the default on a board); --target model "
        "runs the bit-exact integer model alone (also --arith hw). After every epoch the test set is classified by "
        "the target itself (the accelerator's infer command). --arith float trains the NumPy float reference. "
        "Without --model or --config the 'mlp' preset (configs/mlp_mnist.toml) is used. The whole training state "
        "is saved to the checkpoint after every epoch and when the run stops; Ctrl-C or SIGTERM stop it at the "
        "next step boundary (exit status 130) and --resume continues it bit-identically, on any hardware target.",
    )
    _add_config_args(p)
    p.add_argument(
        "--target", choices=("sim", "board", "model"),
        help="where the hardware arithmetic trains: sim = the accelerator in Verilator (default off a board), "
             "board = the accelerator on a PYNQ board (default on one; --bitstream), model = the bit-exact model",
    )
    p.add_argument(
        "--arith", choices=("float", "hw"),
        help="float: the NumPy float reference (its optimiser is --optimizer); hw: the hardware arithmetic "
             "(alone: --target model), whose optimiser is hw.optimizer: --optimizer switch, bop, iir or sgdm "
             "(= hw sgd with momentum) selects it, adam has no hardware equivalent",
    )
    p.add_argument("--check-every", type=int, default=0, metavar="K",
                   help="--target sim|board: run the bit-exact model beside the accelerator and compare the whole "
                        "state every K steps (logits every step); the first difference stops the run (exit 4)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="also classify the test set after every N-th training step (besides every epoch's end)")
    p.add_argument("--bitstream", metavar="BIT",
                   help="--target board: the overlay (default xnortrain.bit; accelerator.json beside it)")
    p.add_argument("--epochs", type=int, help="shortcut for --set train.epochs=N")
    p.add_argument("--seed", type=int, help="shortcut for --set train.seed=N")
    p.add_argument("--max-steps", type=int, help="stop after N training steps (short runs)")
    p.add_argument("--json", metavar="OUT", help="write the training history as JSON (rewritten after every epoch)")
    p.add_argument("--plot", metavar="PNG", help="write accuracy/loss curves to this .png file")
    p.add_argument(
        "--checkpoint", metavar="FILE",
        help="where the whole training state is saved, atomically, after every epoch and when the run stops "
             "(default: the --resume file when resuming, else next to --json as <stem>.ckpt.npz, else "
             "results/<config name>-<float|hw|sim|board>.ckpt.npz)",
    )
    p.add_argument("--no-checkpoint", action="store_true", help="save no training state")
    p.add_argument("--force", action="store_true",
                   help="overwrite --json, --plot and checkpoint files that hold an earlier run's results (refused "
                        "without it, unless --resume names that run); a file another running run writes is "
                        "refused even so")
    p.add_argument(
        "--resume", metavar="FILE",
        help="continue the run saved in this checkpoint, bit-identically; its configuration is used unless "
             "configuration options are given, which must then match it",
    )
    p.add_argument("--init", metavar="FILE",
                   help="start from a model trained elsewhere: a float-reference checkpoint (--arith float) or an "
                        "ONNX/QONNX BNN of the same topology (xnortrain export's, or MatMul + BatchNormalization "
                        "layers), converted to the hardware's formats (docs/arithmetic.md); prints the target's test "
                        "accuracy right after loading")
    p.add_argument("--data", metavar="PATH",
                   help="train and test on these images instead of the configured dataset: an .npz with x_train, "
                        "y_train, x_test, y_test (uint8 images of the configuration's shape, class indices), or a "
                        "dataset folder (as --set data.path=PATH)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    for name, module, text in (
        ("memory", "sim.memory_model", "per-variable training memory (the paper's Table 2 method)"),
        ("energy", "sim.energy_model", "per-batch training energy from 45 nm operation and access energies"),
    ):
        p = sub.add_parser(name, help=text)
        _add_config_args(p)
        p.add_argument("--json", metavar="OUT", help="also write the table as JSON")
        if name == "memory":
            p.add_argument(
                "--convention", choices=("paper", "exact"), default="paper",
                help="paper: the sizing that reproduces Tables 2/3; exact: what this network really holds",
            )
        else:
            p.add_argument(
                "--memory", choices=("dram", "dram_high", "sram"), default="dram", help="where every access goes"
            )
            p.add_argument(
                "--float-ops", dest="float_ops", choices=("fp32", "storage"), default="fp32",
                help="price float arithmetic as fp32 (the paper) or at the storage width",
            )
        p.set_defaults(func=_report_cmd(module))

    p = sub.add_parser("generate", help="write the accelerator's Verilog, register map and cycle/resource report")
    _add_config_args(p)
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder (created if missing; refused if it holds files, unless --force)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out folder, overwriting the files generate writes")
    p.add_argument("--no-synth", dest="no_synth", action="store_true",
                   help="skip the Yosys synth_xilinx resource estimate (minutes for large designs)")
    p.add_argument("--synth-by-unit", dest="synth_by_unit", action="store_true",
                   help="synthesise the top level's submodules one by one and add them up (the paper's MLP: about "
                        "25 min instead of hours; misses optimisation across unit boundaries)")
    p.add_argument("--device", choices=xilinx_devices(),
                   help="the die the Yosys estimate and the fit verdict are for (default: the --board's, else "
                        "xc7z020); xck26 (KV260) and xczu7ev (ZCU104) are synthesised with synth_xilinx -family "
                        "xcup, UltraRAM counted")
    par = p.add_mutually_exclusive_group()
    par.add_argument("--jobs", type=_positive_int("--jobs"), default=1, metavar="N",
                     help="with --synth-by-unit: synthesise N units at once on this machine (default 1); same report")
    par.add_argument("--cluster", metavar="ADDRESS",
                     help="with --synth-by-unit: run the unit syntheses on the Dask cluster whose scheduler is at "
                          "ADDRESS (e.g. tcp://host:8786; workers: `dask worker ADDRESS --nworkers N --nthreads 1` in "
                          "this package's environment, extra `cluster`); same report. An unreachable address: exit 2")
    p.add_argument("--board", choices=("pynq-z2", "pynq-z1", "zedboard", "zcu104", "kv260", "ulx3s-85f"),
                   help="pynq-z2|pynq-z1|zedboard|zcu104|kv260: also write DIR/vivado/ (build.tcl + Makefile), the "
                        "Vivado build of a PYNQ overlay (xnortrain.bit + xnortrain.hwh); `make -C DIR/vivado` needs "
                        "Vivado. ulx3s-85f: instead of the xc7z020 estimate, place and route on the ECP5-85F with "
                        "yosys synth_ecp5 + nextpnr-ecp5 (Fmax, utilisation, DIR/ecp5/xnortrain.bit): a timing proxy "
                        "for another family, not the Zynq; with --synth-by-unit also each unit out of context")
    p.add_argument("--pnr-seed", dest="pnr_seed", type=int, action="append", metavar="N",
                   help="with --board ulx3s-85f: place and route with nextpnr seed N (repeat for several, one after "
                        "the other; report.json's fmax_mhz is the lowest); default 1")
    p.add_argument("--board-repo", dest="board_repo", metavar="DIR",
                   help="with a Zynq --board: a folder of Vivado board files the build searches first "
                        "(set_param board.repoPaths); without the board's files the build sets the PS itself")
    p.add_argument("--clock-mhz", dest="clock_mhz", type=float, metavar="F",
                   help="the accelerator's clock in MHz (default 100): FCLK0 of the Vivado build, accelerator.json, "
                        "and the clock report.json prices images per second and the energy estimate at")
    p.add_argument("--energy-estimate", dest="energy_estimate", action="store_true",
                   help="also estimate the PL energy per training step and per image (uJ; an estimate, not a "
                        "measurement): the synthesised resources, the toggle activity of one step on the simulated "
                        "board built with Verilator toggle coverage (minutes), and the xc7z020 constants of "
                        "boards/power.py; needs the xc7z020 synthesis (not --no-synth, not an ECP5 board)")
    p.set_defaults(func=_lazy("host.generate", "generate_main"))

    p = sub.add_parser(
        "explore", help="search the lane parameters for the fewest cycles per image that fit a device",
        description="Search the [hw] lane parameters (rtl_gen.explore.GRID) with the cycle model and the calibrated "
        "resource model (rtl_gen.resource_model): the Pareto front of cycles per image against LUT and BRAM36 of "
        "the designs that fit the device (LUT <= 70 %%, FF, BRAM36 and DSP within it). Exit 3 if none fits.",
    )
    _add_config_args(p)
    p.add_argument("--device", default="xc7z020", metavar="NAME",
                   help="device die or part name in boards/devices.py (default xc7z020)")
    p.add_argument("--write", metavar="BEST.toml",
                   help="write the configuration with the fastest fitting design's [hw] values (load_config reads it)")
    p.add_argument("--png", metavar="FILE", help="plot the two Pareto fronts to this .png file")
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="the search's result as JSON: to OUT, or alone on stdout (no table) without OUT")
    p.set_defaults(func=_lazy("host.explore", "explore_main"))

    p = sub.add_parser("verify", help="simulate training steps in Verilator and compare with the bit-exact model")
    _add_config_args(p)
    p.add_argument("--steps", type=int, default=1, help="training steps to simulate and compare (default 1)")
    p.add_argument("--data", metavar="PATH",
                   help="an .npz with x/y, or a dataset folder (default: the configured dataset, vendored MNIST)")
    p.add_argument("--energy-estimate", dest="energy_estimate", metavar="REPORT_JSON",
                   help="after the check, estimate the PL energy per training step and per image (uJ; an estimate) "
                        "with the resources of this `xnortrain generate` report.json and the toggle activity of one "
                        "step on the simulated board built with Verilator toggle coverage (minutes)")
    p.set_defaults(func=_lazy("host.verify", "verify_main"))

    p = sub.add_parser(
        "energy-measure", help="joules per training step from a power log and the driver's step log",
        description="Integrate a power log (CSV from an external meter, or a pynq DataRecorder frame saved with "
        "frame.to_csv) minus the idle baseline over every step window of the driver's step log (JSONL, "
        "Driver(..., step_log=PATH)): joules per step and per image. See docs/energy.md.",
    )
    p.add_argument("--power", required=True, metavar="LOG",
                   help="power log CSV: a time column (time/t/timestamp, s or ms) and a power column (power/p/"
                        "watts, W or mW) or voltage and current columns (voltage/v/bus_voltage; current/i, A or mA)")
    p.add_argument("--steps", required=True, metavar="STEPS", help="the driver's step log (JSONL)")
    idle = p.add_mutually_exclusive_group()
    idle.add_argument("--idle-window", metavar="START:END",
                      help="idle baseline: mean power over this window (seconds, in the step log's clock)")
    idle.add_argument("--idle-seconds", type=float, metavar="N",
                      help="idle baseline: mean power over the N seconds before the first step")
    idle.add_argument("--idle-watts", type=float, metavar="W", help="idle baseline: this figure in watts")
    p.add_argument("--time-offset", type=float, default=0.0, metavar="S",
                   help="seconds added to the power log's times (a log with relative times: its zero as Unix time)")
    p.add_argument("--rails", metavar="A,B",
                   help="DataRecorder frame: the rails to sum (column <rail>_power), e.g. 12V; default the PL and PS "
                        "rails (VCCINT, VCCBRAM, VCCAUX, ... and VCCPSINTFP, ...), each domain also reported apart")
    p.add_argument("--energy-estimate", dest="energy_estimate", metavar="REPORT_JSON",
                   help="print the PL energy estimate of `generate --energy-estimate` (its report.json) beside the "
                        "measurement")
    p.add_argument("--min-samples", type=int, default=2, metavar="N",
                   help="power samples required inside every step window (default 2; 0 accepts interpolation)")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    p.add_argument("--plot", metavar="PNG", help="plot power with the step windows shaded to this .png file")
    p.set_defaults(func=_lazy("host.energy", "measure_main"))

    p = sub.add_parser(
        "export", help="write a trained network as QONNX (FINN's front end), equal in every class to the accelerator",
        description="Write the network of a training checkpoint as a QONNX graph: raw pixels in, the first layer's "
        "binarisation, +-1 weights and the accelerator's evaluation thresholds as MultiThreshold nodes; the first "
        "maximum of its output is the accelerator's class (host/export.py). Needs the 'export' extra (qonnx).",
    )
    p.add_argument("--checkpoint", required=True, metavar="CKPT",
                   help="a training checkpoint (the hardware's; a float reference's is converted as train --init does)")
    p.add_argument("--out", required=True, metavar="MODEL.onnx", help="the QONNX file to write")
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="images per execution, fixed in the graph (default 1, as FINN builds)")
    p.add_argument("--input-shape", dest="input_shape", choices=("image", "flat"), default="image",
                   help="image: N x C x H x W (default); flat: N x C*H*W")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.set_defaults(func=_lazy("host.export", "export_main"))

    p = sub.add_parser("config", help="print the fully resolved configuration as TOML")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)
    return parser


def _positive_int(option: str):
    """An argparse type: a whole number >= 1, refused naming ``option``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option} must be a whole number >= 1, not {text!r}")
        return value

    return parse


def _path_error(e: OSError) -> str:
    """One line for an operating-system error on a file the user named."""
    what = {IsADirectoryError: "is a folder where a file was expected",
            NotADirectoryError: "a part of the path is a file, not a folder",
            PermissionError: "permission denied", FileNotFoundError: "no such file or folder",
            FileExistsError: "already exists"}.get(type(e), e.strerror or str(e))
    return f"{e.filename}: {what}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (the ``EXIT_*`` constants). User mistakes are one line on
    stderr with status 2; an unexpected exception (a bug) keeps its traceback and gives status 1."""
    parser = make_parser()
    args = parser.parse_args(argv)
    old_term = _sigterm_as_interrupt()
    try:
        _check_paths(args)
        return args.func(args)
    except (ConfigError, UserError, ValueError) as e:
        # ValueError covers DatasetError and other input mistakes raised with a clear message; a
        # UnicodeDecodeError (a ValueError) from a file the user named has no file name, so it is said here.
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, UnicodeDecodeError):
            msg = f"an input file is not UTF-8 text ({msg})"
        if isinstance(e, tomllib.TOMLDecodeError):
            msg = f"not valid TOML ({msg})"
        print(f"xnortrain: error: {msg}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:
        if e.filename is None:  # not about a file the user named: the system or a bug
            return _internal_error()
        print(f"xnortrain: error: {_path_error(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("xnortrain: interrupted (the tools it had started are stopped too)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if _is_tool_failure(e):
            # the tool's own words (the tail of its log) follow the first line; no Python traceback
            print(f"xnortrain: error: {e}", file=sys.stderr)
            return EXIT_TOOL
        return _internal_error()
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _sigterm_as_interrupt():
    """SIGTERM handled as Ctrl-C (exit 130, child processes stopped, training state saved); returns the handler
    it replaced (None outside the main thread, where signals cannot be handled)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


# The files each command reads and writes (argparse destinations): checked against each other before any work.
_PATHS = {
    "explore": (("write", "png", "json"), ("config",)),
    "energy-measure": (("json", "plot"), ("power", "steps")),
    "memory": (("json",), ("config",)),
    "energy": (("json",), ("config",)),
    "verify": ((), ("config", "data", "energy_estimate")),
    "generate": (("out",), ("config",)),
    "export": (("out",), ("checkpoint",)),
}


def _check_paths(args) -> None:
    """Two outputs of one command naming one file, or an output naming an input: refused before any work
    (train checks its own, with the default checkpoint, in :func:`_train_outputs`)."""
    from host.outputs import check_distinct

    outs, ins = _PATHS.get(args.command, ((), ()))
    name = lambda dest: "--" + dest.replace("_", "-")  # noqa: E731
    outputs = [(name(d), getattr(args, d, None)) for d in outs if getattr(args, d, None) not in (None, "-")]
    check_distinct(outputs, [(name(d), getattr(args, d, None)) for d in ins])


def _is_tool_failure(e: BaseException) -> bool:
    """Yosys, nextpnr or the Verilator build failing (their modules imported only when they may have run)."""
    kinds = []
    for module, name in (("rtl_gen.synth", "SynthError"), ("boards.ecp5", "Ecp5Error"),
                         ("host.simboard", "SimBoardBuildError")):
        mod = sys.modules.get(module)
        if mod is not None:
            kinds.append(getattr(mod, name))
    return isinstance(e, tuple(kinds))


def _internal_error() -> int:
    import traceback

    traceback.print_exc()
    print("xnortrain: internal error (a bug): the traceback above says where", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
