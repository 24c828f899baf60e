"""What every command shares: exit statuses, the user-error type, building a configuration from the command
line and checking / writing output files. Library modules that run a command (verify, energy-measure, generate,
explore) import these from here, never from :mod:`host.cli` (the parser and the dispatch)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from sim.config import PRESETS, Config, apply_overrides, load_config

EXIT_OK = 0
EXIT_INTERNAL = 1  # an unexpected internal error: a bug (the traceback is printed)
EXIT_USER_ERROR = 2  # a usage, configuration or input error (argparse's own status too)
EXIT_DOES_NOT_FIT = 3  # the design does not fit the device
EXIT_MISMATCH = 4  # a verification / comparison found a mismatch
EXIT_TOOL = 5  # an external tool (Yosys, nextpnr, Verilator) failed: its log is named
EXIT_INTERRUPTED = 130  # interrupted by Ctrl-C / SIGTERM (state saved where the command has any)

EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_INTERNAL, "an unexpected internal error (a bug; the traceback is printed)"),
    (EXIT_USER_ERROR, "a usage, configuration or input error (one line naming the field or file)"),
    (EXIT_DOES_NOT_FIT, "the design does not fit the device"),
    (EXIT_MISMATCH, "verification found a mismatch with the bit-exact model"),
    (EXIT_TOOL, "an external tool (Yosys, nextpnr, Verilator) failed; the message names its log"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C / SIGTERM; training state saved)"),
)


class UserError(Exception):
    """A mistake in the command line or its inputs; printed as one line."""



def add_config_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", choices=sorted(PRESETS), help="a named preset (configs/*.toml)")
    src.add_argument("--config", metavar="FILE", help="a configuration TOML file")
    p.add_argument("--scheme", choices=("standard", "proposed"), help="Algorithm 1 or Algorithm 2 defaults")
    p.add_argument("--optimizer", choices=("adam", "sgdm", "bop", "iir", "switch"), help="weight optimiser")
    p.add_argument("--batch-size", type=int, metavar="B", help="shortcut for --set train.batch_size=B")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
        help="override any configuration field, e.g. --set optimizer.bop.tau=1e-6 (repeatable)",
    )



def build_config(args: argparse.Namespace, base: Config | None = None) -> Config:
    """The configuration of a command line: ``--config`` / ``--model`` (else ``base``, else the ``mlp`` preset),
    then the shortcuts, then ``--set``. ``base``: the configuration a resumed run was started with."""
    if getattr(args, "config", None):
        cfg = load_config(args.config)
    elif getattr(args, "model", None) or base is None:
        cfg = load_config(args.model or "mlp")
    else:
        cfg = base
    shortcuts = []
    if getattr(args, "scheme", None):
        shortcuts.append(f"approx.scheme={args.scheme}")
    if getattr(args, "optimizer", None):
        shortcuts.append(f"optimizer.name={args.optimizer}")
    if getattr(args, "batch_size", None) is not None:
        shortcuts.append(f"train.batch_size={args.batch_size}")
    if getattr(args, "epochs", None) is not None:
        shortcuts.append(f"train.epochs={args.epochs}")
    if getattr(args, "seed", None) is not None:
        shortcuts.append(f"train.seed={args.seed}")
    if getattr(args, "max_steps", None) is not None:
        shortcuts.append(f"train.max_steps={args.max_steps}")
    return apply_overrides(cfg, shortcuts + list(args.overrides))



def write_json(path: str, data: dict, option: str = "--json") -> None:
    """Write ``data`` to ``path`` (its folder created if missing); a folder given as the file, or a file as one
    of its folders, is a :class:`UserError` naming the option and the path."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    existing = next((p for p in out.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"{option} {path}: {existing} is a file, not a folder")
    from sim.train_loop import _json_default, atomic_write

    text = json.dumps(data, indent=2, default=_json_default) + "\n"

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda fh: fh.write(text.encode()))
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write ({e.strerror or e})") from None



# ---------------------------------------------------------------------------



def output_file(option: str, name: str, suffix: str | None = None) -> Path:
    """A file the run will write, checked before training: not a folder, its folder writable or creatable
    (``host.cli``'s train outputs creates missing folders, as for ``--json results/run.json`` in a fresh clone)."""
    path = Path(name)
    if suffix and path.suffix.lower() != suffix:
        raise UserError(f"{option} {name}: the file is written as {suffix[1:].upper()}; give a name ending in {suffix}")
    if path.is_dir():
        raise UserError(f"{option} {name}: is a folder; give a file name")
    base = path.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise UserError(f"{option} {name}: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{option} {name}: folder {base} is not writable")
    return path
