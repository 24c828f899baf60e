"""Host driver for a generated xnortrain accelerator.

One driver class (:class:`Driver`) for every transport. It knows the accelerator only through its
description (:class:`rtl_gen.contract.AcceleratorDescription`, the ``accelerator.json`` that ``xnortrain
generate`` writes: the register map, the batch/stream formats and the layout of every quantity that can be
read back or restored), and reaches it only through the bus operations of :mod:`host.transports.base`
(register reads and writes, stream sends and receives, sleeps). Every driver operation is written once, as a
generator of those operations; a transport runs it, so the same register and buffer logic drives the board
(:class:`host.transports.pynq.PynqTransport`), the simulated board (:class:`host.transports.simboard.SimTransport`)
and the cocotb testbench (``tb/cocotb_transport.py``)::

    drv = Driver(AcceleratorDescription.from_json("out/accelerator.json"), PynqTransport(overlay))
    result = drv.train_step(x, labels, lr=1e-3)             # on the board
    await drv.connect()                                     # in a cocotb test (AsyncTransport) ...
    result = await drv.train_step(x, labels, lr=1e-3)       # ... every call returns a coroutine

Before anything else the driver checks that the hardware is the accelerator the description describes
(:meth:`Driver.connect`: the identification, geometry and batch registers; the constructor runs it on a
blocking transport). Every wait is bounded in accelerator cycles and in wall time: a command that does not
finish is aborted (:class:`host.errors.AcceleratorTimeout`), a stream transfer that does not complete is
stopped (:class:`host.errors.TransferTimeout`, naming the transfer). A restore checks the whole state before
it writes anything (:meth:`Driver.check_state`, :class:`host.errors.StateError`).

No register address or bit position is written here: registers and fields are looked up by name in
the map (:class:`rtl_gen.regmap.RegisterMap`), quantities by name in the description.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from host.errors import AcceleratorError, AcceleratorTimeout, HardwareMismatch, StateError, TransferTimeout
from host.transports.base import BlockingTransport, Program, Read, Receive, Send, Sleep, Transport, Write
from rtl_gen.contract import (
    HASH_REGISTER,
    IDENTITY_REGISTERS,
    AcceleratorDescription,
    QuantityLayout,
    description_hash,
)

__all__ = ["COMMANDS", "Driver", "StepResult"]

#: Commands: ``cmd`` register pulse field -> ``done`` register flag that reports its completion.
COMMANDS = ("upload", "train", "readback", "restore", "abort")


@dataclass
class StepResult:
    """What one training step reports: ``loss`` (computed by the host from the read-back logits, as the
    bit-exact model does), ``correct``, ``cycles`` (measured by the accelerator from the train command
    to its completion), ``logits`` (int64 ``[B, classes]`` in Q.logit_frac), ``undone`` (``hw.switch_undo``:
    the update was reverted because the re-run's loss rose), ``loss_q`` (the accelerator's own integer loss
    of the batch from its loss unit, the quantity ``switch_undo`` compares: :meth:`sim.hw.model.HwModel._loss_q`,
    ``StepTrace.loss_q``)."""

    loss: float
    correct: int
    cycles: int
    logits: np.ndarray
    undone: bool = False
    loss_q: int = 0


class Driver:
    """Drives one accelerator through a :class:`Transport` (see the module docstring).

    Every public method returns what the transport's ``execute`` returns: the value itself for a
    :class:`BlockingTransport`, a coroutine to await for an :class:`AsyncTransport`.

    ``poll_cycles``: first wait between status polls (doubling up to 64x); ``timeout_cycles`` and
    ``timeout_s``: a command not done after this many (polled) cycles or this many seconds of wall time is
    aborted and raises :class:`AcceleratorTimeout` (``timeout_s`` defaults to twice the cycle budget at the
    transport's ``clock_mhz`` where it has one (:class:`PynqTransport`: the overlay's clock), else at the
    description's clock, at least a minute; a simulation, slower than the clock, passes its own).
    ``check``: run :meth:`connect` in the constructor (blocking transports only: with an
    :class:`AsyncTransport` await ``connect()`` yourself).
    ``step_log``: a path or a :class:`host.energy.StepLog`: every :meth:`train_step` appends one JSON line
    (wall-clock start and end, monotonic duration, the step's cycles, the batch size, the step index) for
    ``xnortrain energy-measure``; None (default) logs nothing.
    """

    def __init__(self, desc: AcceleratorDescription, transport: Transport, *, poll_cycles: int = 64,
                 timeout_cycles: int = 1 << 32, timeout_s: float | None = None, check: bool = True,
                 step_log=None):
        if not isinstance(desc, AcceleratorDescription):
            raise TypeError(f"desc must be an AcceleratorDescription, not {desc!r}")
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be a Transport, not {transport!r}")
        self.desc = desc
        self.map = desc.regmap
        self.transport = transport
        self.poll_cycles = int(poll_cycles)
        self.timeout_cycles = int(timeout_cycles)
        if timeout_s is None:  # at the transport's clock where it knows it (PynqTransport: the overlay's)
            clock = getattr(transport, "clock_mhz", None) or desc.clock_mhz
            timeout_s = max(60.0, 2 * self.timeout_cycles / (clock * 1e6))
        if not float(timeout_s) > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, not {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._steps_base = 0  # steps restored by load_state_dict minus the hardware counter at that time
        self._schedule = None  # last schedule words written (to skip rewriting unchanged tables)
        self.last_infer_cycles: int | None = None  # cycles register after the last infer
        self._model_cfg = None  # the description's configuration, loaded on the first restore (False: none)
        if step_log is not None and not hasattr(step_log, "record"):  # a path: host.energy.StepLog opens it
            from host.energy import StepLog

            step_log = StepLog(step_log)
        self.step_log = step_log
        transport.attach(desc)
        if check and isinstance(transport, BlockingTransport):
            self.connect()

    # -- public API -----------------------------------------------------------------------------------------

    def connect(self):
        """Check that the hardware is the accelerator of the description: read the identification (``id``),
        geometry (``info``), batch (``info_batch``) and description hash (``id_hash``) registers and compare
        every field with the value :meth:`expected_identity` gives. Raises :class:`HardwareMismatch` naming
        each differing field with the expected and the read value ("description hash": the hardware was built
        from another description than this one, :func:`description_hash`), or when the description predates
        the hash register; returns the fields read (by register)."""
        return self.transport.execute(self._connect())

    def expected_identity(self) -> dict[str, dict[str, int]]:
        """What :meth:`connect` expects: each field's build-time value in the register map of the
        description; ``info.layers``, ``info.classes``, ``info.input_int8`` and ``info_batch.batch`` from the
        description's own fields (the ones the driver packs data with); ``id_hash.value`` is
        :func:`description_hash` of the description (not the value its register map records, so an edited
        accelerator.json is refused too)."""
        d = self.desc
        own = {("info", "layers"): len(d.layers), ("info", "classes"): d.classes,
               ("info", "input_int8"): int(d.input == "int8"), ("info_batch", "batch"): d.batch,
               (HASH_REGISTER, "value"): description_hash(d)}
        out = {}
        if HASH_REGISTER not in self.map:
            # refused, not warned: without the hash nothing ties the description to the bitstream beyond a few
            # geometry fields, and a wrong pairing trains silently wrong (issue 19)
            raise HardwareMismatch(
                f"accelerator.json ({d.name}) has no {HASH_REGISTER!r} register: it was generated before "
                "descriptions were hashed into the bitstream; regenerate it and the bitstream with this xnortrain",
                [f"{HASH_REGISTER}: missing from accelerator.json"])
        for reg in IDENTITY_REGISTERS:
            if reg not in self.map:
                raise ValueError(f"accelerator.json: the register map has no {reg!r} register")
            out[reg] = {f.name: own.get((reg, f.name), f.reset) for f in self.map[reg].fields}
        return out

    def check_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Raise :class:`StateError` (naming the key) unless :meth:`load_state_dict` can restore ``state``
        as a whole: every key the accelerator holds present and none other, shapes as in the description,
        integer values that fit the stored bit widths, weights +-1, every generator state nonzero; then,
        where the description's configuration can be loaded (:meth:`model_config`), the bit-exact model's
        :func:`sim.hw.model.validate_state` (ranges the configuration allows within those widths, the
        coupling of weights and optimiser state)."""
        self._encode_state(state)

    def model_config(self):
        """The configuration the accelerator was generated from (accelerator.json's ``config``), or None
        when the description has none or it cannot be loaded here (no ``sim`` package: the description's own
        checks still apply)."""
        if self._model_cfg is None:
            self._model_cfg = False
            if self.desc.config:
                try:
                    from sim.config import config_from_dict, tomllib
                    from sim.schema import ConfigError
                except ImportError:
                    return None
                try:
                    self._model_cfg = config_from_dict(tomllib.loads(self.desc.config))
                except (tomllib.TOMLDecodeError, ConfigError) as e:
                    raise ValueError(f"accelerator.json: its config does not load: {e}") from None
        return self._model_cfg or None

    def read_register(self, name: str):
        """Field values of register ``name`` (a dict by field name)."""
        return self.transport.execute(self._read_fields(name))

    def write_register(self, name: str, **fields):
        """Write register ``name`` with ``fields`` (others 0)."""
        return self.transport.execute(self._write_fields(name, **fields))

    def status(self):
        """``{"status": {...}, "done": {...}, "error": {...}, "cycles": n, "steps": n, "correct": n}``."""
        return self.transport.execute(self._status())

    def abort(self):
        """Stop whatever the accelerator is doing; clears ``done`` and ``error``."""
        return self.transport.execute(self._abort())

    def upload(self, x, labels):
        """Send one batch (``x``: ``[B, features]`` +-1 or int8 values; ``labels``: ``[B]``)."""
        return self.transport.execute(self._upload(x, labels))

    def infer(self, x, *, logits: bool = False):
        """Classify ``x`` (``[n, features]``, 1 <= n <= the batch size) on the accelerator with its running BN
        statistics (``HwModel.forward_eval``); the training state is left untouched. Returns the predicted
        classes (``[n]``, int64), and with ``logits=True`` ``(classes, logits)`` (``[n, classes]``, Q.FL
        integers). The cycles of the command are in :attr:`last_infer_cycles`."""
        return self.transport.execute(self._infer(x, logits=logits))

    def train_step(self, x, labels, *, lr: float, progress: float = 0.0, lr0: float | None = None):
        """Upload a batch, run one training step, read the logits: a :class:`StepResult`."""
        return self.transport.execute(self._train_step(x, labels, lr=lr, progress=progress, lr0=lr0))

    def read(self, name: str, layer: int | None = None):
        """Read back one quantity (decoded array)."""
        return self.transport.execute(self._readback(self.desc.quantity(name, layer)))

    def write(self, name: str, layer: int | None, array):
        """Restore one quantity."""
        return self.transport.execute(self._restore(self.desc.quantity(name, layer), array))

    def state_dict(self):
        """Every readable ``rw`` quantity, keyed like :meth:`sim.hw.model.HwModel.state_dict` (``w0``,
        ``acc0``, ``beta0``, ..., ``rng`` concatenated over layers, ``steps``)."""
        return self.transport.execute(self._state_dict())

    def load_state_dict(self, state: Mapping[str, np.ndarray]):
        """Restore everything :meth:`state_dict` returns. The whole state is checked first
        (:meth:`check_state`): a bad state raises :class:`StateError` before anything is written."""
        return self.transport.execute(self._load_state_dict(state))

    # -- programs -------------------------------------------------------------------------------------------

    def _read_fields(self, name: str) -> Program:
        word = yield Read(self.map.addr(name))
        return self.map.decode(name, word)

    def _connect(self) -> Program:
        got, bad = {}, []
        for reg, fields in self.expected_identity().items():
            got[reg] = yield from self._read_fields(reg)
            bad += [f"description hash ({reg}): accelerator.json {v:#010x}, hardware {got[reg][f]:#010x}"
                    if reg == HASH_REGISTER else f"{reg}.{f}: accelerator.json {v}, hardware {got[reg][f]}"
                    for f, v in fields.items() if got[reg][f] != v]
        if bad:
            raise HardwareMismatch(f"the accelerator is not the one accelerator.json describes ({self.desc.name}; "
                                   f"another bitstream or description?): {'; '.join(bad)}", bad)
        return got

    def _stream(self, op: Send | Receive, what: str) -> Program:
        """Run one stream transfer; when the transport gives up on it (:class:`TransferTimeout`), abort the
        accelerator's command too and name the transfer in the error."""
        try:
            return (yield op)
        except TransferTimeout as e:
            yield from self._abort()
            raise TransferTimeout(f"{what}: {e}; the command was aborted") from None

    def _write_fields(self, name: str, **fields) -> Program:
        yield Write(self.map.addr(name), self.map.encode(name, **fields))

    def _status(self) -> Program:
        out = {}
        for reg in ("status", "done", "error"):
            out[reg] = yield from self._read_fields(reg)
        for reg in ("cycles", "steps", "correct", "undone"):
            out[reg] = (yield from self._read_fields(reg))["value"]
        return out

    def _abort(self) -> Program:
        yield from self._write_fields("cmd", abort=1)
        yield from self._clear()

    def _clear(self) -> Program:
        """Clear every done and error flag (w1c)."""
        for reg in ("done", "error"):
            r = self.map[reg]
            yield Write(r.addr, sum(f.mask for f in r.fields))

    def _check_errors(self, what: str) -> Program:
        err = yield from self._read_fields("error")
        flags = [k for k, v in err.items() if v]
        if flags:
            yield from self._clear()
            raise AcceleratorError(f"{what}: the accelerator reported error(s) {', '.join(flags)}", flags)

    def _command(self, name: str, **arg) -> Program:
        """Write ``arg`` fields, clear ``done``, pulse ``cmd.<name>``; raise at once if it was refused."""
        if arg:
            yield from self._write_fields("arg", **arg)
        done = self.map["done"]
        yield Write(done.addr, done.field(name).mask)
        yield from self._write_fields("cmd", **{name: 1})
        yield from self._check_errors(f"command {name}")

    def _wait_done(self, name: str, what: str | None = None) -> Program:
        """Poll ``done.<name>`` (and ``error``) with growing pauses until set, or time out (cycles or wall
        time); ``what`` names the command in errors (default ``name``)."""
        what = what or name
        waited, pause = 0, self.poll_cycles
        done = self.map["done"]
        err = self.map["error"]
        t0 = time.monotonic()
        while True:
            word = yield Read(done.addr)
            if done.decode(word)[name]:
                break
            eword = yield Read(err.addr)
            if eword:
                yield from self._check_errors(f"command {what}")
            elapsed = time.monotonic() - t0
            if waited >= self.timeout_cycles or elapsed >= self.timeout_s:
                yield from self._abort()
                raise AcceleratorTimeout(f"command {what} not done after {elapsed:.2f} s ({waited} cycles; budget "
                                         f"{self.timeout_s:g} s, {self.timeout_cycles} cycles); aborted")
            yield Sleep(pause)
            waited += pause
            pause = min(2 * pause, 64 * self.poll_cycles)
        yield Write(done.addr, done.field(name).mask)
        yield from self._check_errors(f"command {name}")

    def batch_words(self, x, labels, *, partial: bool = False) -> np.ndarray:
        """The beats of one batch upload: the samples (``batch_layout``), then the labels (``label_layout``).
        ``partial``: ``n`` samples, 1 .. the batch size (an ``infer`` batch; ``train`` needs a full one)."""
        d = self.desc
        x = np.asarray(x)
        labels = np.asarray(labels)
        n = len(x) if partial and x.ndim == 2 else d.batch
        if partial and not 1 <= n <= d.batch:
            raise ValueError(f"batch: {n} samples; the accelerator takes 1 .. {d.batch} (its batch size) at a time")
        if x.shape != (n, d.features):
            raise ValueError(f"batch: expected x of shape {(n, d.features)}, got {x.shape}")
        if labels.shape != (n,):
            raise ValueError(f"batch: expected {n} labels, got shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= d.classes):
            raise ValueError(f"batch: labels must be in 0..{d.classes - 1}")
        if n == d.batch:
            return np.concatenate([d.batch_layout.encode(x), d.label_layout.encode(labels.astype(np.int64))])
        # the first n rows of a full batch (sample-major words), then n labels
        full = np.ones((d.batch, d.features), dtype=x.dtype)
        full[:n] = x
        xw = d.batch_layout.encode(full)
        lw = d.label_layout.encode(np.concatenate([labels.astype(np.int64), np.zeros(d.batch - n, np.int64)]))
        lab_words = -(-n // d.label_layout.elems_per_word) * d.label_layout.beats_per_word
        return np.concatenate([xw[: len(xw) // d.batch * n], lw[:lab_words]])

    def _upload(self, x, labels) -> Program:
        words = self.batch_words(x, labels)
        yield from self._command("upload", batch=self.desc.batch)
        yield from self._stream(Send(words), "upload batch")
        yield from self._wait_done("upload")

    def schedule_words(self, lr: float, progress: float, lr0: float | None) -> dict:
        """Per-step constants of the hardware optimiser (docs/arithmetic.md, "Update"), computed with
        :mod:`sim.hw.optim` as the bit-exact model does: ``sched`` register fields ``lr_shift``
        (round(-log2 lr): beta and sgd), ``opt_shift`` (bop's EMA shift or iir's alpha shift at this point
        of the schedule) and ``switch_gate`` (``switch_gate(lr / lr0, hw.switch_rate)``: the switch accumulators
        take their increment only where ``(u & 0xFFFF) < gate``; 65536 = always), and for the switch optimiser its
        probability table ``switch_table`` (``switch_table_at``: the configured lambda, the threshold sigma
        annealed with ``lr / lr0`` by ``hw.switch_anneal``; written to every layer's weight memory when it
        changes, at most once per threshold step)."""
        from sim.hw import optim as O

        s = self.desc.schedule
        lr0 = float(s.get("lr0", lr)) if lr0 is None else float(lr0)
        ratio = lr / lr0 if lr0 > 0 else 1.0
        out = {"lr_shift": min(O.lr_shift(lr), 63), "opt_shift": 0, "switch_gate": 1 << O.PROB_BITS}
        opt = s.get("optimizer", "switch")
        if opt == "bop":
            out["opt_shift"] = min(int(s["bop_shift"]) + O.ratio_shift(ratio), 16)
        elif opt == "iir":
            from sim.reference.optim import iir_beta

            beta = iir_beta(progress, s["alpha_decay"], epochs=int(s["epochs"]), factor=float(s["decay_factor"]),
                            every=int(s["decay_every"]))
            out["opt_shift"] = int(s["iir_alpha_shift"]) + O.ratio_shift(beta, int(s["iir_max_decay_shift"]))
        elif opt == "sgd":
            out["opt_shift"] = min(O.lr_shift(lr), 63)
        elif opt == "switch":
            out["switch_gate"] = O.switch_gate(ratio, float(s.get("switch_rate", 1.0)))
            out["switch_table"] = tuple(int(v) for v in O.switch_table_at(
                int(s["switch_cutoff"]), float(s["switch_sigma"]), float(s["switch_lambda"]),
                float(s.get("switch_anneal", 0.0)), ratio))
        return out

    def _set_schedule(self, lr: float, progress: float, lr0: float | None) -> Program:
        words = self.schedule_words(lr, progress, lr0)
        old = self._schedule or {}
        regs = {k: v for k, v in words.items() if k != "switch_table"}
        if regs != {k: v for k, v in old.items() if k != "switch_table"}:
            yield from self._write_fields("sched", **regs)
        if "switch_table" in words and words["switch_table"] != old.get("switch_table"):
            table = np.array(words["switch_table"], dtype=np.int64)
            for q in self.desc.quantities:
                if q.name == "switch_table":
                    yield from self._restore(q, table)
        self._schedule = words

    def _train_step(self, x, labels, *, lr: float, progress: float, lr0: float | None) -> Program:
        from sim.hw.arith import ArithParams, loss_grad

        t_start, m_start = time.time(), time.monotonic()  # the step window of the step log
        yield from self._set_schedule(lr, progress, lr0)
        yield from self._upload(x, labels)
        yield from self._command("train")
        yield from self._wait_done("train")
        cycles = (yield from self._read_fields("cycles"))["value"]
        correct = (yield from self._read_fields("correct"))["value"]
        undone = (yield from self._read_fields("undone"))["value"]
        loss_q = (yield from self._read_fields("loss"))["value"]
        if "loss_hi" in self.map:  # an integer loss wider than one register
            loss_q |= (yield from self._read_fields("loss_hi"))["value"] << 32
        logits = yield from self._readback(self.desc.quantity("logits", len(self.desc.layers) - 1))
        if self.step_log is not None:
            self.step_log.record(t_start=t_start, t_end=time.time(), duration_s=time.monotonic() - m_start,
                                 cycles=int(cycles), batch=len(labels))
        p = ArithParams(**self.desc.schedule.get("arith", {}))
        _, loss, _ = loss_grad(logits, labels, p)
        return StepResult(loss=loss, correct=int(correct), cycles=int(cycles), logits=logits, undone=bool(undone),
                          loss_q=int(loss_q))

    def _infer(self, x, *, logits: bool) -> Program:
        d = self.desc
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != d.features:
            raise ValueError(f"infer: expected x of shape (n, {d.features}), got {x.shape}")
        n = len(x)
        if not 1 <= n <= d.batch:
            raise ValueError(f"infer: {n} samples; the accelerator classifies 1 .. {d.batch} (its batch size) "
                             "at a time")
        words = self.batch_words(x, np.zeros(n, np.int64), partial=True)
        yield from self._command("upload", batch=n)
        yield from self._stream(Send(words), f"upload {n} samples to infer")
        yield from self._wait_done("upload")
        yield from self._command("infer")
        yield from self._wait_done("infer")
        self.last_infer_cycles = int((yield from self._read_fields("cycles"))["value"])
        classes = (yield from self._readback(d.quantity("classes")))[:n].astype(np.int64)
        if not logits:
            return classes
        lg = yield from self._readback(d.quantity("logits", len(d.layers) - 1))
        return classes, np.asarray(lg)[:n]

    def _readback(self, q: QuantityLayout) -> Program:
        if q.access == "wo":
            raise ValueError(f"{q.key} is write-only on the accelerator")
        yield from self._command("readback", layer=q.layer or 0, quantity=q.kind)
        words = yield from self._stream(Receive(q.beats), f"readback {q.key}")
        yield from self._wait_done("readback", f"readback {q.key}")
        return q.decode(words)

    def _restore(self, q: QuantityLayout, array) -> Program:
        if q.access == "ro":
            raise ValueError(f"{q.key} is read-only on the accelerator")
        yield from self._restore_words(q, q.encode(array))

    def _restore_words(self, q: QuantityLayout, words: np.ndarray) -> Program:
        yield from self._command("restore", layer=q.layer or 0, quantity=q.kind)
        yield from self._stream(Send(words), f"restore {q.key} ({len(words)} words)")
        yield from self._wait_done("restore", f"restore {q.key}")

    def _state_dict(self) -> Program:
        out: dict[str, np.ndarray] = {}
        rng = []
        for q in self.desc.quantities:
            if q.access != "rw":
                continue
            a = yield from self._readback(q)
            if q.name == "rng":
                rng.append(a.astype(np.uint32))
            elif q.shape == ():
                out[q.key] = np.array(int(a), dtype=np.int64)
            else:
                out[q.key] = a
        if rng:
            out["rng"] = np.concatenate(rng)
        steps = (yield from self._read_fields("steps"))["value"]
        out["steps"] = np.array(steps + self._steps_base, dtype=np.int64)
        return out

    def _encode_state(self, state: Mapping[str, np.ndarray]) -> tuple[list, int]:
        """``([(quantity, words), ...], steps)`` for a restore of ``state``, or :class:`StateError`."""
        rw = [q for q in self.desc.quantities if q.access == "rw"]
        rngs = [q for q in rw if q.name == "rng"]
        keys = [q.key for q in rw if q.name != "rng"] + (["rng"] if rngs else []) + ["steps"]
        missing = [k for k in keys if k not in state]
        if missing:
            raise StateError(f"state: {', '.join(map(repr, missing))} {'is' if len(missing) == 1 else 'are'} "
                             f"missing (the accelerator holds {', '.join(keys)})")
        unknown = [k for k in state if k not in keys]
        if unknown:
            raise StateError(f"state: {', '.join(map(repr, unknown))} not held by the accelerator "
                             f"(it holds {', '.join(keys)}; a state of another configuration?)")
        arrays = {k: np.asarray(state[k]) for k in keys}
        for k, a in arrays.items():
            if a.dtype.kind not in "iu":
                raise StateError(f"state: {k!r} has dtype {a.dtype}; integer values are needed")
        steps = arrays["steps"]
        if steps.shape != ():
            raise StateError(f"state: 'steps' has shape {steps.shape}; a single integer is needed")
        if steps < 0:
            raise StateError(f"state: 'steps' = {int(steps)}; must be >= 0")
        rng = arrays.get("rng")
        if rngs:
            n = sum(math.prod(q.shape) for q in rngs)
            if rng.ndim != 1 or len(rng) != n:
                raise StateError(f"state: 'rng' has shape {rng.shape}: {rng.size} generators; the accelerator has {n}")
            _check_range("rng", rng, 0, (1 << 32) - 1, "32-bit generator state")
            if not rng.all():
                raise StateError(f"state: 'rng' generator {int(np.argmin(rng != 0))} is 0; xorshift32 states must be "
                                 "nonzero (a zero state never changes)")
        plan, at = [], 0
        for q in rw:
            if q.name == "rng":
                a = rng[at : at + math.prod(q.shape)].reshape(q.shape)
                at += a.size
            else:
                a = arrays[q.key]
                if a.shape != q.shape:
                    raise StateError(f"state: {q.key!r} has shape {a.shape}; the accelerator holds {q.shape}")
                if q.encoding == "sign":
                    bad = np.argwhere((a != 1) & (a != -1))
                    if len(bad):
                        i = tuple(int(v) for v in bad[0])
                        raise StateError(f"state: {q.key!r}{list(i)} = {int(a[i])}; weights must be +-1")
                else:
                    lo, hi = (-(1 << (q.elem_bits - 1)), (1 << (q.elem_bits - 1)) - 1) if q.signed else (
                        0, (1 << q.elem_bits) - 1)
                    _check_range(q.key, a, lo, hi, f"{q.elem_bits}-bit {'signed' if q.signed else 'unsigned'} field")
            try:
                plan.append((q, q.encode(a.astype(np.int64))))
            except ValueError as e:
                raise StateError(f"state: {q.key!r}: {e}") from None
        cfg = self.model_config()
        if cfg is not None:
            from sim.hw.model import StateError as ModelStateError
            from sim.hw.model import validate_state

            try:
                validate_state(cfg, state)
            except ModelStateError as e:
                raise StateError(f"state: {e}") from None
        return plan, int(steps)

    def _load_state_dict(self, state: Mapping[str, np.ndarray]) -> Program:
        plan, steps = self._encode_state(state)  # everything checked before the first write
        for q, words in plan:
            yield from self._restore_words(q, words)
        hw_steps = (yield from self._read_fields("steps"))["value"]
        self._steps_base = steps - hw_steps


def _check_range(key: str, a: np.ndarray, lo: int, hi: int, what: str) -> None:
    """:class:`StateError` naming the first element of integer array ``a`` outside ``lo..hi``."""
    if not a.size:
        return
    bad = np.argwhere((a < lo) | (a > hi))
    if len(bad):
        i = tuple(int(v) for v in bad[0])
        raise StateError(f"state: {key!r}{list(i)} = {int(a[i])} does not fit the accelerator's {what} ({lo}..{hi})")

