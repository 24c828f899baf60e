"""The on-chip random-number generators (docs/arithmetic.md, "Random numbers").

Algorithm: Marsaglia's xorshift32 with shifts (13, 17, 5)::

    x ^= x << 13;  x ^= x >> 17;  x ^= x << 5      (32-bit, logical shifts)

full period 2**32 - 1 over the non-zero states; the output is the new state.

Banks: weight layer ``l`` (shape ``(N, M)``, rows = inputs) is cut into column
blocks of ``rng_block`` consecutive rows; every block of every column has its
own generator. Generators are numbered layer by layer, block by block, column by
column: ``g = offset_l + block * M + column``. Generator ``g`` starts from
:func:`seed_state` ``(rng_seed, g)`` (computed by the host, which writes the
initial states) and advances exactly once per weight it serves, in increasing
row order, every time the weight memory is swept (once at reset for the
initial signs, then once per update step), whether the value is used or not.
"""

from __future__ import annotations

import numpy as np

__all__ = ["xorshift32", "xorshift32_next", "seed_state", "fmix32", "RngBank"]

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9
ZERO_SUBSTITUTE = 0x6D2B79F5


def xorshift32_next(x: int) -> int:
    """One step of xorshift32 on a Python int (the specification)."""
    x &= MASK32
    x ^= (x << 13) & MASK32
    x ^= x >> 17
    x ^= (x << 5) & MASK32
    return x


def xorshift32(x: np.ndarray) -> np.ndarray:
    """One step of xorshift32 on a uint32 array (vectorised; same as :func:`xorshift32_next`)."""
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x << np.uint32(13))
    x = x ^ (x >> np.uint32(17))
    return x ^ (x << np.uint32(5))


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser (host-side seeding only)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    h ^= h >> 16
    return h


def seed_state(seed: int, g: int) -> int:
    """Initial state of generator ``g``: ``fmix32(seed + 0x9E3779B9 * (g + 1))``; 0 is replaced by 0x6D2B79F5."""
    s = fmix32((int(seed) + GOLDEN32 * (int(g) + 1)) & MASK32)
    return s if s else ZERO_SUBSTITUTE


class RngBank:
    """All generators of a network's weight memory, advanced together one weight sweep at a time.

    ``shapes``: the weight matrices as ``(rows N, columns M)``. :meth:`sweep` returns, per layer,
    a uint32 ``(N, M)`` array: element ``[i, c]`` is the number generator ``(l, i // block, c)``
    produced for weight ``(i, c)`` in this sweep.
    """

    def __init__(self, shapes: list[tuple[int, int]], seed: int, block: int):
        self.shapes = [(int(n), int(m)) for n, m in shapes]
        self.block = int(block)
        self.seed = int(seed)
        rows, offsets = [], []
        g = 0
        for n, m in self.shapes:
            offsets.append(g)
            nb = -(-n // self.block)
            for b in range(nb):
                rows += [min(self.block, n - b * self.block)] * m
            g += nb * m
        self.n_generators = g
        self.offsets = offsets
        rows = np.asarray(rows, dtype=np.int64)
        # Process generators sorted by rows served (descending): the active ones at row r form a prefix.
        self._order = np.argsort(-rows, kind="stable")
        sorted_rows = rows[self._order]
        self._active = [int(np.count_nonzero(sorted_rows > r)) for r in range(int(rows.max()) if g else 0)]
        self.state = np.array([seed_state(seed, i) for i in range(g)], dtype=np.uint32)
        # Gather indices: out buffer is [row-in-block, sorted position]; map each weight to its slot.
        pos = np.empty(g, dtype=np.int64)
        pos[self._order] = np.arange(g)
        self._gather = []
        for (n, m), off in zip(self.shapes, offsets, strict=True):
            i = np.arange(n)[:, None]
            c = np.arange(m)[None, :]
            gen = off + (i // self.block) * m + c
            self._gather.append((i % self.block) * g + pos[gen])

    def sweep(self) -> list[np.ndarray]:
        """Advance every generator once per weight it serves; the numbers, per layer."""
        g = self.n_generators
        out = np.zeros((max(len(self._active), 1), g), dtype=np.uint32)
        x = self.state[self._order]
        for r, cnt in enumerate(self._active):
            v = x[:cnt]
            v ^= v << np.uint32(13)
            v ^= v >> np.uint32(17)
            v ^= v << np.uint32(5)
            out[r, :cnt] = v
        self.state[self._order] = x
        flat = out.reshape(-1)
        return [flat[idx] for idx in self._gather]

    def get_state(self) -> np.ndarray:
        return self.state.copy()

    def set_state(self, state: np.ndarray) -> None:
        state = np.asarray(state, dtype=np.uint32)
        if state.shape != self.state.shape:
            raise ValueError(f"RNG state has shape {state.shape}; expected {self.state.shape}")
        self.state = state.copy()
