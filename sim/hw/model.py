"""The bit-exact model of the accelerator's training step (docs/arithmetic.md).

:class:`HwModel` holds exactly the on-chip state (binary weights, optimiser state, BN
biases and their momentum, running BN statistics, RNG states) and runs
:meth:`HwModel.train_step` / :meth:`HwModel.evaluate` with the integer functions of
:mod:`sim.hw.arith` and :mod:`sim.hw.optim`. Only dense layers with batch norm are
modelled (the paper's MLP); other topologies are rejected with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..schema import ConfigError
from . import arith as A
from . import optim as O
from .rng import RngBank
from .widths import layer_bounds

__all__ = ["HwModel", "StepTrace"]


@dataclass
class StepTrace:
    """Everything one training step produced, per layer (for RTL read-back comparisons and tests)."""

    y: list = field(default_factory=list)
    bn: list = field(default_factory=list)  # A.BnForward
    logits_q: np.ndarray | None = None
    grad_q: np.ndarray | None = None
    q: list = field(default_factory=list)  # BN backward Q per layer (top first)
    codes: list = field(default_factory=list)  # A.Po2Codes per layer (top first)
    dw_sign: list = field(default_factory=list)  # sign(dW) per layer (top first)
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
        shapes = cfg.layer_shapes()
        for s in shapes:
            if s.spec.type != "dense":
                raise ConfigError(
                    f"model.layers[{s.index}]: the hardware model supports dense layers only (got {s.spec.type!r})"
                )
            if not s.spec.bn:
                raise ConfigError(f"model.layers[{s.index}].bn = false: the hardware model needs BN on every layer")
        self.layers = cfg.weight_layers()
        self.input_kind = self.h.input_kind(cfg)
        self.x_max = [128 if (j == 0 and self.input_kind == "int8") else 1 for j in range(len(self.layers))]
        self.bounds = layer_bounds(cfg)
        self.wshapes = [tuple(s.weight_shape) for s in self.layers]
        self.n_weights = int(sum(n * m for n, m in self.wshapes))
        self.lr0 = float(cfg.lr)
        self.total_epochs = int(cfg.train.epochs)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Power-on state: weights drawn from the generators (one sweep), everything else zero."""
        h, p = self.h, self.p
        self.rng = RngBank(self.wshapes, h.rng_seed, h.rng_block)
        u0 = self.rng.sweep()
        self.w = [np.where(u < np.uint32(1 << 31), 1, -1).astype(np.int8) for u in u0]
        m = [s.out_channels for s in self.layers]
        self.beta = [np.zeros(c, dtype=np.int64) for c in m]
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

    def state_dict(self) -> dict[str, np.ndarray]:
        """All on-chip state as named arrays (weights as int8 +-1)."""
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

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        self.steps = int(d["steps"])
        self.rng.set_state(d["rng"])
        for j in range(len(self.layers)):
            self.w[j] = np.asarray(d[f"w{j}"], dtype=np.int8).copy()
            self.beta[j] = np.asarray(d[f"beta{j}"], dtype=np.int64).copy()
            self.m_beta[j] = np.asarray(d[f"m_beta{j}"], dtype=np.int64).copy()
            self.a_beta[j] = np.asarray(d[f"a_beta{j}"], dtype=np.int64).copy()
            self.e_beta[j] = int(d[f"e_beta{j}"])
            self.mu_r[j] = np.asarray(d[f"mu_r{j}"], dtype=np.int64).copy()
            self.s_r[j] = np.asarray(d[f"s_r{j}"], dtype=np.int64).copy()
            for key, arrs in self.opt.items():
                arrs[j] = np.asarray(d[f"{key}{j}"], dtype=arrs[j].dtype).copy()

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
            y = A.xnor_popcount(cur, w[j], self.x_max[j])
            fwd = A.bn_forward(y, self.beta[j], p, self.bounds[j].y)
            trace.y.append(y)
            trace.bn.append(fwd)
            saved.append((cur, fwd, y))
            if j == L - 1:
                logits = A.output_logits(y, fwd, p)
            else:
                cur = fwd.x_hat
        return saved, logits

    def forward_eval(self, x: np.ndarray) -> np.ndarray:
        p = self.p
        cur = np.asarray(x)
        L = len(self.layers)
        for j in range(L):
            y = A.xnor_popcount(cur, self.w[j], self.x_max[j])
            if j == L - 1:
                return A.output_logits_eval(y, self.beta[j], self.mu_r[j], self.s_r[j], p)
            cur = A.bn_forward_eval(y, self.beta[j], self.mu_r[j], self.s_r[j], p, self.bounds[j].y)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ step
    def train_step(self, x: np.ndarray, labels: np.ndarray, *, lr: float, progress: float = 0.0) -> StepTrace:
        """Forward, backward and update on one batch (the accelerator's step); returns the trace."""
        p, h = self.p, self.h
        trace = StepTrace()
        saved, logits = self.forward_train(x, trace)
        for j, (_, fwd, _) in enumerate(saved):
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
            xin, fwd, _ = saved[j]
            q, p1 = A.bn_backward(dx, fwd.x_hat, fwd.alpha_q, p)
            codes = A.po2_quantise(q, fwd.S_eff, scale, p, times_batch=not top)
            top = False
            dw = A.po2_backward_dw(xin, codes, p, self.x_max[j])
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
                dX, scale = A.po2_backward_dx(codes, self.w[j], p)
                dx = dX * saved[j - 1][1].mask
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
        us = self.rng.sweep()
        flips = 0
        if h.optimizer == "switch":
            table = O.switch_table(h.switch_cutoff, h.switch_sigma, h.switch_lambda)
            gate = O.switch_gate(ratio)
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
