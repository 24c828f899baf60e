"""Hardware weight optimisers and the beta update (docs/arithmetic.md, "Update").

Every weight optimiser sees the ternary gradient sign ``g = sign(dW)`` in {-1, 0, +1}
(Algorithm 2 line 16; the 1/sqrt(fan-in) of line 18 is a per-layer positive constant
that a sign-driven update does not need) and one 32-bit random number ``u`` per weight
per step from :class:`sim.hw.rng.RngBank`. ``w`` is the binary weight (int8 +-1).
All state is integer; each function is one pass of the weight-memory update unit over
a layer and returns the new arrays (the inputs are not modified).

Random bits: ``u >> 16`` (16 bits) decides switches; ``u & 0xFFFF`` rounds EMAs
stochastically (``(x + r) >> s`` with ``r = u & (2^s - 1)``, unbiased); the latent
SGD update rounds with the top bits ``u >> (32 - s)``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "PROB_BITS",
    "switch_table",
    "switch_update",
    "switch_gate",
    "switch_sigma_at",
    "switch_table_at",
    "bop_update",
    "iir_update",
    "sgd_update",
    "beta_update",
    "lr_shift",
    "ratio_shift",
    "state_bits",
]

PROB_BITS = 16  # resolution of switch probabilities: u >> 16 compared with a 17-bit table entry


def lr_shift(lr: float) -> int:
    """The learning rate as a power of two: ``round(-log2 lr)`` (host-side)."""
    if not lr > 0:
        return 63
    return max(0, int(round(-math.log2(lr))))


def ratio_shift(ratio: float, cap: int = 16) -> int:
    """Schedule multiplier ``ratio = lr / lr0`` in (0, 1] as a shift ``round(log2(1/ratio))``, capped."""
    if not ratio > 0:
        return cap
    return int(min(max(round(-math.log2(min(ratio, 1.0))), 0), cap))


def _sround_shift(x: np.ndarray, s: int, r: np.ndarray) -> np.ndarray:
    """``(x + r) >> s`` with ``r`` uniform in [0, 2^s): stochastic rounding of ``x / 2^s``."""
    if s <= 0:
        return x << (-s)
    return (x + (r & ((1 << s) - 1))) >> s


# ---------------------------------------------------------------------------
# Stochastic switch memory (Akesson, Network VII, with the cut-off in place of the maximum)


def switch_table(cutoff: int, sigma: float, lam: float) -> np.ndarray:
    """Switch thresholds ``T[p]`` for ``p = w * acc`` in 0..C (host-computed, int64 [C+1]).

    ``sigma_c = round(sigma C)``, ``lam_q = round(lam 2^16)``;
    ``T[p] = min(2^16, lam_q * max(0, p - sigma_c) // (C - sigma_c))``: the probability rises
    linearly from 0 at ``p = sigma C`` to ``lam`` at ``p = C`` (Algorithm 2 of seed 004 with
    ``rho = C``). A weight switches when ``(u >> 16) < T[p]``.
    """
    C = int(cutoff)
    sc = min(int(round(sigma * C)), C - 1)
    lam_q = int(round(min(max(lam, 0.0), 1.0) * (1 << PROB_BITS)))
    p = np.arange(C + 1, dtype=np.int64)
    return np.minimum(1 << PROB_BITS, lam_q * np.maximum(0, p - sc) // (C - sc))


def switch_update(w, acc, g, u, table, cutoff: int, reset: bool = False, gate: int = 1 << 16):
    """One step of the switch memory: ``(w, acc, switched)``.

    ``acc <- clamp(acc + g, -C, C)`` where the increment is taken only when
    ``(u & 0xFFFF) < gate`` (``gate = round(2^16 lr / lr0)``: the learning-rate schedule slows the
    accumulation, as it slows a latent weight); ``p = w acc``; switch when ``p > 0`` and
    ``(u >> 16) < T[p]``; with ``reset`` a switched weight's accumulator is cleared.
    """
    C = int(cutoff)
    inc = g.astype(np.int16)
    if gate < (1 << 16):
        inc = np.where((u & np.uint32(0xFFFF)) < np.uint32(gate), inc, 0).astype(np.int16)
    acc = np.clip(acc.astype(np.int32) + inc, -C, C).astype(acc.dtype)
    p = w.astype(np.int32) * acc
    thr = np.asarray(table, dtype=np.int64)[np.maximum(p, 0)]
    sw = (p > 0) & ((u >> np.uint32(16)).astype(np.int64) < thr)
    w = np.where(sw, -w, w).astype(np.int8)
    if reset:
        acc = np.where(sw, 0, acc).astype(acc.dtype)
    return w, acc, sw


def switch_sigma_at(sigma: float, anneal: float, ratio: float) -> float:
    """Switching threshold at schedule ratio ``lr / lr0``: ``1 - (1 - sigma) ratio^anneal``.

    As the learning rate falls the threshold rises towards the cut-off, so a weight needs more consistent
    gradient evidence to switch: the accumulator gate (:func:`switch_gate`) only slows the accumulation and
    leaves the evidence behind each switch as noisy as at the initial rate (docs/results_hw.md).
    ``anneal = 0`` keeps ``sigma`` fixed.
    """
    if anneal <= 0:
        return float(sigma)
    r = min(max(float(ratio), 0.0), 1.0)
    return 1.0 - (1.0 - float(sigma)) * r**float(anneal)


def switch_table_at(cutoff: int, sigma: float, lam: float, anneal: float, ratio: float) -> np.ndarray:
    """The switch table the host writes at schedule ratio ``ratio``: :func:`switch_table` at
    :func:`switch_sigma_at` (one function for the bit-exact model and the driver)."""
    return switch_table(cutoff, switch_sigma_at(sigma, anneal, ratio), lam)


def switch_gate(ratio: float, rate: float = 1.0) -> int:
    """Accumulation gate ``round(2^16 min(rate ratio, 1))`` (at least 1) from the schedule ratio lr / lr0 and the
    configured accumulation rate ``hw.switch_rate`` (the probability of taking an increment at lr0)."""
    return max(1, int(round(min(max(float(rate) * ratio, 0.0), 1.0) * (1 << PROB_BITS))))


# ---------------------------------------------------------------------------
# Bop-style: EMA of the gradient sign, flip past a threshold in the weight's direction


def bop_update(w, m, g, u, shift: int, frac: int, tau_q: int):
    """``m <- m + sround((g 2^F - m) 2^-shift)``; flip where ``w m > tau_q``. Returns ``(w, m, flipped)``."""
    r = (u & np.uint32(0xFFFF)).astype(np.int32)
    m32 = m.astype(np.int32)
    m32 = m32 + _sround_shift((g.astype(np.int32) << frac) - m32, shift, r)
    flip = w.astype(np.int32) * m32 > tau_q
    w = np.where(flip, -w, w).astype(np.int8)
    return w, m32.astype(m.dtype), flip


# ---------------------------------------------------------------------------
# Quist's 2nd-order IIR filter (seed 002, Eqs 12-14) with power-of-two rates


def iir_update(w, m, G, g, u, gamma_shift: int, alpha_shift: int, m_frac: int, g_frac: int):
    """``m <- m + sround((g - m) gamma)``, ``G <- G + sround((m - G) alpha)``, ``w = -sign(G)`` (kept at 0).

    Rates are ``2^-gamma_shift`` and ``2^-alpha_shift`` (alpha includes the decay). ``m`` has
    ``m_frac`` and ``G`` ``g_frac`` fractional bits (both in [-1, 1]). Returns ``(w, m, G, flipped)``.
    """
    r_lo = (u & np.uint32(0xFFFF)).astype(np.int32)
    r_hi = (u >> np.uint32(16)).astype(np.int32)
    m32 = m.astype(np.int32)
    m32 = m32 + _sround_shift((g.astype(np.int32) << m_frac) - m32, gamma_shift, r_lo)
    G32 = G.astype(np.int32)
    if alpha_shift <= 16:
        G32 = G32 + _sround_shift((m32 << (g_frac - m_frac)) - G32, alpha_shift, r_hi)
    else:  # rounding randomness is 16 bits: scale it up for larger shifts
        d = (m32.astype(np.int64) << (g_frac - m_frac)) - G32
        r = r_hi.astype(np.int64) << (alpha_shift - 16)
        G32 = (G32 + ((d + r) >> alpha_shift)).astype(np.int32)
    new_w = np.where(G32 > 0, -1, np.where(G32 < 0, 1, w)).astype(np.int8)
    return new_w, m32.astype(m.dtype), G32.astype(G.dtype), new_w != w


# ---------------------------------------------------------------------------
# Latent fixed-point weights with momentum (the conventional baseline)


def sgd_update(c, m, g, u, lr_sh: int, latent_frac: int, mom_shift: int, mom_frac: int):
    """Latent ``c`` (Q0.latent_frac in [-1, 1)) minus ``lr * momentum``, stochastically rounded.

    ``m <- m + sround((g 2^Fm - m) 2^-mom_shift)`` (or ``m = g 2^Fm`` without momentum);
    ``c <- clamp(c - sround(m 2^(Fc - Fm) 2^-lr_sh))``; ``w = +1 iff c >= 0``.
    Returns ``(w, c, m)``.
    """
    r_lo = (u & np.uint32(0xFFFF)).astype(np.int32)
    g32 = g.astype(np.int32)
    if mom_shift > 0:
        m32 = m.astype(np.int32)
        m32 = m32 + _sround_shift((g32 << mom_frac) - m32, mom_shift, r_lo)
        step = m32
        m = m32.astype(m.dtype)
    else:
        step = g32 << mom_frac
    sh = lr_sh - (latent_frac - mom_frac)
    step64 = step.astype(np.int64)
    if sh <= 0:
        delta = step64 << (-sh)
    else:
        s = min(sh, 32)
        r = (u.astype(np.int64) >> (32 - s)) if s > 0 else 0
        delta = (step64 + r) >> s if sh <= 32 else np.zeros_like(step64)
    lim = 1 << latent_frac
    c = np.clip(c.astype(np.int64) - delta, -lim, lim - 1).astype(c.dtype)
    w = np.where(c >= 0, 1, -1).astype(np.int8)
    return w, c, m


# ---------------------------------------------------------------------------
# BN bias


def _align(x: np.ndarray, d: int) -> np.ndarray:
    """``x 2^d``: a left shift for ``d >= 0``, else an arithmetic right shift rounding half up."""
    if d >= 0:
        return x << d
    return (x + (1 << (-d - 1))) >> (-d)


def beta_update(beta_q, m_beta, a_beta, exp_beta: int, p1, scale: int, lr_sh: int, p, m_shift: int, a_shift: int,
                state_bits: int):
    """The BN-bias update: ``beta -= lr * EMA(dbeta) / EMA(|dbeta|)`` in per-layer block floating point.

    ``dbeta = P1 2^scale`` (exact integers with the layer's gradient scale exponent). The two
    per-channel EMAs ``m`` (signed) and ``a`` (of ``|dbeta|``) share the layer exponent ``exp_beta``:
    ``m_real = m 2^exp_beta``. Each step:

    1. ``E' = max(top(P1) + scale, top(a) + exp_beta) - (state_bits - 2)`` with ``top = bitlen(max|.|)``
       (the new largest magnitude sits just below bit ``state_bits - 2``); ``m``, ``a`` and ``P1`` are
       re-aligned to ``E'`` (shift left, or right rounding half up);
    2. ``m += (g - m + 2^(sm-1)) >> sm``, ``a += (|g| - a + 2^(sa-1)) >> sa``;
    3. ``r = round(256 m / a)`` (one division per channel; 0 when ``a = 0``), clipped to [-256, 256];
    4. ``beta_q -= round_half_up(r 2^(Fb - 8 - lr_sh))``, saturating.

    ``m / a`` is scale-free and follows the *mean* gradient (an l1 form of Adam's ``m / sqrt(v)``);
    a sign-of-gradient rule follows the median instead and was measured to drift (docs/results_hw.md).
    Returns ``(beta_q, m, a, exp_beta)``.
    """
    g = np.asarray(p1, dtype=np.int64)
    m = np.asarray(m_beta, dtype=np.int64)
    a = np.asarray(a_beta, dtype=np.int64)
    gmax = int(np.abs(g).max()) if g.size else 0
    amax = int(a.max()) if a.size else 0
    tops = []
    if gmax:
        tops.append(gmax.bit_length() + int(scale))
    if amax:
        tops.append(amax.bit_length() + int(exp_beta))
    if not tops:
        return beta_q, m, a, exp_beta
    e_new = max(tops) - (state_bits - 2)
    m = _align(m, int(exp_beta) - e_new)
    a = _align(a, int(exp_beta) - e_new)
    g = _align(g, int(scale) - e_new)
    m = m + ((g - m + (1 << (m_shift - 1))) >> m_shift) if m_shift > 0 else g
    a = a + ((np.abs(g) - a + (1 << (a_shift - 1))) >> a_shift) if a_shift > 0 else np.abs(g)
    safe = np.maximum(a, 1)
    r = np.where(a > 0, np.sign(m) * ((2 * np.abs(m) * 256 + safe) // (2 * safe)), 0)
    r = np.clip(r, -256, 256)
    sh = lr_sh + 8 - p.beta_frac
    if sh <= 0:
        delta = r << (-sh)
    elif sh < 62:
        delta = (r + (1 << (sh - 1))) >> sh
    else:
        delta = np.zeros_like(r)
    beta_q = np.clip(beta_q - delta, p.beta_lo, p.beta_hi)
    return beta_q, m, a, e_new


def state_bits(h) -> dict[str, int]:
    """Bits of per-weight state of the configured optimiser ``h = cfg.hw``: {name: bits}."""
    if h.optimizer == "switch":
        d = {"weight": 1, "accumulator": int(h.switch_cutoff).bit_length() + 1}
        if h.switch_undo:
            d["undo copy"] = 1
        return d
    if h.optimizer == "bop":
        return {"weight": 1, "ema m": h.bop_frac_bits + 2}
    if h.optimizer == "iir":
        return {"weight": 1, "ema m": h.iir_m_frac_bits + 2, "filter g": h.iir_g_frac_bits + 2}
    d = {"latent (sign = weight)": h.sgd_latent_bits}
    if h.sgd_momentum_shift > 0:
        d["momentum"] = h.sgd_momentum_frac_bits + 2
    return d
