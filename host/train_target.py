"""Training on a target: the accelerator (simulated board or PYNQ board) or the bit-exact model.

``xnortrain train --target sim|board|model`` trains through :func:`sim.train_loop.run_training`, the one loop
of the project; the targets differ only in the engine handed to it:

* ``model``: :class:`sim.hw.engine.HwEngine`, the bit-exact integer model alone;
* ``sim`` and ``board``: :class:`AcceleratorEngine`, the generated accelerator through the host
  :class:`host.driver.Driver` (a :class:`host.simboard.SimBoard` in Verilator, or the overlay on a board).

All three are the engine kind ``"hw"`` with one state layout (:meth:`sim.hw.model.HwModel.state_dict`), so a
checkpoint written on one target resumes on any other.

The accelerator engine trains with the accelerator's own step (``train`` command) and evaluates with its
``infer`` command (classes and logits of every test image, running BN statistics), so the accuracy printed is
the one the hardware measured. ``check_every = K`` runs the bit-exact model beside it on the same batches and
compares the whole state every K steps (and the logits of every step and every evaluated batch): the first
difference stops training with :class:`TargetMismatch`, naming layer, quantity, index, expected and got.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sim.train_loop import StepResult

__all__ = ["AcceleratorEngine", "TargetMismatch", "first_difference", "TARGETS"]

#: ``--target`` values: where training runs.
TARGETS = ("sim", "board", "model")


class TargetMismatch(RuntimeError):
    """The accelerator and the bit-exact model disagree (``--check-every``); the message names the first
    difference: step, quantity (with its layer), index, expected (model) and got (accelerator)."""

    def __init__(self, message: str, *, step: int, key: str, index: tuple, expected, got):
        super().__init__(message)
        self.step, self.key, self.index, self.expected, self.got = step, key, index, expected, got


def _describe_key(key: str) -> str:
    """``acc2`` -> ``acc of layer 2``; keys without a layer number stay as they are."""
    stem = key.rstrip("0123456789")
    if stem != key and stem:
        return f"{stem} of layer {key[len(stem):]}"
    return key


def first_difference(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]):
    """The first difference between two states, in the order of ``expected``'s keys: ``(key, index, exp, got)``
    (``index`` a tuple; ``None`` values for a missing key or a shape difference), or ``None`` when equal."""
    for key, e in expected.items():
        if key not in got:
            return key, (), "present", "missing"
        a, b = np.asarray(e), np.asarray(got[key])
        if a.shape != b.shape:
            return key, (), f"shape {a.shape}", f"shape {b.shape}"
        diff = np.argwhere(a != b)
        if len(diff):
            idx = tuple(int(i) for i in diff[0])
            return key, idx, a[idx].item() if a.ndim else a.item(), b[idx].item() if b.ndim else b.item()
    for key in got:
        if key not in expected:
            return key, (), "missing", "present"
    return None


class AcceleratorEngine:
    """A :class:`sim.train_loop.TrainEngine` that trains on the accelerator behind ``driver``.

    ``driver``: a connected :class:`host.driver.Driver` on a blocking transport. ``cfg``: the configuration
    the accelerator was generated from (input preparation, the schedule's initial rate). ``check_every``:
    0 = no comparison; K > 0 = run the bit-exact model in lockstep and compare the whole state every K
    steps. ``target``: a label for messages ("sim" or "board").

    The flip ratio of the history is measured as on the model: the weights are read back after every step
    (a few percent of a step's transfers) and compared with the previous ones.

    ``step_snapshot = False`` tells the training loop not to read the whole state before every step (on the
    accelerator that is a transfer of every quantity, as long as the step itself): a step cut by a second,
    immediate interrupt cannot be rolled back, and the last checkpoint on disk is kept instead.
    """

    name = "hw"
    step_snapshot = False

    def __init__(self, cfg, driver, *, check_every: int = 0, target: str = "sim"):
        from sim.hw.engine import HwEngine

        if int(check_every) < 0:
            raise ValueError(f"check_every = {check_every}: must be >= 0 (0 = no comparison with the model)")
        self.cfg = cfg
        self.driver = driver
        self.target = target
        self.check_every = int(check_every)
        start = HwEngine(cfg)  # the configuration's initial state (seeded), as the model target starts
        self._model = start if self.check_every else None
        self._steps = 0
        self.n_weights = int(cfg.n_weights)
        self._weight_keys = [q.key for q in driver.desc.quantities if q.name == "w" and q.access == "rw"]
        self._weights = None
        self.last_step = None  # the driver's StepResult of the last step (cycles, logits, loss_q)
        self.cycles = 0  # accelerator cycles of all training steps run by this engine
        self.driver.load_state_dict(start.state_dict())  # a resume replaces it (load_state_dict)

    # -- TrainEngine ---------------------------------------------------------------------------------------

    def prepare_inputs(self, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
        from sim.hw.engine import prepare_inputs

        return prepare_inputs(self.cfg, x_uint8, dither=dither)

    def train_step(self, x: np.ndarray, y: np.ndarray, *, lr: float, progress: float) -> StepResult:
        if self._weights is None:
            self._weights = self._read_weights()
        res = self.driver.train_step(x, y, lr=lr, progress=progress, lr0=float(self.cfg.lr))
        self.last_step = res
        self.cycles += int(res.cycles)
        self._steps += 1
        weights = self._read_weights()
        flips = sum(int(np.count_nonzero(weights[k] != self._weights[k])) for k in weights)
        self._weights = weights
        if self._model is not None:
            self._model.train_step(x, y, lr=lr, progress=progress)
            tr = self._model.last_trace
            self._compare({"logits": tr.logits_q}, {"logits": res.logits}, "training logits")
            if self._steps % self.check_every == 0:
                self._compare(self._model.state_dict(), self.driver.state_dict(), "state")
        return StepResult(loss=res.loss, correct=res.correct, flips=flips, n_weights=self.n_weights)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        from sim.hw.arith import ArithParams, loss_grad

        B = int(self.driver.desc.batch)  # the accelerator classifies up to its batch size per command
        parts = [self.driver.infer(x[i:i + B], logits=True) for i in range(0, len(x), B)]
        classes = np.concatenate([c for c, _ in parts])
        logits = np.concatenate([lg for _, lg in parts])
        if self._model is not None:
            self._compare({"logits": self._model.model.forward_eval(x)}, {"logits": logits}, "inference logits")
        p = ArithParams.from_config(self.cfg)
        _, loss, _ = loss_grad(logits, np.asarray(y), p)
        return loss, int(np.count_nonzero(np.asarray(classes) == np.asarray(y)))

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.driver.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore ``state`` into the accelerator (the driver checks the whole state first) and, with
        ``check_every``, into the model beside it."""
        self.driver.load_state_dict(state)
        self._weights = None
        if self._model is not None:
            self._model.load_state_dict(state)

    # -- helpers -------------------------------------------------------------------------------------------

    def _read_weights(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(self.driver.read("w", int(k[1:]))) for k in self._weight_keys}

    def _compare(self, expected, got, what: str) -> None:
        diff = first_difference(expected, got)
        if diff is None:
            return
        key, index, exp, val = diff
        where = f"[{', '.join(map(str, index))}]" if index else ""
        raise TargetMismatch(
            f"the accelerator ({self.target}) differs from the bit-exact model after step {self._steps} "
            f"({what}): {_describe_key(key)}{where}: expected {exp}, got {val}",
            step=self._steps, key=key, index=index, expected=exp, got=val)
