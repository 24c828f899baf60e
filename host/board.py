"""Opening the accelerator on a PYNQ board (``xnortrain train --target board``).

The overlay is the bitstream ``xnortrain generate --board ...`` and ``make -C DIR/vivado`` build
(``DIR/vivado/xnortrain.bit`` with ``xnortrain.hwh`` beside it); the accelerator's description is
``DIR/accelerator.json``, found beside the bitstream or one folder up. ``pynq`` is imported only here and only
when a board is opened: it exists on the board image, not in the development environment.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["find_description", "open_board", "require_root", "BoardError", "HARDWARE_SECTIONS"]

#: Configuration sections the accelerator is built from: a training configuration must agree with the
#: bitstream's on these (the rest, e.g. epochs, schedule, data, may differ).
HARDWARE_SECTIONS = ("model", "hw", "approx")


class BoardError(ValueError):
    """The board, its overlay or its description cannot be used (the message is one line)."""


def find_description(bitstream: Path) -> Path:
    """``accelerator.json`` beside ``bitstream`` or in its parent folder (the layout ``generate`` writes)."""
    for folder in (bitstream.parent, bitstream.parent.parent):
        cand = folder / "accelerator.json"
        if cand.is_file():
            return cand
    raise BoardError(f"--bitstream {bitstream}: no accelerator.json beside it or one folder up (xnortrain generate "
                     "writes it into the --out folder, the bitstream into its vivado/ subfolder)")


def require_root(euid: int | None = None) -> None:
    """pynq maps the PL's registers through /dev/mem and loads bitstreams through the FPGA manager: root only (it
    raises ``EnvironmentError("Root permissions required.")`` otherwise, pynq/pl_server/embedded_device.py). Say
    so in one line, with what a user of the PYNQ image does, before pynq is touched."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise BoardError("--target board: pynq needs root on the board; run `sudo -i`, then `source "
                         "/etc/profile.d/pynq_venv.sh` (the pynq venv) and this command again")


def check_config(cfg, desc) -> None:
    """Refuse a training configuration whose hardware sections or batch differ from the bitstream's."""
    if not desc.config:
        return
    try:  # the sim package (tomllib, or tomli on Python 3.10); without it the identification check stays
        from sim.config import config_from_dict, tomllib
        from sim.train_loop import config_difference
    except ImportError:
        return

    built = config_from_dict(tomllib.loads(desc.config)).to_dict()
    mine = cfg.to_dict()
    for section in HARDWARE_SECTIONS:
        diff = config_difference({section: built.get(section)}, {section: mine.get(section)})
        if diff is not None:
            key, was, now = diff
            raise BoardError(f"{key} = {now!r} differs from the bitstream's {was!r} (accelerator.json); "
                             "train with the configuration it was generated from")
    if built["train"]["batch_size"] != mine["train"]["batch_size"]:
        raise BoardError(f"train.batch_size = {mine['train']['batch_size']} differs from the bitstream's "
                         f"{built['train']['batch_size']}")


@contextlib.contextmanager
def open_board(cfg, bitstream: str | None, *, log=print, step_log=None) -> Iterator:
    """Load the overlay and yield a connected :class:`host.driver.Driver` (identification checked)."""
    from host.driver import Driver
    from host.transports.pynq import PynqTransport
    from rtl_gen.contract import AcceleratorDescription

    bit = Path(bitstream or "xnortrain.bit")
    if bit.suffix != ".bit":
        raise BoardError(f"--bitstream {bit}: give the overlay's .bit file (its .hwh must be beside it)")
    if not bit.is_file():
        raise BoardError(f"--bitstream {bit}: no such file (build it with `xnortrain generate --board BOARD --out DIR` "
                         "and `make -C DIR/vivado` on a machine with Vivado, then copy DIR to the board)")
    if not bit.with_suffix(".hwh").is_file():
        raise BoardError(f"--bitstream {bit}: {bit.with_suffix('.hwh').name} is missing beside it (PYNQ needs both)")
    desc_path = find_description(bit)
    desc = AcceleratorDescription.from_json(desc_path)
    check_config(cfg, desc)
    if "pynq" not in sys.modules and importlib.util.find_spec("pynq") is None:
        raise BoardError("--target board needs the pynq package (on a PYNQ board image; "
                         "pip install xnortrain[board] there); off a board use --target sim")
    require_root()  # before pynq is imported: as another user it may fail while loading the device
    import pynq

    log(f"loading overlay {bit} (description {desc_path})")
    overlay = pynq.Overlay(str(bit))
    transport = PynqTransport(overlay)  # the overlay's clock; checked against desc.clock_mhz when attached
    try:
        yield Driver(desc, transport, step_log=step_log)
    finally:
        transport.close()
