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
  written to JSON after every epoch when a path is given, and a clean stop on
  Ctrl-C (the history so far is returned).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
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

    def prepare_inputs(self, x_uint8: np.ndarray) -> np.ndarray:
        """``uint8 [N, C, H, W]`` images -> this engine's first-layer input (per cfg.data / cfg.model.input_format)."""
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
        """Everything needed to resume or inspect the model, as named arrays."""
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
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=_json_default) + "\n")
        os.replace(tmp, path)
        return path

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
    """Independent generators of one run: dev split, shuffling, mini-batch dropping."""
    return {
        "dev": np.random.default_rng([seed, 101]),
        "shuffle": np.random.default_rng([seed, 102]),
        "smd": np.random.default_rng([seed, 103]),
    }


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
# The loop


def _use_bar(progress: bool) -> bool:
    if not progress:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def run_training(
    cfg: Config,
    engine: TrainEngine,
    data=None,
    *,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    max_steps: int | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> History:
    """Train ``engine`` for ``cfg.train.epochs`` epochs and return the :class:`History`.

    ``data``: a :class:`sim.datasets.Dataset` (default: loaded from ``cfg.data``).
    ``max_steps``: stop after this many training steps (default ``cfg.train.max_steps``; 0 = no limit).
    ``checkpoint``: a JSON path; the history is written there after every epoch (and when the run
    stops for any reason), and the engine's ``state_dict`` next to it as ``<name>.state.npz``.
    ``log``: called with one line per epoch (``None`` for silence).
    """
    from .datasets import batches, split_dev

    log = log or (lambda _s: None)
    data = load_training_data(cfg, data)
    rngs = seed_rngs(cfg.train.seed)
    x_train, y_train = data.x_train, data.y_train
    x_dev = y_dev = None
    if cfg.data.dev_size:
        if cfg.data.dev_size >= len(x_train):
            raise ConfigError(
                f"data.dev_size = {cfg.data.dev_size} leaves no training images (only {len(x_train)} available)"
            )
        x_train, y_train, x_dev, y_dev = split_dev(x_train, y_train, cfg.data.dev_size, rngs["dev"])
    bs = cfg.train.batch_size
    if bs > len(x_train):
        raise ConfigError(f"train.batch_size = {bs} is larger than the {len(x_train)} training images")
    per_epoch = len(x_train) // bs
    epochs = cfg.train.epochs
    limit = cfg.train.max_steps if max_steps is None else int(max_steps)
    smd = float(cfg.e2train.smd_prob)
    schedule = LRSchedule(cfg)

    hist = History()
    hist.meta = {
        "engine": getattr(engine, "name", type(engine).__name__),
        "config_name": cfg.name,
        "data_source": getattr(data, "source", ""),
        "n_train": int(len(x_train)),
        "n_dev": 0 if x_dev is None else int(len(x_dev)),
        "n_test": int(len(data.x_test)),
        "steps_per_epoch": per_epoch,
        "dev_signal": "dev error" if x_dev is not None else "training loss",
        "config": cfg.to_dict(),
        "stopped": "running",
    }
    ckpt = Path(checkpoint) if checkpoint is not None else None

    def save():
        if ckpt is not None:
            hist.to_json(ckpt)

    def save_state():
        if ckpt is not None:
            state = engine.state_dict()
            tmp = ckpt.with_name(ckpt.stem + ".state.tmp.npz")
            np.savez(tmp, **state)
            os.replace(tmp, ckpt.with_name(ckpt.stem + ".state.npz"))

    bar = None
    if _use_bar(progress):
        from tqdm import tqdm

        bar = tqdm(total=epochs * per_epoch, unit="batch", dynamic_ncols=True, leave=False)

    step = 0
    stop_reason = "finished"
    try:
        for epoch in range(epochs):
            t0 = time.perf_counter()
            loss_sum = 0.0
            correct = 0
            seen = 0
            flip_sum = 0.0
            n_steps = 0
            dropped = 0
            lr_used = []
            drops = rngs["smd"].random(per_epoch) < smd if smd > 0 else np.zeros(per_epoch, dtype=bool)
            for i, (xb, yb) in enumerate(batches(x_train, y_train, bs, rngs["shuffle"])):
                if bar is not None:
                    bar.update(1)
                if drops[i]:
                    dropped += 1
                    continue
                frac = (epoch + i / per_epoch) / epochs
                if limit:
                    frac = max(frac, step / limit)
                frac = min(frac, 1.0)
                lr = schedule.lr(epoch, frac)
                res = engine.train_step(engine.prepare_inputs(xb), yb, lr=lr, progress=frac)
                step += 1
                n_steps += 1
                lr_used.append(lr)
                loss_sum += float(res.loss) * len(yb)
                correct += int(res.correct)
                seen += len(yb)
                flip_sum += res.flips / max(res.n_weights, 1)
                if bar is not None and n_steps % 20 == 0:
                    bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}", lr=f"{lr:.2g}")
                if limit and step >= limit:
                    stop_reason = "max_steps"
                    break
            test_loss, test_acc = evaluate_dataset(engine, data.x_test, data.y_test, cfg.train.eval_batch_size)
            train_loss = loss_sum / seen if seen else float("nan")
            if x_dev is not None:
                _, dev_acc = evaluate_dataset(engine, x_dev, y_dev, cfg.train.eval_batch_size)
                signal = 1.0 - dev_acc
            else:
                signal = train_loss
            lr_epoch = float(np.mean(lr_used)) if lr_used else schedule.lr(epoch, min((epoch + 1) / epochs, 1.0))
            decayed = schedule.end_epoch(signal)
            secs = time.perf_counter() - t0
            hist.epoch.append(epoch + 1)
            hist.lr.append(lr_epoch)
            hist.loss.append(train_loss)
            hist.train_acc.append(correct / seen if seen else float("nan"))
            hist.test_loss.append(test_loss)
            hist.test_acc.append(test_acc)
            hist.best_test_acc.append(max(test_acc, hist.best_test_acc[-1] if hist.best_test_acc else 0.0))
            hist.dev_metric.append(signal)
            hist.flip_ratio.append(flip_sum / n_steps if n_steps else 0.0)
            hist.steps.append(n_steps)
            hist.dropped.append(dropped)
            hist.seconds.append(secs)
            log(
                f"epoch {epoch + 1:3d}/{epochs}  lr {lr_epoch:.3g}{'*' if decayed else ' '} "
                f"loss {train_loss:.4f}  train {100 * hist.train_acc[-1]:6.2f}%  "
                f"test {100 * test_acc:6.2f}% (best {100 * hist.best:6.2f}%)  "
                f"flips {hist.flip_ratio[-1]:.2e}  {secs:6.1f}s"
            )
            save()
            if stop_reason == "max_steps":
                break
    except KeyboardInterrupt:
        stop_reason = "interrupted"
        log(f"interrupted after {len(hist.epoch)} finished epochs ({step} steps); returning the history so far")
    except BaseException as e:
        hist.meta["stopped"] = f"error: {type(e).__name__}: {e}"
        hist.meta["total_steps"] = step
        save()
        raise
    finally:
        if bar is not None:
            bar.close()
    hist.meta["stopped"] = stop_reason
    hist.meta["total_steps"] = step
    hist.meta["lr_decays"] = schedule.decays
    save()
    try:
        save_state()
    except KeyboardInterrupt:
        pass
    return hist
