"""The float reference as a :class:`sim.train_loop.TrainEngine`."""

from __future__ import annotations

import numpy as np

from ..config import Config
from ..datasets import binarize_dithered, preprocess
from ..train_loop import StepResult
from .model import BNNModel

__all__ = ["ReferenceEngine", "prepare_inputs"]


def prepare_inputs(cfg: Config, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
    """``uint8`` images -> float32 first-layer input of the reference.

    ``model.input_format``: ``float`` -> ``data.preprocess`` (``pm1``: real values in [-1, 1];
    ``binarize``: +-1); ``binary`` -> +-1 by ``data.binarize_threshold`` whatever ``data.preprocess``
    says; ``int8`` -> the hardware's re-centred pixel ``x - 128`` as float32. Binarised input takes a
    random threshold per pixel from ``dither`` when it is given (training batches with ``data.dither``).
    """
    fmt = cfg.model.input_format
    thr = cfg.data.binarize_threshold
    binarised = fmt == "binary" or (fmt == "float" and cfg.data.preprocess == "binarize")
    if binarised and dither is not None:
        return binarize_dithered(x_uint8, dither)
    if fmt == "binary":
        return preprocess(x_uint8, "binarize", thr)
    if fmt == "int8":
        return preprocess(x_uint8, "int8", thr).astype(np.float32)
    return preprocess(x_uint8, cfg.data.preprocess, thr)


class ReferenceEngine:
    """NumPy float reference of Algorithms 1 / 2 (:class:`sim.reference.model.BNNModel`)."""

    name = "reference"
    target = "float"

    def __init__(self, cfg: Config, rng: np.random.Generator | None = None):
        self.cfg = cfg
        self.model = BNNModel(cfg, rng)

    def prepare_inputs(self, x_uint8: np.ndarray, *, dither: np.random.Generator | None = None) -> np.ndarray:
        return prepare_inputs(self.cfg, x_uint8, dither=dither)

    def train_step(self, x: np.ndarray, y: np.ndarray, *, lr: float, progress: float) -> StepResult:
        loss, correct, flips = self.model.train_step(x, y, lr=lr, progress=progress)
        return StepResult(loss=loss, correct=correct, flips=flips, n_weights=self.model.n_weights)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        return self.model.evaluate(x, y)

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore a :meth:`state_dict` (checked whole first, see :meth:`BNNModel.load_state_dict`)."""
        self.model.load_state_dict(state)
