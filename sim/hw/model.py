"""The bit-exact model of the accelerator's training step (docs/arithmetic.md).

:class:`HwModel` holds exactly the on-chip state (binary weights, optimiser state, BN
biases and their momentum, running BN statistics, RNG states) and runs
:meth:`HwModel.train_step` / :meth:`HwModel.evaluate` with the integer functions of
:mod:`sim.hw.arith` and :mod:`sim.hw.optim`. Dense and conv layers with batch norm, max pooling
after a conv layer and a dense output layer are modelled (:func:`sim.hw.widths.model_support_error`
names what is not). Conv weights and their optimiser state are ``[Co, Ci, k, k]``; the random
generators serve them as the matrix ``[Ci k k, Co]`` (rows = window positions (c, i, j), columns
= output channels), the dense layers' ``(in, out)`` layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..reference.ops import pooled_bn_beta
from ..schema import ConfigError
from . import arith as A
from . import optim as O
from .rng import RngBank
from .widths import check_widths, layer_bounds, model_support_error, pools_after, pools_before_bn

__all__ = ["HwModel", "StepTrace", "StateError", "validate_state"]


@dataclass
class StepTrace:
    """Everything one training step produced, per layer (for RTL read-back comparisons and tests)."""

    y: list = field(default_factory=list)
    bn: list = field(default_factory=list)  # A.BnForward
    logits_q: np.ndarray | None = None
    grad_q: np.ndarray | None = None
    q: list = field(default_factory=list)  # BN backward Q per layer (top first)
    codes: list = field(default_factory=list)  # A.Po2Codes per layer (top first)
    dw_sign: list = field(default_factory=list)  # sign(dW) per layer (top first), in the weights' layout
    pool_idx: list = field(default_factory=list)  # per layer: maxpool_argmax of Y (None without pooling)
    dbeta_sign: list = field(default_factory=list)
    dbeta: list = field(default_factory=list)  # P1 per layer (top first): dbeta = P1 2^scale (/ B for the top)
    dx_scale: list = field(default_factory=list)  # scale exponent of dx per layer (top first)
    loss: float = 0.0
    loss_q: int = 0
    correct: int = 0
    flips: int = 0
    undone: bool = False


class HwModel:
    def __init__(self, cfg):
        self.cfg = cfg
        self.h = cfg.hw
        self.p = A.ArithParams.from_config(cfg)
        why = model_support_error(cfg)
        if why:
            raise ConfigError(why)
        if self.h.check_widths:
            check_widths(cfg, conv=True)  # load time checked the dense topologies only
        self.layers = cfg.weight_layers()
        self.pools = pools_after(cfg)
        self.pool_first = pools_before_bn(cfg)  # per layer: Y pooled before its BN (maxpool before_bn)
        self.input_kind = self.h.input_kind(cfg)
        self.x_max = [128 if (j == 0 and self.input_kind == "int8") else 1 for j in range(len(self.layers))]
        self.bounds = layer_bounds(cfg)
        self.wshapes = [tuple(s.weight_shape) for s in self.layers]
        self.mshapes = [(s.fan_in, s.out_channels) for s in self.layers]  # the generators' matrix view
        self.n_weights = int(sum(math.prod(s) for s in self.wshapes))
        self.lr0 = float(cfg.lr)
        self.total_epochs = int(cfg.train.epochs)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Power-on state: weights drawn from the generators (one sweep), the bias of a BN layer whose output a max
        pool takes (not ``before_bn``) at ``pooled_bn_beta`` (as the float reference), everything else zero."""
        h, p = self.h, self.p
        self.rng = RngBank(self.mshapes, h.rng_seed, h.rng_block)
        u0 = self._sweep()
        self.w = [np.where(u < np.uint32(1 << 31), 1, -1).astype(np.int8) for u in u0]
        m = [s.out_channels for s in self.layers]
        self.beta = [np.zeros(c, dtype=np.int64) for c in m]
        for j, pool in enumerate(self.pools):  # BN before a max pool: the float reference's initial bias
            if pool > 1 and not self.pool_first[j]:
                self.beta[j][:] = round(pooled_bn_beta(pool) * (1 << p.beta_frac))
        self.m_beta = [np.zeros(c, dtype=np.int64) for c in m]
        self.a_beta = [np.zeros(c, dtype=np.int64) for c in m]
        self.e_beta = [0 for _ in m]
        self.mu_r = [np.zeros(c, dtype=np.int64) for c in m]
        self.s_r = [np.full(c, 1 << p.running_frac, dtype=np.int64) for c in m]
        self.opt: dict[str, list[np.ndarray]] = {}
        if h.optimizer == "switch":
            dt = np.int16
            self.opt["acc"] = [np.zeros(s, dtype=dt) for s in self.wshapes]
        elif h.optimizer == "bop":
            self.opt["m"] = [np.zeros(s, dtype=np.int32) for s in self.wshapes]
        elif h.optimizer == "iir":
            self.opt["m"] = [np.zeros(s, dtype=np.int32) for s in self.wshapes]
            self.opt["g"] = [np.zeros(s, dtype=np.int32) for s in self.wshapes]
        else:
            fc = h.sgd_latent_bits - 1
            mag_bits = fc - h.sgd_init_shift
            lat = []
            for w, u in zip(self.w, u0, strict=True):
                mag = ((u & np.uint32(0xFFFF)).astype(np.int64) >> (16 - mag_bits)) if mag_bits <= 16 else (
                    (u & np.uint32(0xFFFF)).astype(np.int64) << (mag_bits - 16))
                lat.append(np.where(w > 0, mag, -1 - mag).astype(np.int32))
            self.opt["latent"] = lat
            if h.sgd_momentum_shift > 0:  # without momentum there is no second state field (optim.state_bits)
                self.opt["m"] = [np.zeros(s, dtype=np.int32) for s in self.wshapes]
        self.steps = 0

    def _sweep(self) -> list[np.ndarray]:
        """One number per weight (:meth:`RngBank.sweep`), in the weights' layout: a conv layer's matrix
        ``[Ci k k, Co]`` of numbers becomes ``[Co, Ci, k, k]``."""
        return [u if len(shape) == 2 else np.ascontiguousarray(u.T.reshape(shape))
                for u, shape in zip(self.rng.sweep(), self.wshapes, strict=True)]

    def state_dict(self) -> dict[str, np.ndarray]:
        """All on-chip state as named arrays (weights as int8 +-1); :func:`validate_state` lists the keys."""
        d: dict[str, np.ndarray] = {"steps": np.array(self.steps, dtype=np.int64), "rng": self.rng.get_state()}
        for j in range(len(self.layers)):
            d[f"w{j}"] = self.w[j].copy()
            d[f"beta{j}"] = self.beta[j].copy()
            d[f"m_beta{j}"] = self.m_beta[j].copy()
            d[f"a_beta{j}"] = self.a_beta[j].copy()
            d[f"e_beta{j}"] = np.array(self.e_beta[j], dtype=np.int64)
            d[f"mu_r{j}"] = self.mu_r[j].copy()
            d[f"s_r{j}"] = self.s_r[j].copy()
            for key, arrs in self.opt.items():
                d[f"{key}{j}"] = arrs[j].copy()
        return d

    def load_state_dict(self, d: Mapping[str, np.ndarray]) -> None:
        """Restore a :meth:`state_dict` (this model's, the driver's read-back or a checkpoint's).

        The whole state is checked with :func:`validate_state` first; nothing is written when it fails.
        """
        validate_state(self, d)
        self.steps = int(d["steps"])
        self.rng.set_state(np.asarray(d["rng"]).astype(np.uint32))
        for j in range(len(self.layers)):
            self.w[j] = np.asarray(d[f"w{j}"]).astype(np.int8)
            self.beta[j] = np.asarray(d[f"beta{j}"]).astype(np.int64)
            self.m_beta[j] = np.asarray(d[f"m_beta{j}"]).astype(np.int64)
            self.a_beta[j] = np.asarray(d[f"a_beta{j}"]).astype(np.int64)
            self.e_beta[j] = int(d[f"e_beta{j}"])
            self.mu_r[j] = np.asarray(d[f"mu_r{j}"]).astype(np.int64)
            self.s_r[j] = np.asarray(d[f"s_r{j}"]).astype(np.int64)
            for key, arrs in self.opt.items():
                arrs[j] = np.asarray(d[f"{key}{j}"]).astype(arrs[j].dtype)

    # ------------------------------------------------------------------ forward
    def forward_train(self, x: np.ndarray, trace: StepTrace, w=None):
        """Training-mode forward pass; returns the retained per-layer values and the logits."""
        w = self.w if w is None else w
        p = self.p
        saved = []
        cur = np.asarray(x)
        L = len(self.layers)
        logits = None
        for j in range(L):
            xin, y = self._layer_y(j, cur, w[j])
            pool = self.pools[j]
            idx = A.maxpool_argmax(y, pool) if pool else None
            first = self.pool_first[j]
            # before_bn: BN over the pooled Y (its x_hat and mask are the next layer's input and mask)
            fwd = A.bn_forward(A.maxpool_select(y, idx, pool) if first else y, self.beta[j], p, self.bounds[j].y)
            trace.y.append(y)
            trace.bn.append(fwd)
            trace.pool_idx.append(idx)
            # the next layer's input and its straight-through mask: at each window's first largest Y when pooled
            mask = A.maxpool_select(fwd.mask, idx, pool) if pool and not first else fwd.mask
            saved.append((xin, fwd, y, idx, mask))
            if j == L - 1:
                logits = A.output_logits(y, fwd, p)
            else:
                cur = A.maxpool_select(fwd.x_hat, idx, pool) if pool and not first else fwd.x_hat
        return saved, logits

    def _layer_y(self, j: int, cur: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``j``'s input in its own shape (``[B, N]`` dense, ``[B, C, H, W]`` conv) and its ``Y``."""
        s = self.layers[j]
        b = cur.shape[0]
        if s.spec.type == "conv":
            xin = cur.reshape(b, *s.in_shape)
            return xin, A.conv_xnor_popcount(xin, w, s.spec.padding, self.x_max[j])
        xin = cur.reshape(b, -1)
        return xin, A.xnor_popcount(xin, w, self.x_max[j])

    def forward_eval(self, x: np.ndarray) -> np.ndarray:
        p = self.p
        cur = np.asarray(x)
        L = len(self.layers)
        for j in range(L):
            _, y = self._layer_y(j, cur, self.w[j])
            if j == L - 1:
                return A.output_logits_eval(y, self.beta[j], self.mu_r[j], self.s_r[j], p)
            pool = self.pools[j]
            cur = A.bn_forward_eval(y, self.beta[j], self.mu_r[j], self.s_r[j], p, self.bounds[j].y)
            # the sign at the first largest Y of each window (= the window's largest sign); with before_bn the same
            # value, the sign of the pooled Y: the threshold of the running statistics is monotone in Y
            if pool:
                cur = A.maxpool_select(cur, A.maxpool_argmax(y, pool), pool)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ step
    def train_step(self, x: np.ndarray, labels: np.ndarray, *, lr: float, progress: float = 0.0) -> StepTrace:
        """Forward, backward and update on one batch (the accelerator's step); returns the trace."""
        p, h = self.p, self.h
        trace = StepTrace()
        saved, logits = self.forward_train(x, trace)
        for j, (_, fwd, *_) in enumerate(saved):
            self.mu_r[j], self.s_r[j] = A.running_update(self.mu_r[j], self.s_r[j], fwd, p)
        g, loss, correct = A.loss_grad(logits, labels, p)
        trace.logits_q, trace.grad_q, trace.loss, trace.correct = logits, g, loss, correct
        trace.loss_q = self._loss_q(logits, labels)
        # backward
        L = len(self.layers)
        # Loss gradient g 2^scale / B: the 1/B cancels the B of the BN backward (times_batch=False).
        dx, scale, top = g, A.loss_grad_scale(p), True
        dw_signs: list = [None] * L
        p1s: list = [None] * L
        scales: list = [0] * L
        for j in reversed(range(L)):
            xin, fwd, *_ = saved[j]
            q, p1 = A.bn_backward(dx, fwd.x_hat, fwd.alpha_q, p, fwd.zero)
            codes = A.po2_quantise(q, fwd.S_eff, scale, p, times_batch=not top)
            if self.pool_first[j]:  # before_bn: the pooled codes go to their windows' first largest Y
                _, _, y_j, idx_j, _ = saved[j]
                codes = A.route_codes(codes, idx_j, y_j.shape, self.pools[j])
            top = False
            dw = self._dw(j, xin, codes)
            dw_signs[j] = np.sign(dw).astype(np.int8)
            p1s[j] = p1
            scales[j] = scale
            trace.q.append(q)
            trace.codes.append(codes)
            trace.dw_sign.append(dw_signs[j])
            trace.dbeta_sign.append(np.sign(p1))
            trace.dbeta.append(p1)
            trace.dx_scale.append(scale)
            if j > 0:
                s = self.layers[j]
                if s.spec.type == "conv":
                    dX, scale = A.po2_backward_dx_conv(codes, self.w[j], s.spec.padding, p)
                else:
                    dX, scale = A.po2_backward_dx(codes, self.w[j], p)
                _, _, y_below, idx, mask = saved[j - 1]
                dx = dX.reshape(mask.shape) * mask
                if idx is not None and not self.pool_first[j - 1]:  # max-pool backward: to each first largest Y
                    dx = A.maxpool_route(dx, idx, y_below.shape, self.pools[j - 1])
        # update
        old_w = [w.copy() for w in self.w] if h.switch_undo else None
        flips = self._update_weights(dw_signs, lr, progress)
        lsh = O.lr_shift(lr)
        for j in range(L):
            self.beta[j], self.m_beta[j], self.a_beta[j], self.e_beta[j] = O.beta_update(
                self.beta[j], self.m_beta[j], self.a_beta[j], self.e_beta[j], p1s[j], scales[j], lsh, p,
                h.beta_momentum_shift, h.beta_scale_shift, h.beta_state_bits,
            )
        if h.switch_undo and h.optimizer == "switch":
            after = StepTrace()
            _, logits2 = self.forward_train(x, after)
            if self._loss_q(logits2, labels) > trace.loss_q:
                self.w = old_w
                trace.undone = True
                flips = 0
        trace.flips = flips
        self.steps += 1
        return trace

    def _dw(self, j: int, xin: np.ndarray, codes: A.Po2Codes) -> np.ndarray:
        """Layer ``j``'s ``dW`` (or ``X^T t`` of ``hw.dw_window``) in the weights' layout; only its sign is kept."""
        h, p, s = self.h, self.p, self.layers[j]
        if s.spec.type == "conv":
            k, pad = s.spec.kernel, s.spec.padding
            if h.dw_window:
                return A.po2_backward_dw_window_conv(xin, codes, h.dw_window, k, pad, p, self.x_max[j])
            return A.po2_backward_dw_conv(xin, codes, k, pad, p, self.x_max[j])
        if h.dw_window:
            return A.po2_backward_dw_window(xin, codes, h.dw_window, self.x_max[j])
        return A.po2_backward_dw(xin, codes, p, self.x_max[j])

    def _loss_q(self, logits: np.ndarray, labels: np.ndarray) -> int:
        """Integer loss the undo function compares: squared hinge ``sum m^2``, or for cross-entropy
        ``sum (2^Fp - p_label)`` (the probability mass not on the label)."""
        g, _, _ = A.loss_grad(logits, labels, self.p)
        if self.p.loss == "squared_hinge":
            return int((g * g).sum())
        return int(-g[np.arange(len(labels)), np.asarray(labels).astype(np.intp)].sum())

    def _update_weights(self, dw_signs, lr: float, progress: float) -> int:
        h = self.h
        ratio = lr / self.lr0 if self.lr0 > 0 else 1.0
        us = self._sweep()
        flips = 0
        if h.optimizer == "switch":
            table = O.switch_table_at(h.switch_cutoff, h.switch_sigma, h.switch_lambda, h.switch_anneal, ratio)
            gate = O.switch_gate(ratio, h.switch_rate)
        for j, (g, u) in enumerate(zip(dw_signs, us, strict=True)):
            w = self.w[j]
            if h.optimizer == "switch":
                nw, self.opt["acc"][j], _ = O.switch_update(
                    w, self.opt["acc"][j], g, u, table, h.switch_cutoff, h.switch_reset, gate
                )
            elif h.optimizer == "bop":
                shift = min(h.bop_shift + O.ratio_shift(ratio), 16)
                tau_q = int(round(h.bop_threshold * (1 << h.bop_frac_bits)))
                nw, self.opt["m"][j], _ = O.bop_update(w, self.opt["m"][j], g, u, shift, h.bop_frac_bits, tau_q)
            elif h.optimizer == "iir":
                a_sh = h.iir_alpha_shift + self._iir_decay_shift(progress)
                nw, self.opt["m"][j], self.opt["g"][j], _ = O.iir_update(
                    w, self.opt["m"][j], self.opt["g"][j], g, u, h.iir_gamma_shift, a_sh,
                    h.iir_m_frac_bits, h.iir_g_frac_bits,
                )
            else:
                mom = self.opt.get("m")
                nw, self.opt["latent"][j], m_new = O.sgd_update(
                    self.opt["latent"][j], mom[j] if mom else np.zeros(w.shape, np.int32), g, u, O.lr_shift(lr),
                    h.sgd_latent_bits - 1, h.sgd_momentum_shift, h.sgd_momentum_frac_bits,
                )
                if mom:
                    mom[j] = m_new
            flips += int(np.count_nonzero(nw != w))
            self.w[j] = nw
        return flips

    def _iir_decay_shift(self, progress: float) -> int:
        """Alpha decay of ``optimizer.iir.alpha_decay`` at ``progress``, as a power of two (capped)."""
        from ..reference.optim import iir_beta

        ic = self.cfg.optimizer.iir
        beta = iir_beta(progress, ic.alpha_decay, epochs=self.total_epochs, factor=ic.decay_factor,
                        every=ic.decay_every)
        return O.ratio_shift(beta, self.h.iir_max_decay_shift)

    # ------------------------------------------------------------------ eval
    def evaluate(self, x: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        logits = self.forward_eval(x)
        _, loss, correct = A.loss_grad(logits, labels, self.p)
        return loss, correct


# ---------------------------------------------------------------------------
# State validation (before any restore: HwModel.load_state_dict, the host driver, checkpoints)


class StateError(ValueError):
    """A state that does not fit the configuration; the one-line message names the key, the value and the limit."""


E_BETA_BITS = 16  # the per-layer block exponent of the beta EMAs is a 16-bit signed register


def _m_beta_bits(h) -> int:
    """Signed width of the beta momentum ``m``: ``hw.beta_state_bits`` plus its headroom over ``a``.

    ``|m| <= F a`` with ``F = 2^(sa-sm) / (1 - (1-2^-sm) / (1-2^-sa))`` when ``sa > sm`` (a large old
    gradient decays faster in ``m`` than in ``a``); the headroom is ``bitlen(ceil(F)) + 1`` bits (2 otherwise).
    The same width as the RTL's storage (``rtl_gen.controller.bn_param_sizes``).
    """
    sm, sa = h.beta_momentum_shift, h.beta_scale_shift
    extra = 2
    if 0 < sm < sa:
        f = 2.0 ** (sa - sm) / (1 - (1 - 2.0**-sm) / (1 - 2.0**-sa))
        extra = int(math.ceil(f)).bit_length() + 1
    return h.beta_state_bits + extra


@dataclass(frozen=True)
class _Limit:
    shape: tuple
    lo: int
    hi: int
    why: str  # what the range is, for the message


def state_limits(cfg_or_model) -> dict[str, _Limit]:
    """Every key of :meth:`HwModel.state_dict` for this configuration: its shape and value range."""
    model = cfg_or_model if isinstance(cfg_or_model, HwModel) else HwModel(cfg_or_model)
    h, p = model.h, model.p
    out = {
        "steps": _Limit((), 0, (1 << 63) - 1, "a step count"),
        "rng": _Limit(model.rng.state.shape, 1, (1 << 32) - 1,
                      "xorshift32 states are non-zero 32-bit numbers, one per generator"),
    }
    opt = {
        "switch": {"acc": (-h.switch_cutoff, h.switch_cutoff, f"hw.switch_cutoff = {h.switch_cutoff}")},
        "bop": {"m": (-(1 << h.bop_frac_bits), 1 << h.bop_frac_bits,
                      f"m in [-1, 1] with hw.bop_frac_bits = {h.bop_frac_bits}")},
        "iir": {"m": (-(1 << h.iir_m_frac_bits), 1 << h.iir_m_frac_bits,
                      f"m in [-1, 1] with hw.iir_m_frac_bits = {h.iir_m_frac_bits}"),
                "g": (-(1 << h.iir_g_frac_bits), 1 << h.iir_g_frac_bits,
                      f"g in [-1, 1] with hw.iir_g_frac_bits = {h.iir_g_frac_bits}")},
        "sgd": {"latent": (-(1 << (h.sgd_latent_bits - 1)), (1 << (h.sgd_latent_bits - 1)) - 1,
                           f"latent in [-1, 1) with hw.sgd_latent_bits = {h.sgd_latent_bits}"),
                "m": (-(1 << h.sgd_momentum_frac_bits), 1 << h.sgd_momentum_frac_bits,
                      f"momentum in [-1, 1] with hw.sgd_momentum_frac_bits = {h.sgd_momentum_frac_bits}")},
    }[h.optimizer]
    mb = _m_beta_bits(h)
    for j, wshape in enumerate(model.wshapes):
        M = (model.layers[j].out_channels,)
        run = model.bounds[j].running
        out[f"w{j}"] = _Limit(wshape, -1, 1, "binary weights are -1 or +1 (dense rows = inputs; conv [Co, Ci, k, k])")
        out[f"beta{j}"] = _Limit(M, p.beta_lo, p.beta_hi,
                                 f"beta is Q{p.beta_int}.{p.beta_frac} (hw.beta_int_bits, hw.beta_frac_bits)")
        out[f"m_beta{j}"] = _Limit(M, -(1 << (mb - 1)), (1 << (mb - 1)) - 1,
                                   f"{mb}-bit signed beta momentum (hw.beta_state_bits = {h.beta_state_bits})")
        out[f"a_beta{j}"] = _Limit(M, 0, (1 << h.beta_state_bits) - 1,
                                   f"{h.beta_state_bits}-bit unsigned beta scale (hw.beta_state_bits)")
        out[f"e_beta{j}"] = _Limit((), -(1 << (E_BETA_BITS - 1)), (1 << (E_BETA_BITS - 1)) - 1,
                                   f"{E_BETA_BITS}-bit signed block exponent")
        out[f"mu_r{j}"] = _Limit(M, -run, run, f"running mean bound of layer {j} in Q.{p.running_frac}")
        out[f"s_r{j}"] = _Limit(M, 0, run, f"running scale bound of layer {j} in Q.{p.running_frac}")
        for key in model.opt:
            lo, hi, why = opt[key]
            out[f"{key}{j}"] = _Limit(wshape, lo, hi, f"hw.optimizer = {h.optimizer}: {why}")
    return out


def _is_weight_key(key: str) -> bool:
    return key.startswith("w") and key[1:].isdigit()


def _where(a: np.ndarray, mask: np.ndarray) -> str:
    idx = np.unravel_index(int(np.argmax(mask)), a.shape) if a.ndim else ()
    return "[" + ", ".join(str(int(i)) for i in idx) + "]" if idx else ""


def validate_state(cfg_or_model, state: Mapping[str, np.ndarray]) -> None:
    """Check a whole :meth:`HwModel.state_dict`-keyed state against a configuration (or a model) before
    anything is restored; raise :class:`StateError` naming the first offending key, value and limit.

    Checks: exactly the keys this configuration keeps (no missing, no extra), shapes (a transposed
    weight matrix is refused), integer values (integer dtype, or integral finite floats), ranges
    (weights +-1; optimiser state within its range for ``hw.*``; beta, its EMAs and exponent within
    their register widths; running statistics within the layer's bound; RNG states non-zero 32-bit)
    and the weight/state coupling of ``sgd`` (``w = +1`` iff ``latent >= 0``) and ``iir``
    (``w = -sign(g)`` where ``g != 0``).
    """
    limits = state_limits(cfg_or_model)
    h = (cfg_or_model.cfg if isinstance(cfg_or_model, HwModel) else cfg_or_model).hw
    if not isinstance(state, Mapping):
        raise StateError(f"state: expected a mapping of names to arrays, got {type(state).__name__}")
    missing = [k for k in limits if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise StateError(f"state lacks {missing[0]!r}{more}; hw.optimizer = {h.optimizer} keeps: "
                         + ", ".join(sorted(limits)))
    extra = sorted(k for k in state if k not in limits)
    if extra:
        raise StateError(f"state has {extra[0]!r}, which this configuration (hw.optimizer = {h.optimizer}, "
                         f"{sum(map(_is_weight_key, limits))} weight layers) does not keep")
    arrays = {}
    for key, lim in limits.items():
        a = np.asarray(state[key])
        if a.shape != lim.shape:
            raise StateError(f"{key} has shape {a.shape}; this configuration needs {lim.shape} ({lim.why})")
        if a.dtype.kind == "f":
            bad = ~np.isfinite(a) | (a != np.round(a)) if a.size else np.zeros(a.shape, bool)
            if bad.any():
                raise StateError(f"{key}{_where(a, bad)} = {float(a[bad].flat[0])} is not an integer")
        elif a.dtype.kind not in "iu":
            raise StateError(f"{key} has dtype {a.dtype}; expected integers")
        if a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < lim.lo or hi > lim.hi:
                v = lo if lo < lim.lo else hi
                raise StateError(f"{key}{_where(a, a == v)} = {v} is outside [{lim.lo}, {lim.hi}] ({lim.why})")
        if _is_weight_key(key) and (a == 0).any():
            raise StateError(f"{key}{_where(a, a == 0)} = 0; binary weights are -1 or +1")
        arrays[key] = a
    for j in range(sum(1 for k in limits if _is_weight_key(k))):
        w = arrays[f"w{j}"]
        if h.optimizer == "sgd":
            bad = (w > 0) != (arrays[f"latent{j}"] >= 0)
            why = "w must be +1 exactly where latent >= 0"
        elif h.optimizer == "iir":
            g = arrays[f"g{j}"]
            bad = ((g > 0) & (w > 0)) | ((g < 0) & (w < 0))
            why = "w must be -sign(g) where g != 0"
        else:
            continue
        if bad.any():
            at = _where(w, bad)
            other = "latent" if h.optimizer == "sgd" else "g"
            raise StateError(f"w{j}{at} = {int(w[bad].flat[0])} does not match {other}{j}{at} = "
                             f"{int(arrays[other + str(j)][bad].flat[0])} ({why})")
