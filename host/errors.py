"""The errors of the driver and its transports (:mod:`host.driver`, :mod:`host.transports`)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["AcceleratorError", "AcceleratorTimeout", "ClockWarning", "HardwareMismatch", "StateError",
           "TransferTimeout"]


class AcceleratorError(RuntimeError):
    """The accelerator flagged an error (the names of the ``error`` register's bits are in ``.flags``)."""

    def __init__(self, message: str, flags: Sequence[str] = ()):
        super().__init__(message)
        self.flags = tuple(flags)


class AcceleratorTimeout(AcceleratorError):
    """A command did not finish within the driver's cycle or wall-time budget (the driver aborted it)."""


class TransferTimeout(AcceleratorTimeout):
    """A stream transfer did not complete in time (the transport stopped it, the driver aborted the command)."""


class HardwareMismatch(AcceleratorError):
    """The identification / geometry registers disagree with the description (``.fields``: one line each)."""

    def __init__(self, message: str, fields: Sequence[str] = ()):
        super().__init__(message)
        self.fields = tuple(fields)


class ClockWarning(RuntimeWarning):
    """The board clocks the accelerator at another frequency than its description says (both figures named)."""


class StateError(ValueError):
    """A state dict that cannot be restored (a key missing or unknown, a shape, dtype or value wrong)."""
