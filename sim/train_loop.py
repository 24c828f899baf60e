"""The one training loop of xnortrain.

The float reference (:class:`sim.reference.engine.ReferenceEngine`) and the
bit-exact hardware model both train through :func:`run_training`; they differ
only in the *engine* they hand it. An engine implements :class:`TrainEngine`:
it turns ``uint8`` images into its own input format, runs one training step on
a mini-batch, evaluates a batch in inference mode and exposes its state.

Everything around the step lives here, once:

* data: ``cfg.data`` (dataset, path, train_limit, test_limit, dev_size);
* randomness: three generators derived from ``cfg.train.seed`` (dev split,
  shuffling, mini-batch dropping), so a seed fixes the whole run;
* stochastic mini-batch dropping (E2-Train, ``cfg.e2train.smd_prob``): every
  mini-batch is skipped with that probability; the learning-rate schedule is
  not changed by it, as in the E2-Train paper;
* the learning-rate schedule (``cfg.train.lr``), see :class:`LRSchedule`;
* per-epoch evaluation, a one-line log, a tqdm bar, a :class:`History` that is
  written to JSON after every epoch when a path is given;
* checkpoints (:class:`Checkpoint`): the whole training state (engine state,
  the loop's generators, data order and position in the epoch, the schedule,
  the history, the configuration) written atomically after every epoch and
  whenever the run stops, always between two whole steps; ``resume=`` continues
  a run bit-identically;
* a clean stop on Ctrl-C or SIGTERM at the next step boundary (the history so
  far is returned and the state saved).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from .config import Config, ConfigError

__all__ = [
    "StepResult",
    "TrainEngine",
    "History",
    "LRSchedule",
    "load_training_data",
    "evaluate_dataset",
    "run_training",
    "seed_rngs",
    "dither_rng",
    "Checkpoint",
    "CheckpointError",
    "atomic_write",
    "save_checkpoint",
    "load_checkpoint",
    "config_difference",
    "data_fingerprint",
]


# ---------------------------------------------------------------------------
# The engine protocol


@dataclass
class StepResult:
    """What one training step reports."""

    loss: float  # mean loss over the mini-batch (training mode)
    correct: int  # correctly classified images of the mini-batch (training-mode forward pass)
    flips: int  # binary weights whose sign changed in this step
    n_weights: int  # binary weights in the network (denominator of the flip ratio)


@runtime_checkable
class TrainEngine(Protocol):
    """A trainable BNN: the float reference or the bit-exact hardware model."""

    name: str

    def prepare_inputs(self, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
        """``uint8 [N, C, H, W]`` images -> this engine's first-layer input (per cfg.data / cfg.model.input_format).

        ``dither``: binarised input takes a random threshold per pixel from this generator (training
        batches when ``data.dither`` is set, :func:`sim.datasets.binarize_dithered`); other inputs ignore it.
        """
        ...

    def train_step(self, x: np.ndarray, y: np.ndarray, *, lr: float, progress: float) -> StepResult:
        """One step (forward, backward, update) on prepared inputs ``x`` and labels ``y``.

        ``progress`` is the fraction of the planned training done, in [0, 1] (used by decaying optimisers).
        """
        ...

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(mean loss, correct count) of prepared inputs in inference mode (running BN statistics)."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume or inspect the model, as named arrays (copies)."""
        ...

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore a :meth:`state_dict`, checking the whole state before changing anything."""
        ...


# ---------------------------------------------------------------------------
# History


@dataclass
class History:
    """Per-epoch record of a training run; every list has one entry per finished epoch."""

    epoch: list = field(default_factory=list)  # 1-based epoch number
    lr: list = field(default_factory=list)  # learning rate used during the epoch
    loss: list = field(default_factory=list)  # mean training loss over the steps run
    train_acc: list = field(default_factory=list)  # training accuracy (training-mode forward passes)
    test_loss: list = field(default_factory=list)
    test_acc: list = field(default_factory=list)
    best_test_acc: list = field(default_factory=list)  # running maximum of test_acc
    dev_metric: list = field(default_factory=list)  # the signal the development schedule saw (lower = better)
    flip_ratio: list = field(default_factory=list)  # flips / binary weights, averaged over the epoch's steps
    steps: list = field(default_factory=list)  # steps run in the epoch
    dropped: list = field(default_factory=list)  # mini-batches skipped by SMD in the epoch
    # evaluations within epochs (``eval_every``): {"step", "epoch" (fractional), "test_loss", "test_acc"}
    evals: list = field(default_factory=list)
    seconds: list = field(default_factory=list)  # wall time of the epoch (training + evaluation)
    meta: dict = field(default_factory=dict)  # run description: engine, config, data source, stop reason

    @property
    def best(self) -> float:
        """Best test accuracy of the run (0 before the first epoch)."""
        return self.best_test_acc[-1] if self.best_test_acc else 0.0

    @property
    def total_steps(self) -> int:
        return int(sum(self.steps))

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the history as JSON (atomically: a crash never leaves a half-written file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=1, default=_json_default) + "\n"
        return atomic_write(path, lambda fh: fh.write(text.encode()))

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> History:
        data = json.loads(Path(path).read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def plot(self, path: str | os.PathLike) -> Path:
        """Accuracy and loss curves as a PNG (matplotlib, Agg backend)."""
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
        ep = self.epoch
        ax_acc.plot(ep, [100 * a for a in self.train_acc], label="train")
        ax_acc.plot(ep, [100 * a for a in self.test_acc], label="test")
        if self.evals:
            ax_acc.plot([e["epoch"] for e in self.evals], [100 * e["test_acc"] for e in self.evals], ".",
                        label="test (every N steps)")
        ax_acc.set_xlabel("epoch")
        ax_acc.set_ylabel("accuracy (%)")
        ax_acc.set_title(f"best test {100 * self.best:.2f} %")
        ax_acc.grid(alpha=0.3)
        ax_acc.legend()
        ax_loss.plot(ep, self.loss, label="train")
        ax_loss.plot(ep, self.test_loss, label="test")
        ax_loss.set_xlabel("epoch")
        ax_loss.set_ylabel("loss")
        ax_loss.grid(alpha=0.3)
        ax_loss.legend()
        title = self.meta.get("title") or self.meta.get("config_name", "")
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot write {type(o).__name__} to JSON")


# ---------------------------------------------------------------------------
# Learning-rate schedule


class LRSchedule:
    """The learning rate of ``cfg.train.lr`` (initial value: ``cfg.lr``, which honours ``optimizer.lr``).

    ``constant``
        the initial value throughout.
    ``development``
        Wilson et al. (2017): after every epoch the schedule is shown a development
        signal (lower is better); when it has not improved for ``patience`` epochs in a
        row the rate is multiplied by ``factor`` and the count starts again. The signal
        is the error rate on the held-out development set (``data.dev_size`` images
        split from the training set); with ``dev_size = 0`` there is no development set
        and the epoch's mean *training loss* is used instead (it keeps falling while the
        optimiser makes progress, which is what the schedule needs to see).
    ``step``
        multiplied by ``factor`` once for every milestone epoch already finished
        (milestone ``m``: epochs ``m+1, m+2, ..`` use the decayed value).
    ``cosine``
        half a cosine from the initial value down to ``min`` over the planned run,
        evaluated per step from ``progress``.

    The rate never goes below ``min``.
    """

    def __init__(self, cfg: Config):
        self.c = cfg.train.lr
        self.initial = float(cfg.lr)
        self.floor = float(self.c.min)
        self.value = self.initial
        self.best = math.inf
        self.bad_epochs = 0
        self.decays = 0

    def lr(self, epoch: int, progress: float) -> float:
        """Rate for a step of 0-based ``epoch`` at run fraction ``progress``."""
        kind = self.c.schedule
        if kind == "step":
            n = sum(1 for m in self.c.milestones if m <= epoch)
            v = self.initial * self.c.factor**n
        elif kind == "cosine":
            p = min(max(progress, 0.0), 1.0)
            v = self.floor + (self.initial - self.floor) * 0.5 * (1.0 + math.cos(math.pi * p))
        else:
            v = self.value
        return max(v, self.floor)

    def end_epoch(self, signal: float) -> bool:
        """Show the development signal of a finished epoch; True when the rate was decayed."""
        if self.c.schedule != "development" or not math.isfinite(signal):
            return False
        if signal < self.best:
            self.best = signal
            self.bad_epochs = 0
            return False
        self.bad_epochs += 1
        if self.bad_epochs >= self.c.patience:
            self.bad_epochs = 0
            self.value = max(self.value * self.c.factor, self.floor)
            self.decays += 1
            return True
        return False


# ---------------------------------------------------------------------------
# Data


def seed_rngs(seed: int) -> dict[str, np.random.Generator]:
    """Independent generators of one run: dev split, shuffling, mini-batch dropping (input dithering draws
    from :func:`dither_rng`, one generator per step)."""
    return {
        "dev": np.random.default_rng([seed, 101]),
        "shuffle": np.random.default_rng([seed, 102]),
        "smd": np.random.default_rng([seed, 103]),
    }


def dither_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of training step ``step``'s input thresholds (``data.dither``): a function of the seed and
    the step alone, so a resumed or rolled-back step, and every target, binarise a batch the same way."""
    return np.random.default_rng([seed, 104, step])


def load_training_data(cfg: Config, data=None):
    """The :class:`sim.datasets.Dataset` of ``cfg.data`` with the train/test limits applied and shapes checked."""
    from .datasets import load_dataset

    if data is None:
        data = load_dataset(cfg.data.dataset, cfg.data.path or None)
    tl, sl = cfg.data.train_limit, cfg.data.test_limit
    if (tl and tl < len(data.x_train)) or (sl and sl < len(data.x_test)):
        data = data.take(tl if tl < len(data.x_train) else 0, sl if sl < len(data.x_test) else 0)
    want = tuple(cfg.model.input_shape)
    if tuple(data.input_shape) != want:
        raise ConfigError(
            f"model.input_shape = {list(want)} does not match the {data.name} images {list(data.input_shape)}"
        )
    if data.num_classes != cfg.model.num_classes:
        raise ConfigError(f"model.num_classes = {cfg.model.num_classes} but {data.name} has {data.num_classes}")
    return data


def evaluate_dataset(engine: TrainEngine, x_uint8: np.ndarray, y: np.ndarray, batch_size: int) -> tuple[float, float]:
    """(mean loss, accuracy) of the engine in inference mode over a whole split."""
    n = len(x_uint8)
    if n == 0:
        return float("nan"), float("nan")
    total_loss = 0.0
    correct = 0
    for start in range(0, n, batch_size):
        xb = engine.prepare_inputs(x_uint8[start : start + batch_size])
        yb = y[start : start + batch_size]
        loss, c = engine.evaluate(xb, yb)
        total_loss += float(loss) * len(yb)
        correct += int(c)
    return total_loss / n, correct / n


# ---------------------------------------------------------------------------
# Checkpoints: the whole training state in one file


CHECKPOINT_FORMAT = "xnortrain-training-state"
CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that belongs to another run (the message is one line)."""


def atomic_write(path: str | os.PathLike, write: Callable[[object], None]) -> Path:
    """Write ``path`` through ``write(binary file)``: into a temporary file of its own in the same folder
    (a unique name, so two writers never share one), flushed to disk, then renamed over ``path`` and the folder
    synced. A crash, a signal or an error leaves the old file (or none) and no temporary file behind."""
    import tempfile

    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (not every file system can sync a folder)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@dataclass
class Checkpoint:
    """A training state as :func:`save_checkpoint` writes it.

    The file is an ``.npz`` (no pickles): ``meta`` is one strict JSON text (non-finite floats as
    ``{"__float__": "nan"}``; format name and version, the
    engine's name, the configuration, a fingerprint of the data, the loop's position and
    accumulators, its three generators' states, the learning-rate schedule's state and the history
    so far); ``engine/<key>`` are the arrays of the engine's ``state_dict()`` (for the hardware
    model keyed as :meth:`sim.hw.model.HwModel.state_dict`, the keys the host driver reads back);
    ``loop/order`` and ``loop/drops`` are the running epoch's data order and SMD draws.
    """

    meta: dict
    engine_state: dict[str, np.ndarray]
    arrays: dict[str, np.ndarray]
    path: Path | None = None

    @property
    def engine(self) -> str:
        return str(self.meta["engine"])

    @property
    def step(self) -> int:
        return int(self.meta["loop"]["step"])

    @property
    def epoch(self) -> int:
        """0-based epoch the run was in (or is about to start)."""
        return int(self.meta["loop"]["epoch"])

    @property
    def stopped(self) -> str:
        return str(self.meta["history"]["meta"].get("stopped", ""))

    @property
    def config(self) -> Config:
        """The configuration the run was started with."""
        from .config import config_from_dict

        d = dict(self.meta["config"])
        preset = d.pop("preset", "")
        if not isinstance(preset, str):
            raise ConfigError(f"preset = {preset!r}: expected a string")
        cfg = config_from_dict(d)
        cfg.preset = preset
        return cfg


def _strict_json(o):
    """``o`` with every non-finite float replaced by ``{"__float__": "nan" | "inf" | "-inf"}`` (strict JSON)."""
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else {"__float__": repr(float(o))}
    if isinstance(o, dict):
        return {k: _strict_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_strict_json(v) for v in o]
    return o


def _from_strict_json(o):
    if isinstance(o, dict):
        if set(o) == {"__float__"}:
            return float(o["__float__"])
        return {k: _from_strict_json(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_from_strict_json(v) for v in o]
    return o


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically (see :class:`Checkpoint` for the layout)."""
    text = json.dumps(_strict_json(ckpt.meta), default=_json_default, allow_nan=False)
    payload = {"meta": np.array(text)}
    payload.update({f"engine/{k}": np.asarray(v) for k, v in ckpt.engine_state.items()})
    payload.update({f"loop/{k}": np.asarray(v) for k, v in ckpt.arrays.items()})
    return atomic_write(Path(path), lambda fh: np.savez(fh, **payload))


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; :class:`CheckpointError` when it is not one."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a training checkpoint")
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{path}: not a training checkpoint (cannot read it as .npz: {e})") from None
    try:
        meta = _from_strict_json(json.loads(str(data.pop("meta"))))
    except (KeyError, ValueError):
        raise CheckpointError(f"{path}: not a training checkpoint (no readable 'meta' entry)") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an xnortrain training checkpoint (format {meta.get('format')!r})"
                              if isinstance(meta, dict) else f"{path}: not an xnortrain training checkpoint")
    version = meta.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version!r}; this xnortrain reads "
                              f"version {CHECKPOINT_VERSION}")
    missing = [k for k in ("engine", "config", "data", "loop", "rngs", "schedule", "history") if k not in meta]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks the {missing[0]!r} section")
    engine = {k[len("engine/"):]: v for k, v in data.items() if k.startswith("engine/")}
    arrays = {k[len("loop/"):]: v for k, v in data.items() if k.startswith("loop/")}
    try:
        _validate_meta(meta, arrays)
    except _Bad as e:
        raise CheckpointError(f"{path}: damaged checkpoint: {e}") from None
    ckpt = Checkpoint(meta, engine, arrays, path)
    try:
        ckpt.config  # noqa: B018 - the configuration must load as it did when the run started
    except (ConfigError, ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint: its configuration: {str(e).splitlines()[0]}") from None
    return ckpt


class _Bad(Exception):
    """A field of a checkpoint that is missing or of the wrong kind (the message names it)."""


_EPOCH_INTS = ("index", "position", "correct", "seen", "n_steps", "dropped")
_EPOCH_FLOATS = ("loss_sum", "flip_sum", "seconds")
_HISTORY_LISTS = ("epoch", "lr", "loss", "train_acc", "test_loss", "test_acc", "best_test_acc", "dev_metric",
                  "flip_ratio", "steps", "dropped", "seconds")


def _field(d: dict, key: str, kind, where: str, *, minimum=None):
    if not isinstance(d, dict) or key not in d:
        raise _Bad(f"{where}{key} is missing")
    v = d[key]
    ok = (isinstance(v, int) and not isinstance(v, bool)) if kind is int else (
        isinstance(v, (int, float)) and not isinstance(v, bool)) if kind is float else isinstance(v, kind)
    if not ok:
        raise _Bad(f"{where}{key} = {v!r} is not {getattr(kind, '__name__', kind)}")
    if minimum is not None and v < minimum:
        raise _Bad(f"{where}{key} = {v!r} is below {minimum}")
    return v


def _validate_meta(meta: dict, arrays: dict) -> None:
    """Every field of a checkpoint's ``meta`` (and the loop's arrays) present and of its kind; the facts that
    need the data (the epoch's length) are checked by the run that resumes (:func:`_check_resume`)."""
    for key in ("engine",):
        _field(meta, key, str, "")
    for key in ("config", "data", "loop", "rngs", "schedule", "history"):
        _field(meta, key, dict, "")
    data = meta["data"]
    _field(data, "fingerprint", str, "data.")
    n = _field(data, "n", list, "data.")
    if len(n) != 2 or not all(isinstance(v, int) and v >= 0 for v in n):
        raise _Bad(f"data.n = {n!r} is not two image counts")
    loop = meta["loop"]
    epoch = _field(loop, "epoch", int, "loop.", minimum=0)
    step = _field(loop, "step", int, "loop.", minimum=0)
    _field(loop, "max_steps", int, "loop.", minimum=0)
    reason = _field(loop, "stop_reason", str, "loop.")
    if reason not in ("running", "max_steps", "finished"):
        raise _Bad(f"loop.stop_reason = {reason!r} is not running, max_steps or finished")
    if "running_epoch" not in loop:
        raise _Bad("loop.running_epoch is missing")
    run = loop["running_epoch"]
    if run is not None:
        if not isinstance(run, dict):
            raise _Bad(f"loop.running_epoch = {run!r} is not a table")
        for key in _EPOCH_INTS:
            _field(run, key, int, "loop.running_epoch.", minimum=0)
        for key in _EPOCH_FLOATS:
            v = _field(run, key, float, "loop.running_epoch.")
            if key != "seconds" and not math.isfinite(v) and run["seen"]:
                raise _Bad(f"loop.running_epoch.{key} = {v!r} is not finite")
        lrs = _field(run, "lr_used", list, "loop.running_epoch.")
        extra = set(run) - set(_EPOCH_INTS) - set(_EPOCH_FLOATS) - {"lr_used"}
        if extra:
            raise _Bad(f"loop.running_epoch has an unknown field {sorted(extra)[0]!r}")
        if run["index"] != epoch:
            raise _Bad(f"loop.running_epoch.index = {run['index']} but loop.epoch = {epoch}")
        if run["n_steps"] + run["dropped"] != run["position"] or len(lrs) != run["n_steps"]:
            raise _Bad(f"loop.running_epoch: position {run['position']} is not its {run['n_steps']} steps and "
                       f"{run['dropped']} dropped batches ({len(lrs)} learning rates)")
        if run["correct"] > run["seen"] or run["n_steps"] > step:
            raise _Bad("loop.running_epoch: more correct images than seen, or more steps than the run's")
        for key in ("order", "drops"):
            if key not in arrays:
                raise _Bad(f"loop/{key} is missing")
        order, drops = arrays["order"], arrays["drops"]
        if order.ndim != 1 or order.dtype.kind not in "iu" or drops.ndim != 1 or drops.dtype.kind != "b":
            raise _Bad(f"loop/order ({order.dtype}, {order.ndim}-d) or loop/drops ({drops.dtype}) of the wrong kind")
        if len(order) and (np.sort(order) != np.arange(len(order))).any():
            raise _Bad("loop/order is not a permutation of the training images")
    rngs = meta["rngs"]
    for key in ("dev", "shuffle", "smd"):
        st = _field(rngs, key, dict, "rngs.")
        try:
            np.random.Generator(np.random.PCG64()).bit_generator.state = st
        except (TypeError, ValueError, KeyError, OverflowError) as e:
            raise _Bad(f"rngs.{key} is not a PCG64 generator state ({e})") from None
    sched = meta["schedule"]
    for key in ("value", "best"):
        _field(sched, key, float, "schedule.")
    for key in ("bad_epochs", "decays"):
        _field(sched, key, int, "schedule.", minimum=0)
    hist = meta["history"]
    lens = {key: len(_field(hist, key, list, "history.")) for key in _HISTORY_LISTS}
    if len(set(lens.values())) != 1:
        raise _Bad(f"history lists of different lengths ({lens})")
    hmeta = _field(hist, "meta", dict, "history.")
    for key, kind in (("resumed", list), ("target", str), ("stopped", str), ("outputs", dict)):
        if key in hmeta and not isinstance(hmeta[key], kind):
            raise _Bad(f"history.meta.{key} = {hmeta[key]!r} is not {kind.__name__}")
    if not all(isinstance(v, int) and v >= 0 for v in hist["steps"]) or sum(hist["steps"]) > step:
        raise _Bad(f"history.steps = {hist['steps']!r}: more steps than loop.step = {step}")


def _check_resume(ckpt: Checkpoint, *, per_epoch: int, n_train: int, epochs: int, limit: int) -> None:
    """What :func:`_validate_meta` cannot know: the resumed run's epoch length and its limits."""
    where = ckpt.path or "checkpoint"
    loop = ckpt.meta["loop"]
    run = loop["running_epoch"]
    if run is not None:
        if run["position"] > per_epoch:
            raise CheckpointError(f"{where}: damaged checkpoint: loop.running_epoch.position = {run['position']} "
                                  f"is past the epoch's {per_epoch} mini-batches")
        if len(ckpt.arrays["order"]) != n_train or len(ckpt.arrays["drops"]) != per_epoch:
            raise CheckpointError(f"{where}: damaged checkpoint: loop/order has {len(ckpt.arrays['order'])} images "
                                  f"and loop/drops {len(ckpt.arrays['drops'])} batches; the epoch has {n_train} "
                                  f"images in {per_epoch} batches")
    finished = len(ckpt.meta["history"]["epoch"])
    if epochs < max(finished, loop["epoch"]):
        raise CheckpointError(f"{where}: train.epochs = {epochs}, but the run already finished "
                              f"{max(finished, loop['epoch'])} epochs")
    if limit and limit < loop["step"]:
        raise CheckpointError(f"{where}: max_steps = {limit}, but the run already took {loop['step']} steps")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_difference(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> tuple[str, object, object] | None:
    """The first field (dotted path) whose value differs between two ``Config.to_dict()`` trees, with both
    values; ``None`` when they agree (the ``preset`` label and the ``ignore`` fields are not compared)."""
    fa, fb = _flatten(a), _flatten(b)
    for key in list(fa) + [k for k in fb if k not in fa]:
        if key == "preset" or key in ignore:
            continue
        if key not in fa or key not in fb or fa[key] != fb[key]:
            return key, fa.get(key, "(absent)"), fb.get(key, "(absent)")
    return None


def data_fingerprint(data) -> str:
    """SHA-256 of a dataset's arrays (after the train/test limits): a resume must see the same images."""
    h = hashlib.sha256()
    for a in (data.x_train, data.y_train, data.x_test, data.y_test):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Signals


class _Control:
    """SIGINT / SIGTERM during :func:`run_training` (installed in the main thread only).

    The first signal asks the loop to stop at the next boundary between whole steps; a second one
    during a step or an evaluation raises ``KeyboardInterrupt`` at once (the step is then rolled back
    to its snapshot). ``phase`` is what the loop is doing: ``idle``, ``step``, ``eval``, ``book``
    (bookkeeping between steps) or ``save``; only ``step`` and ``eval`` may be cut short.
    """

    def __init__(self):
        self.phase = "idle"
        self.signal: str | None = None  # name of the first signal received
        self.count = 0
        self._old: dict = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old.clear()

    def _handle(self, signum, _frame) -> None:
        self.count += 1
        if self.signal is None:
            self.signal = signal.Signals(signum).name
        if self.count > 1 and self.phase in ("step", "eval"):
            raise KeyboardInterrupt(self.signal)
        if self.count == 1:
            msg = f"\nxnortrain: {self.signal}: stopping after the current step (send it again to stop at once)\n"
            os.write(2, msg.encode())


class _Stop(Exception):
    """Raised by the loop itself at a step boundary after a signal."""


# ---------------------------------------------------------------------------
# The loop


def _use_bar(progress: bool) -> bool:
    if not progress:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class _Epoch:
    """The running epoch: its data order, SMD draws, position and accumulators (all a resume needs)."""

    index: int
    order: np.ndarray
    drops: np.ndarray
    position: int = 0  # next mini-batch
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0
    flip_sum: float = 0.0
    n_steps: int = 0
    dropped: int = 0
    lr_used: list = field(default_factory=list)
    seconds: float = 0.0  # wall time of earlier sessions of this epoch

    def to_meta(self) -> dict:
        d = asdict(self)
        del d["order"], d["drops"]
        return d


def _rng_states(rngs: dict) -> dict:
    return {k: g.bit_generator.state for k, g in rngs.items()}


def run_training(
    cfg: Config,
    engine: TrainEngine,
    data=None,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    max_steps: int | None = None,
    history_json: str | os.PathLike | None = None,
    state_file: str | os.PathLike | None = None,
    resume: Checkpoint | str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None,
    handle_signals: bool = True,
    eval_every: int = 0,
    meta: dict | None = None,
) -> History:
    """Train ``engine`` for ``cfg.train.epochs`` epochs and return the :class:`History`.

    ``data``: a :class:`sim.datasets.Dataset` (default: loaded from ``cfg.data``).
    ``max_steps``: stop after this many training steps (default ``cfg.train.max_steps``; 0 = no limit).
    ``history_json``: the history is written there as JSON after every epoch and when the run stops.
    ``state_file``: the whole training state (:class:`Checkpoint`) is written there after every epoch
    and when the run stops for any reason (finished, step limit, Ctrl-C / SIGTERM, an error), always
    as it was between two whole steps. ``checkpoint`` (the older name of ``history_json``) also
    writes the state next to the JSON as ``<stem>.ckpt.npz`` unless ``state_file`` is given.
    ``resume``: a checkpoint (or its path) of this configuration, data and engine kind: the run
    continues from it and ends bit-identical to an uninterrupted one (``seconds`` aside).
    ``handle_signals``: in the main thread, SIGINT/SIGTERM stop the run at the next step boundary
    (a second signal at once, rolling the running step back); the history is returned with
    ``meta["stopped"] = "interrupted"`` and ``meta["signal"]``.
    ``log``: called with one line per epoch (``None`` for silence).
    ``eval_every``: N > 0 also evaluates the test set after every N-th training step (``History.evals``, one
    log line each); evaluation leaves the training state untouched, so it does not change the run.
    ``meta``: entries added to the history's ``meta`` (the command line records the run's output files).
    A resumed run may be given more epochs or a larger ``max_steps`` than it was started with: it goes on to them.
    The history's ``meta["checkpoint"]`` names the state on disk when the run stops ({"path", "step"}), or is
    None when nothing was saved.
    """
    if int(eval_every) < 0:
        raise ConfigError(f"eval_every = {eval_every}: must be >= 0 (0 = evaluate after every epoch only)")
    if checkpoint is not None:
        history_json = checkpoint if history_json is None else history_json
        if state_file is None:
            state_file = Path(checkpoint).with_suffix(".ckpt.npz")
    log = log or (lambda _s: None)
    ctl = _Control()
    if handle_signals:
        ctl.install()
    try:
        return _train(cfg, engine, data, ctl, progress=progress, log=log, max_steps=max_steps,
                      history_json=history_json, state_file=state_file, resume=resume, eval_every=int(eval_every),
                      meta=meta)
    finally:
        ctl.restore()


def _train(cfg, engine, data, ctl: _Control, *, progress, log, max_steps, history_json, state_file, resume,
           eval_every=0, meta=None):
    data = load_training_data(cfg, data)
    rngs = seed_rngs(cfg.train.seed)
    x_train, y_train = data.x_train, data.y_train
    x_dev = y_dev = None
    if cfg.data.dev_size:
        if cfg.data.dev_size >= len(x_train):
            raise ConfigError(
                f"data.dev_size = {cfg.data.dev_size} leaves no training images (only {len(x_train)} available)"
            )
        from .datasets import split_dev

        x_train, y_train, x_dev, y_dev = split_dev(x_train, y_train, cfg.data.dev_size, rngs["dev"])
    bs = cfg.train.batch_size
    if bs > len(x_train):
        raise ConfigError(f"train.batch_size = {bs} is larger than the {len(x_train)} training images")
    per_epoch = len(x_train) // bs
    epochs = cfg.train.epochs
    limit = cfg.train.max_steps if max_steps is None else int(max_steps)
    smd = float(cfg.e2train.smd_prob)
    schedule = LRSchedule(cfg)
    engine_name = getattr(engine, "name", type(engine).__name__)
    fingerprint = data_fingerprint(data)

    hist = History()
    hist.meta = {
        "engine": engine_name,
        "config_name": cfg.name,
        "data_source": getattr(data, "source", ""),
        "n_train": int(len(x_train)),
        "n_dev": 0 if x_dev is None else int(len(x_dev)),
        "n_test": int(len(data.x_test)),
        "steps_per_epoch": per_epoch,
        "dev_signal": "dev error" if x_dev is not None else "training loss",
        "config": cfg.to_dict(),
        "stopped": "running",
        **(meta or {}),
    }
    saved = None  # the checkpoint of this run on disk: {"path", "step"}
    # where the engine runs (float, model, sim, board); engines of one kind share checkpoints across targets
    target = getattr(engine, "target", engine_name)
    epoch, step, ep = 0, 0, None
    stop_reason = "running"  # of the loop: running, max_steps or finished (an interrupt is not one)
    if resume is not None:
        ckpt = resume if isinstance(resume, Checkpoint) else load_checkpoint(resume)
        where = ckpt.path or "checkpoint"
        if ckpt.engine != engine_name:
            raise CheckpointError(f"{where}: written by the {ckpt.engine!r} engine; this run uses {engine_name!r}")
        # the length of the run may change (--epochs N / --max-steps N continue the same run to N)
        diff = config_difference(ckpt.meta["config"], cfg.to_dict(), ignore=("train.epochs", "train.max_steps"))
        if diff is not None:
            key, was, now = diff
            raise CheckpointError(f"{where}: {key} = {now!r} differs from the checkpoint's {was!r}; "
                                  "resume with the configuration the run was started with")
        loop = ckpt.meta["loop"]
        _check_resume(ckpt, per_epoch=per_epoch, n_train=len(x_train), epochs=epochs, limit=int(limit))
        if ckpt.meta["data"]["fingerprint"] != fingerprint:
            raise CheckpointError(f"{where}: the training data differ from the checkpoint's "
                                  f"({ckpt.meta['data'].get('source', '')!r}, train/test {ckpt.meta['data']['n']})")
        try:
            engine.load_state_dict(ckpt.engine_state)
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{where}: engine state: {e}") from None
        for k, st in ckpt.meta["rngs"].items():
            rngs[k].bit_generator.state = st
        for k, v in ckpt.meta["schedule"].items():
            setattr(schedule, k, v)
        hist = History(**{k: v for k, v in ckpt.meta["history"].items() if k in History.__dataclass_fields__})
        hist.meta.pop("signal", None)
        hist.meta["stopped"] = "running"
        hist.meta["config"] = cfg.to_dict()
        hist.meta.update(meta or {})
        hist.meta.setdefault("resumed", []).append({"step": int(loop["step"]), "from": str(where),
                                                    "target": getattr(engine, "target", engine_name)})
        epoch, step, stop_reason = int(loop["epoch"]), int(loop["step"]), str(loop["stop_reason"])
        if stop_reason != "running" and epoch < epochs and (not limit or step < limit):
            stop_reason = "running"  # a longer run than the one that stopped: go on
        if state_file is not None and Path(state_file).resolve() == Path(where).resolve():
            saved = {"path": str(state_file), "step": step}
        if loop["running_epoch"] is not None:
            ep = _Epoch(order=np.asarray(ckpt.arrays["order"]), drops=np.asarray(ckpt.arrays["drops"]),
                        **loop["running_epoch"])
        log(f"resuming from {where}: epoch {epoch + 1}, {step} steps done")
    hist.meta["target"] = target

    def snapshot(engine_state) -> Checkpoint:
        """The state between whole steps: the engine's ``engine_state`` and the loop as it stands."""
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "engine": engine_name,
            "config": cfg.to_dict(),
            "data": {"fingerprint": fingerprint, "source": getattr(data, "source", ""),
                     "n": [int(len(data.x_train)), int(len(data.x_test))]},
            "loop": {"epoch": epoch, "step": step, "max_steps": int(limit), "stop_reason": stop_reason,
                     "running_epoch": None if ep is None else ep.to_meta()},
            "rngs": _rng_states(rngs),
            "schedule": {k: getattr(schedule, k) for k in ("value", "best", "bad_epochs", "decays")},
            "history": hist.to_dict(),
        }
        arrays = {} if ep is None else {"order": ep.order, "drops": ep.drops}
        return Checkpoint(meta, engine_state, arrays)

    def save(engine_state) -> None:
        """Write the checkpoint, then the history JSON (signals wait until both are on disk); the history's
        ``meta["checkpoint"]`` says which state is on disk ({"path", "step"}, or None: nothing saved).
        ``engine_state`` None: a step was cut and cannot be rolled back (an engine without per-step snapshots);
        the checkpoint already on disk, written between whole steps, is kept, if there is one."""
        nonlocal saved
        phase, ctl.phase = ctl.phase, "save"
        try:
            if state_file is not None and engine_state is not None:
                hist.meta["checkpoint"] = {"path": str(state_file), "step": step}
                try:
                    save_checkpoint(state_file, snapshot(engine_state))
                except BaseException:
                    hist.meta["checkpoint"] = saved
                    raise
                saved = hist.meta["checkpoint"]
            else:
                hist.meta["checkpoint"] = saved
                if state_file is not None and saved is not None:
                    log(f"the running step was cut and cannot be rolled back; the last checkpoint in {state_file} "
                        f"(step {saved['step']}, between whole steps) is kept")
                elif state_file is not None:
                    log("the running step was cut and cannot be rolled back, and no checkpoint of this run was "
                        f"written yet: nothing was saved to {state_file}")
            if history_json is not None:
                hist.to_json(history_json)
        finally:
            ctl.phase = phase

    bar = None
    if _use_bar(progress):
        from tqdm import tqdm

        done = epoch * per_epoch + (ep.position if ep is not None else 0)
        bar = tqdm(total=epochs * per_epoch, initial=min(done, epochs * per_epoch), unit="batch",
                   dynamic_ncols=True, leave=False)

    pre_step = None  # the engine's state before the running step
    t0 = time.perf_counter()
    try:
        while epoch < epochs and (stop_reason == "running" or ep is not None):
            t0 = time.perf_counter()
            if ep is None:
                drops = rngs["smd"].random(per_epoch) < smd if smd > 0 else np.zeros(per_epoch, dtype=bool)
                ep = _Epoch(epoch, rngs["shuffle"].permutation(len(x_train)), drops)
            for i in range(ep.position, per_epoch if stop_reason == "running" else ep.position):
                if ctl.signal:
                    raise _Stop
                if bar is not None:
                    bar.update(1)
                if ep.drops[i]:
                    ep.dropped += 1
                    ep.position = i + 1
                    continue
                idx = ep.order[i * bs : (i + 1) * bs]
                xb, yb = x_train[idx], y_train[idx]
                frac = (epoch + i / per_epoch) / epochs
                if limit:
                    frac = max(frac, step / limit)
                frac = min(frac, 1.0)
                lr = schedule.lr(epoch, frac)
                if cfg.data.dither:
                    xp = engine.prepare_inputs(xb, dither=dither_rng(cfg.train.seed, step))
                else:
                    xp = engine.prepare_inputs(xb)
                # the state before the step, to roll a cut step back; an engine whose state is expensive to
                # read (the accelerator) says so and keeps the last checkpoint on disk instead
                pre_step = engine.state_dict() if getattr(engine, "step_snapshot", True) else None
                ctl.phase = "step"
                res = engine.train_step(xp, yb, lr=lr, progress=frac)
                ctl.phase = "book"
                step += 1
                ep.position = i + 1
                ep.n_steps += 1
                ep.lr_used.append(lr)
                ep.loss_sum += float(res.loss) * len(yb)
                ep.correct += int(res.correct)
                ep.seen += len(yb)
                ep.flip_sum += res.flips / max(res.n_weights, 1)
                if limit and step >= limit:
                    stop_reason = "max_steps"
                ctl.phase = "idle"
                if eval_every and step % eval_every == 0 and ep.position < per_epoch:  # the epoch's end evaluates
                    ctl.phase = "eval"
                    tl, ta = evaluate_dataset(engine, data.x_test, data.y_test, cfg.train.eval_batch_size)
                    ctl.phase = "book"
                    hist.evals.append({"step": step, "epoch": epoch + ep.position / per_epoch,
                                       "test_loss": tl, "test_acc": ta})
                    ctl.phase = "idle"
                    log(f"step {step:6d} (epoch {epoch + ep.position / per_epoch:.2f})  test {100 * ta:6.2f}%  "
                        f"test loss {tl:.4f}")
                if bar is not None and ep.n_steps % 20 == 0:
                    bar.set_postfix(loss=f"{ep.loss_sum / ep.seen:.3f}", acc=f"{ep.correct / ep.seen:.3f}",
                                    lr=f"{lr:.2g}")
                if stop_reason != "running":
                    break
            if ctl.signal:
                raise _Stop
            ctl.phase = "eval"
            test_loss, test_acc = evaluate_dataset(engine, data.x_test, data.y_test, cfg.train.eval_batch_size)
            seen = ep.seen
            train_loss = ep.loss_sum / seen if seen else float("nan")
            if x_dev is not None:
                _, dev_acc = evaluate_dataset(engine, x_dev, y_dev, cfg.train.eval_batch_size)
                signal_value = 1.0 - dev_acc
            else:
                signal_value = train_loss
            ctl.phase = "book"
            lr_epoch = (float(np.mean(ep.lr_used)) if ep.lr_used
                        else schedule.lr(epoch, min((epoch + 1) / epochs, 1.0)))
            decayed = schedule.end_epoch(signal_value)
            secs = ep.seconds + time.perf_counter() - t0
            hist.epoch.append(epoch + 1)
            hist.lr.append(lr_epoch)
            hist.loss.append(train_loss)
            hist.train_acc.append(ep.correct / seen if seen else float("nan"))
            hist.test_loss.append(test_loss)
            hist.test_acc.append(test_acc)
            hist.best_test_acc.append(max(test_acc, hist.best_test_acc[-1] if hist.best_test_acc else 0.0))
            hist.dev_metric.append(signal_value)
            hist.flip_ratio.append(ep.flip_sum / ep.n_steps if ep.n_steps else 0.0)
            hist.steps.append(ep.n_steps)
            hist.dropped.append(ep.dropped)
            hist.seconds.append(secs)
            hist.meta["total_steps"] = step
            epoch, ep = epoch + 1, None
            ctl.phase = "idle"
            log(
                f"epoch {epoch:3d}/{epochs}  lr {lr_epoch:.3g}{'*' if decayed else ' '} "
                f"loss {train_loss:.4f}  train {100 * hist.train_acc[-1]:6.2f}%  "
                f"test {100 * test_acc:6.2f}% (best {100 * hist.best:6.2f}%)  "
                f"flips {hist.flip_ratio[-1]:.2e}  {secs:6.1f}s"
            )
            if stop_reason == "running" and epoch < epochs:
                save(engine.state_dict())
        if stop_reason == "running":
            stop_reason = "finished"
        stopped = stop_reason
        engine_state = engine.state_dict()
    except (KeyboardInterrupt, _Stop):
        if ctl.phase == "book":  # only without handle_signals: a step half booked; keep the last checkpoint
            _finish(hist, "interrupted", step, schedule)
            hist.meta["signal"] = "KeyboardInterrupt"
            hist.meta["checkpoint"] = saved
            log(f"interrupted between a step and its bookkeeping at step {step}; the state is not saved")
            return hist
        engine_state = _settle(engine, ctl, pre_step, ep, t0)
        stopped = "interrupted"
        hist.meta["signal"] = ctl.signal or "KeyboardInterrupt"
        where = (f"epoch {epoch + 1}, batch {ep.position} of {per_epoch}" if ep is not None
                 else f"after epoch {epoch}")
        log(f"interrupted ({hist.meta['signal']}) at step {step} ({where}); "
            f"{len(hist.epoch)} finished epochs in the history")
    except BaseException as e:
        if ctl.phase in ("step", "eval", "idle"):
            engine_state = _settle(engine, ctl, pre_step, ep, t0)
            _finish(hist, f"error: {type(e).__name__}: {e}", step, schedule)
            with contextlib.suppress(Exception):
                save(engine_state)
        raise
    finally:
        if bar is not None:
            bar.close()
    _finish(hist, stopped, step, schedule)
    save(engine_state)
    return hist


def _settle(engine, ctl: _Control, pre_step, ep: _Epoch | None, t0: float | None) -> dict | None:
    """After an exception: the engine state between whole steps (a cut step is rolled back); None when the
    step was cut and the engine keeps no snapshot to roll back to (``step_snapshot = False``)."""
    if ctl.phase == "step" and pre_step is not None:
        with contextlib.suppress(Exception):
            engine.load_state_dict(pre_step)
        state = pre_step
    elif ctl.phase == "step":
        state = None
    else:
        state = engine.state_dict()
    if ep is not None and t0 is not None:
        ep.seconds += time.perf_counter() - t0
    ctl.phase = "idle"
    return state


def _finish(hist: History, stop_reason: str, step: int, schedule: LRSchedule) -> None:
    hist.meta["stopped"] = stop_reason
    hist.meta["total_steps"] = step
    hist.meta["lr_decays"] = schedule.decays
