"""Data for adapting a trained network on the board: a dataset file for ``train --data`` and the shifted
distributions the adaptation notebook uses (notebooks/adapt_on_board).

An ``.npz`` dataset holds ``x_train``, ``y_train``, ``x_test``, ``y_test``: ``uint8 [N, C, H, W]`` images (or
``[N, H, W]`` for one channel) and integer class indices."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from host.common import UserError

__all__ = ["SHIFTS", "shift_images", "shifted_dataset", "load_data_file", "save_data_file"]

#: the shifted distributions: what each does to a uint8 [N, C, H, W] image
SHIFTS = {
    "invert": "255 - pixel (light digits on a dark background become dark on light)",
    "mirror": "left-right mirror image",
    "rot90": "rotated by 90 degrees counter-clockwise",
}


def shift_images(x: np.ndarray, kind: str) -> np.ndarray:
    """``x`` (uint8 ``[N, C, H, W]``) under the shift ``kind`` (:data:`SHIFTS`)."""
    x = np.asarray(x)
    if kind == "invert":
        return (255 - x).astype(np.uint8)
    if kind == "mirror":
        return np.ascontiguousarray(x[..., ::-1])
    if kind == "rot90":
        return np.ascontiguousarray(np.rot90(x, 1, axes=(2, 3)))
    raise ValueError(f"shift {kind!r}: choose one of {', '.join(SHIFTS)}")


def shifted_dataset(data, kind: str):
    """A :class:`sim.datasets.Dataset` with both splits under the shift ``kind``."""
    import dataclasses

    return dataclasses.replace(data, x_train=shift_images(data.x_train, kind), x_test=shift_images(data.x_test, kind),
                               name=f"{data.name} ({kind})", source=f"{data.source}, {kind}")


def save_data_file(path, data) -> Path:
    """Write a dataset as the ``.npz`` :func:`load_data_file` reads (atomically)."""
    from sim.train_loop import atomic_write

    arrays = {k: getattr(data, k) for k in ("x_train", "y_train", "x_test", "y_test")}
    return atomic_write(Path(path), lambda fh: np.savez(fh, **arrays))


def load_data_file(path: str, cfg):
    """``train --data PATH``: an ``.npz`` (above) or a folder of the configured dataset's files, as a
    :class:`sim.datasets.Dataset` of ``cfg.model.num_classes`` classes; every problem is one line naming the file
    and the array."""
    import zipfile

    from sim.datasets import Dataset, load_dataset

    p = Path(path)
    if p.is_dir():
        return load_dataset(cfg.data.dataset, p)
    if not p.is_file():
        raise UserError(f"--data {path}: no such file or folder")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"--data {path}: not an .npz file ({e})") from None
    out = {}
    for split in ("train", "test"):
        x, y = arrays.get(f"x_{split}"), arrays.get(f"y_{split}")
        if x is None or y is None:
            raise UserError(f"--data {path}: lacks x_{split} or y_{split} (it holds {', '.join(sorted(arrays))})")
        if x.dtype != np.uint8:
            raise UserError(f"--data {path}: x_{split} has dtype {x.dtype}; expected uint8 pixels")
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim != 4:
            raise UserError(f"--data {path}: x_{split} has shape {x.shape}; expected [N, C, H, W] or [N, H, W]")
        if y.dtype.kind not in "iu" or y.shape != (len(x),):
            raise UserError(f"--data {path}: y_{split} must hold one integer class per image of x_{split} "
                            f"({len(x)}); it has shape {y.shape}, dtype {y.dtype}")
        if len(x) == 0:
            raise UserError(f"--data {path}: x_{split} is empty")
        if y.min() < 0 or y.max() >= cfg.model.num_classes:
            raise UserError(f"--data {path}: y_{split} holds class {int(y.min() if y.min() < 0 else y.max())}; "
                            f"model.num_classes = {cfg.model.num_classes} allows 0..{cfg.model.num_classes - 1}")
        out[f"x_{split}"], out[f"y_{split}"] = x, y.astype(np.int64)
    classes = tuple(str(c) for c in range(cfg.model.num_classes))
    return Dataset(**out, name=p.name, classes=classes, source=str(p))
