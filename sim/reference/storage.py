"""Emulation of storage number formats (float32 / float16 / bfloat16).

The reference computes in float32 and rounds every stored variable to its
storage format with :func:`to_storage`, so a float16 or bfloat16 run sees the
same rounding a device with that storage would.
"""

from __future__ import annotations

import numpy as np

STORAGE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def round_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) & 0xFFFF0000).astype(np.uint32)
    # NaN must stay NaN (the carry could turn a NaN payload into infinity).
    out = rounded.view(np.float32)
    return np.where(np.isnan(x), x, out)


def to_storage(x: np.ndarray, kind: str) -> np.ndarray:
    """Round ``x`` to storage format ``kind``; the result is float32 for arithmetic."""
    if kind == "float32":
        return np.asarray(x, dtype=np.float32)
    if kind == "float16":
        with np.errstate(over="ignore"):
            return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    if kind == "bfloat16":
        return round_bfloat16(x)
    raise ValueError(f"unknown storage format {kind!r}; allowed: {', '.join(STORAGE_BYTES)}")
