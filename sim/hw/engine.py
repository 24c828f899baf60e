"""The bit-exact hardware model as a :class:`sim.train_loop.TrainEngine` (``xnortrain train --arith hw``)."""

from __future__ import annotations

import numpy as np

from ..datasets import binarize_dithered, preprocess
from ..train_loop import StepResult
from .model import HwModel

__all__ = ["HwEngine", "prepare_inputs"]


def prepare_inputs(cfg, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
    """``uint8 [N, C, H, W]`` -> the first-layer input of the hardware, flattened ``[N, features]``.

    ``hw.input`` int8: the pixel re-centred, ``x - 128`` (int16 holding int8 values);
    binary: +-1 (int8) by ``data.binarize_threshold``, or with a random threshold per pixel drawn from
    ``dither`` (:func:`sim.datasets.binarize_dithered`; training batches when ``data.dither`` is set).
    """
    x = np.asarray(x_uint8)
    if cfg.hw.input_kind(cfg) == "binary":
        if dither is not None:
            return binarize_dithered(x, dither).astype(np.int8).reshape(len(x), -1)
        out = preprocess(x, "binarize", cfg.data.binarize_threshold).astype(np.int8)
    else:
        out = preprocess(x, "int8")
    return out.reshape(len(x), -1)


class HwEngine:
    """Trains with the integer datapath of :class:`sim.hw.model.HwModel`."""

    name = "hw"
    target = "model"  # the bit-exact model alone (host.train_target: "sim" and "board" share its checkpoints)

    def __init__(self, cfg):
        self.cfg = cfg
        self.model = HwModel(cfg)
        self.last_trace = None

    @property
    def n_weights(self) -> int:
        return self.model.n_weights

    def prepare_inputs(self, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
        return prepare_inputs(self.cfg, x_uint8, dither=dither)

    def train_step(self, x: np.ndarray, y: np.ndarray, *, lr: float, progress: float) -> StepResult:
        tr = self.model.train_step(x, y, lr=lr, progress=progress)
        self.last_trace = tr
        return StepResult(loss=tr.loss, correct=tr.correct, flips=tr.flips, n_weights=self.model.n_weights)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        return self.model.evaluate(x, y)

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore a :meth:`state_dict` (checked whole first by :func:`sim.hw.model.validate_state`)."""
        self.model.load_state_dict(state)
