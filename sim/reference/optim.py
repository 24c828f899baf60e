"""Weight and parameter optimisers of the float reference.

Two families of weight optimiser share one interface, :class:`WeightOptimizer`:

* **Latent-weight** optimisers keep a float weight per binary weight; the
  forward pass uses its sign.  ``adam`` (Kingma & Ba, bias-corrected) and
  ``sgdm`` (heavy-ball momentum with decoupled weight decay).  Latent weights
  start Glorot-uniform (as in Wang et al.) and are clipped to
  ``[-optimizer.clip, optimizer.clip]`` after every update.
* **Latent-free** optimisers store the binary weights (or something whose
  sign is the binary weight) plus a little per-weight state: ``bop``
  (Helwegen et al. 2019), ``iir`` (Quist's second-order gradient filter) and
  ``switch`` (Akesson's switching family).

Conventions shared by every optimiser
-------------------------------------
``grads``
    One array per weight layer, the shape of the weights.  With
    ``approx.dw == "float"`` pass the raw dW.  With ``approx.dw == "bool"``
    pass ``sign(dW) / sqrt(fan_in)`` (values in {-s, 0, +s}, Algorithm 2
    line 18 of Wang et al.); the optimisers do no scaling of their own.
    The switch modes ``accumulate`` and ``per_image`` only use signs, the
    others use magnitudes too.
``lr``
    The learning rate of this step after the caller's schedule.  Adam and
    SGDM use it directly.  The latent-free optimisers have no learning rate
    of their own; they take ``beta = lr / lr0`` (``lr0 = cfg.lr``, the
    initial rate) as the schedule multiplier of their rate-like
    hyperparameter: Bop's ``gamma`` and the switch family's ``lam`` are
    multiplied by ``beta``.  ``iir`` ignores ``lr``.
``progress``
    Fraction of training done, 0..1.  Only ``iir`` uses it, for its alpha
    decay (``optimizer.iir.alpha_decay``): none -> 1, cosine ->
    (1 + cos(pi p)) / 2, linear -> 1 - p, step -> ``decay_factor ** k`` with
    ``k = floor(p * train.epochs / decay_every)``.
``per_image``
    Only for ``switch`` mode ``per_image`` (Akesson's Network VIII): a list
    with one callable per weight layer; each call returns an iterable of
    per-image raw float dW arrays.  ``grads`` is not used in that mode (may
    be ``None``).
Storage
    Every stored float (latent weights, moments, filter states) is rounded to
    ``approx.storage`` with :func:`sim.reference.storage.to_storage` after
    every update and kept as a float32 array holding representable values.
    Integer sign accumulators are int16, binary weights and random tie signs
    are int8 (+-1).
Randomness
    Only from the ``numpy.random.Generator`` given to the factory: the
    initial weights (in layer order) and, for the stochastic switch modes,
    one uniform draw per weight of a layer whose switch probabilities are
    not all zero.
Undo
    ``snapshot()`` copies all state; ``restore(snap)`` puts back what the
    forward pass sees (the latent weights, the binary weights, or for
    ``iir`` the filter output), optionally only for some layers, and keeps
    the optimiser state (moments, filters, accumulators), as Akesson's undo
    function reverts the weights only.  ``restore(snap, include_state=True)``
    puts back everything.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .storage import to_storage

__all__ = [
    "WeightOptimizer",
    "AdamWeights",
    "SGDMWeights",
    "BopWeights",
    "IIRWeights",
    "SwitchWeights",
    "ParamOptimizer",
    "make_weight_optimizer",
    "make_param_optimizer",
    "glorot_limit",
    "iir_beta",
    "switch_probability",
]


# ---------------------------------------------------------------------------
# Helpers


def glorot_limit(shape: tuple) -> float:
    """Bound of Glorot & Bengio's uniform initialisation for a weight of ``shape``.

    Dense weights are (in, out); conv weights are (out_c, in_c, k, k), whose
    fans count the kernel window: fan_in = in_c k k, fan_out = out_c k k.
    """
    if len(shape) == 2:
        fan_in, fan_out = shape
    elif len(shape) == 4:
        window = shape[2] * shape[3]
        fan_in, fan_out = shape[1] * window, shape[0] * window
    else:
        raise ValueError(f"weight shape {shape!r}: expected (in, out) or (out_c, in_c, k, k)")
    return math.sqrt(6.0 / (fan_in + fan_out))


def iir_beta(progress: float, decay: str, *, epochs: int = 1, factor: float = 0.1, every: int = 1) -> float:
    """Alpha-decay multiplier beta of Quist's filter at ``progress`` (0..1) of training."""
    p = min(max(float(progress), 0.0), 1.0)
    if decay == "none":
        return 1.0
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if decay == "linear":
        return 1.0 - p
    if decay == "step":
        # The tiny offset keeps e.g. progress = 10/50 from landing just below epoch 10.
        return factor ** math.floor(p * epochs / every + 1e-9)
    raise ValueError(f"optimizer.iir.alpha_decay = {decay!r}; allowed: none, cosine, linear, step")


def switch_probability(p: np.ndarray, sigma: float, lam: float) -> np.ndarray:
    """Switch probabilities of Akesson's Algorithm 2 from ``p = W * g``.

    The thesis writes ``p <- lam (p - sigma) / (1 - sigma)`` after taking
    ``rho = max(p)``; ``sigma`` is a fraction of ``rho`` (the text: "as the
    elements of p vary linearly from sigma rho to rho the switch probability
    varies linearly from 0 to lam"), so the formula applies to ``p / rho``.
    Nothing switches when no element of ``p`` is positive.
    """
    p = np.asarray(p, dtype=np.float64)
    rho = float(p.max()) if p.size else 0.0
    if rho <= 0.0:
        return np.zeros(p.shape)
    return np.clip(lam * (p / rho - sigma) / (1.0 - sigma), 0.0, 1.0)


def _sign_with_tie(x: np.ndarray, tie) -> np.ndarray:
    """+1 / -1 as float32; where ``x == 0`` the value of ``tie`` (+1 when ``tie`` is None)."""
    tie_val = np.float32(1.0) if tie is None else tie.astype(np.float32)
    return np.where(x > 0, np.float32(1.0), np.where(x < 0, np.float32(-1.0), tie_val)).astype(np.float32)


def _random_signs(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return np.where(rng.random(shape) < 0.5, -1, 1).astype(np.int8)


def _check_grads(grads, shapes, what="grads") -> list[np.ndarray]:
    if grads is None or len(grads) != len(shapes):
        n = "None" if grads is None else len(grads)
        raise ValueError(f"{what}: expected {len(shapes)} arrays (one per weight layer), got {n}")
    out = []
    for i, (g, s) in enumerate(zip(grads, shapes, strict=True)):
        g = np.asarray(g, dtype=np.float32)
        if g.shape != s:
            raise ValueError(f"{what}[{i}]: shape {g.shape} does not match the weight shape {s}")
        out.append(g)
    return out


# ---------------------------------------------------------------------------
# The interface


class WeightOptimizer:
    """Owns the binary weights of every layer and updates them from dW.

    Subclasses fill ``self._state`` (name -> one array per layer) and define
    ``_update`` and ``binary_weights``; ``_weight_keys`` names the entries
    the forward pass depends on (what an undo puts back).
    """

    name = "base"
    _weight_keys: tuple = ()

    def __init__(self, cfg, shapes: list[tuple], rng: np.random.Generator):
        if not isinstance(rng, np.random.Generator):
            raise TypeError("rng must be a numpy.random.Generator (np.random.default_rng(seed))")
        self.cfg = cfg
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.storage = cfg.approx.storage
        self.lr0 = float(cfg.lr)
        self._rng = rng
        self._state: dict[str, list[np.ndarray]] = {}
        self.steps = 0  # updates done (Adam's bias-correction counter)

    # -- interface ------------------------------------------------------------
    @property
    def latent_free(self) -> bool:
        return True

    def binary_weights(self) -> list[np.ndarray]:
        """+-1 float32 arrays, one per layer, for the forward pass (fresh copies)."""
        raise NotImplementedError

    def step(self, grads, *, lr: float, progress: float, per_image=None) -> list[int]:
        """Apply one update; returns the number of binary weights that changed sign, per layer."""
        before = self.binary_weights()
        self.steps += 1
        self._update(grads, float(lr), float(progress), per_image)
        after = self.binary_weights()
        return [int(np.count_nonzero(a != b)) for a, b in zip(after, before, strict=True)]

    def snapshot(self) -> object:
        """A deep copy of all state, for :meth:`restore`."""
        return {"steps": self.steps, "state": copy.deepcopy(self._state)}

    def restore(self, snap, layers=None, *, include_state: bool = False) -> None:
        """Undo: put back the weights of ``layers`` (all when None) as they were at ``snap``.

        With ``include_state`` also the optimiser state (and the step counter).
        """
        idx = range(len(self.shapes)) if layers is None else list(layers)
        keys = list(self._state) if include_state else [k for k in self._weight_keys if k in self._state]
        for k in keys:
            for i in idx:
                self._state[k][i] = snap["state"][k][i].copy()
        if include_state:
            self.steps = snap["steps"]

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        """Copies of all per-weight state arrays (float32 in storage precision, int16, or int8 signs)."""
        return {k: [a.copy() for a in v] for k, v in self._state.items()}

    def load_state_arrays(self, arrays: dict[str, list[np.ndarray]], steps: int | None = None) -> None:
        """Inverse of :meth:`state_arrays` (checkpoint restore)."""
        for k, v in arrays.items():
            if k not in self._state:
                raise ValueError(f"state {k!r} is not kept by the {self.name} optimiser; known: {sorted(self._state)}")
            if len(v) != len(self.shapes):
                raise ValueError(f"state {k!r}: expected {len(self.shapes)} arrays, got {len(v)}")
            for i, a in enumerate(v):
                a = np.asarray(a)
                if a.shape != self.shapes[i]:
                    raise ValueError(f"state {k!r}[{i}]: shape {a.shape} does not match weight shape {self.shapes[i]}")
                self._state[k][i] = a.astype(self._state[k][i].dtype, copy=True)
        if steps is not None:
            self.steps = int(steps)

    # -- helpers ----------------------------------------------------------------
    def _store(self, x) -> np.ndarray:
        return to_storage(x, self.storage)

    def _beta(self, lr: float) -> float:
        """Schedule multiplier lr / lr0 for the latent-free optimisers' rate hyperparameters."""
        return lr / self.lr0

    def _update(self, grads, lr, progress, per_image) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------
# Latent-weight optimisers


class _LatentWeights(WeightOptimizer):
    _weight_keys = ("latent",)

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self.clip = float(cfg.optimizer.clip)
        latent = []
        for s in self.shapes:
            lim = glorot_limit(s)
            w = rng.uniform(-lim, lim, size=s).astype(np.float32)
            latent.append(self._store(np.clip(w, -self.clip, self.clip)))
        self._state["latent"] = latent

    @property
    def latent_free(self) -> bool:
        return False

    def binary_weights(self) -> list[np.ndarray]:
        ties = self._state.get("tie_sign")
        return [_sign_with_tie(w, None if ties is None else ties[i]) for i, w in enumerate(self._state["latent"])]

    def zero_init(self, tie_signs: list[np.ndarray] | None = None) -> None:
        """Quist's magnitude-free start: latent weights 0, sign taken from ``tie_signs`` where a weight is 0.

        ``tie_signs`` (+-1 per weight) default to fresh random signs from the optimiser's generator.
        """
        if tie_signs is None:
            tie_signs = [_random_signs(self._rng, s) for s in self.shapes]
        ties = []
        for i, (t, s) in enumerate(zip(tie_signs, self.shapes, strict=True)):
            t = np.asarray(t)
            if t.shape != s or not np.all(np.abs(t) == 1):
                raise ValueError(f"tie_signs[{i}]: expected +-1 values of shape {s}")
            ties.append(t.astype(np.int8))
        self._state["latent"] = [np.zeros(s, np.float32) for s in self.shapes]
        self._state["tie_sign"] = ties

    def _finish(self, w: np.ndarray) -> np.ndarray:
        return self._store(np.clip(w, -self.clip, self.clip))


class AdamWeights(_LatentWeights):
    """Adam (Kingma & Ba 2015, bias-corrected) on clipped latent weights."""

    name = "adam"

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self._state["m"] = [np.zeros(s, np.float32) for s in self.shapes]
        self._state["v"] = [np.zeros(s, np.float32) for s in self.shapes]

    def _update(self, grads, lr, progress, per_image):
        grads = _check_grads(grads, self.shapes)
        a = self.cfg.optimizer.adam
        c1 = 1.0 - a.beta1**self.steps
        c2 = 1.0 - a.beta2**self.steps
        st = self._state
        for i, g in enumerate(grads):
            m = st["m"][i] = self._store(a.beta1 * st["m"][i] + (1.0 - a.beta1) * g)
            v = st["v"][i] = self._store(a.beta2 * st["v"][i] + (1.0 - a.beta2) * (g * g))
            step = (m / np.float32(c1)) / (np.sqrt(v / np.float32(c2)) + np.float32(self.cfg.adam_eps))
            st["latent"][i] = self._finish(st["latent"][i] - np.float32(lr) * step)


class SGDMWeights(_LatentWeights):
    """SGD with heavy-ball momentum and decoupled weight decay on clipped latent weights.

    ``buf <- mu buf + g``; ``w <- w - lr (buf + wd w)`` — weight decay acts
    on the weight directly, outside the momentum, as in Quist's Eq 3.
    """

    name = "sgdm"

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self._state["momentum"] = [np.zeros(s, np.float32) for s in self.shapes]

    def _update(self, grads, lr, progress, per_image):
        grads = _check_grads(grads, self.shapes)
        c = self.cfg.optimizer.sgdm
        st = self._state
        for i, g in enumerate(grads):
            buf = st["momentum"][i] = self._store(c.momentum * st["momentum"][i] + g)
            w = st["latent"][i]
            st["latent"][i] = self._finish(w - np.float32(lr) * (buf + np.float32(c.weight_decay) * w))


# ---------------------------------------------------------------------------
# Latent-free optimisers


class BopWeights(WeightOptimizer):
    """Bop (Helwegen et al. 2019): flip where the gradient EMA is strong and agrees with the weight.

    ``m <- (1 - gamma) m + gamma g``; ``w <- -w`` where ``|m| > tau`` and
    ``sign(m) == sign(w)``.  ``gamma`` follows the caller's schedule as
    ``bop.gamma * lr / lr0`` (capped at 1).
    """

    name = "bop"
    _weight_keys = ("weights",)

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self._state["weights"] = [_random_signs(rng, s) for s in self.shapes]
        self._state["m"] = [np.zeros(s, np.float32) for s in self.shapes]

    def binary_weights(self):
        return [w.astype(np.float32) for w in self._state["weights"]]

    def _update(self, grads, lr, progress, per_image):
        grads = _check_grads(grads, self.shapes)
        c = self.cfg.optimizer.bop
        gamma = min(c.gamma * self._beta(lr), 1.0)
        st = self._state
        for i, g in enumerate(grads):
            m = st["m"][i] = self._store((1.0 - gamma) * st["m"][i] + gamma * g)
            w = st["weights"][i]
            flip = (np.abs(m) > c.tau) & (m * w > 0)
            st["weights"][i] = np.where(flip, -w, w).astype(np.int8)


class IIRWeights(WeightOptimizer):
    """Quist's latent-weight-free optimiser: two cascaded EMAs of the gradient (Eqs 12-14).

    ``m <- (1 - gamma) m + gamma g``; ``y <- (1 - beta alpha) y + beta alpha m``;
    binary weight ``= -sign(y)``, and the random initial sign where ``y == 0``.
    Both states start at 0.  For constant beta this cascade is the 2nd-order
    IIR filter of Eq 18; with a varying beta the cascade is the exact
    rewrite of SGD with momentum and weight decay (Eq 18 assumes beta fixed).
    beta comes from ``progress`` (see :func:`iir_beta`); ``lr`` is ignored.
    """

    name = "iir"
    _weight_keys = ("y",)

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self._state["init_sign"] = [_random_signs(rng, s) for s in self.shapes]
        self._state["m"] = [np.zeros(s, np.float32) for s in self.shapes]
        self._state["y"] = [np.zeros(s, np.float32) for s in self.shapes]

    def beta(self, progress: float) -> float:
        c = self.cfg.optimizer.iir
        return iir_beta(progress, c.alpha_decay, epochs=self.cfg.train.epochs, factor=c.decay_factor,
                        every=c.decay_every)

    def binary_weights(self):
        return [_sign_with_tie(-y, s) for y, s in zip(self._state["y"], self._state["init_sign"], strict=True)]

    def _update(self, grads, lr, progress, per_image):
        grads = _check_grads(grads, self.shapes)
        c = self.cfg.optimizer.iir
        a = c.alpha * self.beta(progress)
        st = self._state
        for i, g in enumerate(grads):
            m = st["m"][i] = self._store((1.0 - c.gamma) * st["m"][i] + c.gamma * g)
            st["y"][i] = self._store((1.0 - a) * st["y"][i] + a * m)


class SwitchWeights(WeightOptimizer):
    """Akesson's switching family on binary weights (seed 004), ``optimizer.switch.mode``:

    * ``deterministic`` (Algorithm 1, Networks III/IV): ``p = W * g``; switch
      every weight with ``p > 0`` and ``p >= sigma * max(p)``.
    * ``stochastic`` (Algorithm 2, Network V): switch with probability
      ``clip(lam (p / max(p) - sigma) / (1 - sigma), 0, 1)`` (see
      :func:`switch_probability`).
    * ``momentum`` (Network VI): Algorithm 2 on ``m <- mu m + (1 - mu) g``.
    * ``accumulate`` (Network VII): Algorithm 2 on an int16 counter
      ``a <- clip(a + sign(g), -C, C)``.
    * ``per_image`` (Network VIII): the counter adds, image by image,
      ``sign(g_n)`` where Algorithm 1 with ``sigma'`` in place of ``sigma``
      selects the entry: ``p_n = W * g_n > 0`` and ``p_n >= sigma' max(p_n)``
      (only gradients that point towards a switch are counted, as the thesis
      says sigma' replaces sigma in Algorithm 1; saturating after every
      image); then Algorithm 2 on the counter.

    ``lam`` follows the caller's schedule as ``lam * lr / lr0``.  Counters are
    not cleared by a switch: after a flip ``W * a`` is negative, so the weight
    stays until the counter changes sign.  The undo function is the caller's
    (``snapshot`` / ``restore``; :meth:`sim.reference.model.BNNModel.train_step`
    with ``optimizer.switch.undo``).
    """

    name = "switch"
    _weight_keys = ("weights",)

    def __init__(self, cfg, shapes, rng):
        super().__init__(cfg, shapes, rng)
        self.mode = cfg.optimizer.switch.mode
        self._state["weights"] = [_random_signs(rng, s) for s in self.shapes]
        if self.mode == "momentum":
            self._state["momentum"] = [np.zeros(s, np.float32) for s in self.shapes]
        elif self.mode in ("accumulate", "per_image"):
            self._state["acc"] = [np.zeros(s, np.int16) for s in self.shapes]

    def binary_weights(self):
        return [w.astype(np.float32) for w in self._state["weights"]]

    def _saturate(self, x: np.ndarray) -> np.ndarray:
        cut = self.cfg.optimizer.switch.acc_cutoff
        return np.clip(x, -cut, cut).astype(np.int16)

    def _proxies(self, grads, per_image) -> list[np.ndarray]:
        """What Algorithm 1/2 multiply with W: the gradient, its momentum, or the sign counter."""
        c = self.cfg.optimizer.switch
        st = self._state
        if self.mode == "per_image":
            if per_image is None or len(per_image) != len(self.shapes):
                raise ValueError("switch mode 'per_image' needs per_image: one callable per weight layer")
            for i, source in enumerate(per_image):
                acc = st["acc"][i].astype(np.int32)
                w = st["weights"][i].astype(np.float32)
                for g in source():
                    g = np.asarray(g, dtype=np.float32)
                    if g.shape != self.shapes[i]:
                        raise ValueError(f"per_image[{i}]: gradient shape {g.shape} != weight shape {self.shapes[i]}")
                    p = w * g  # Algorithm 1: positive where the gradient points towards a switch
                    top = float(p.max()) if p.size else 0.0
                    if top <= 0.0:
                        continue
                    keep = p >= c.sigma_prime * top
                    acc = np.clip(acc + np.where(keep, np.sign(g), 0).astype(np.int32),
                                  -c.acc_cutoff, c.acc_cutoff)
                st["acc"][i] = acc.astype(np.int16)
            return st["acc"]
        grads = _check_grads(grads, self.shapes)
        if self.mode in ("deterministic", "stochastic"):
            return grads
        if self.mode == "momentum":
            for i, g in enumerate(grads):
                st["momentum"][i] = self._store(c.momentum * st["momentum"][i] + (1.0 - c.momentum) * g)
            return st["momentum"]
        # accumulate
        for i, g in enumerate(grads):
            st["acc"][i] = self._saturate(st["acc"][i].astype(np.int32) + np.sign(g).astype(np.int32))
        return st["acc"]

    def _update(self, grads, lr, progress, per_image):
        c = self.cfg.optimizer.switch
        proxies = self._proxies(grads, per_image)
        lam = c.lam * self._beta(lr)
        st = self._state
        for i, q in enumerate(proxies):
            w = st["weights"][i]
            p = w.astype(np.float32) * q.astype(np.float32)
            if self.mode == "deterministic":
                rho = float(p.max()) if p.size else 0.0
                flip = (p > 0) & (p >= c.sigma * rho) if rho > 0 else np.zeros(p.shape, bool)
            else:
                prob = switch_probability(p, c.sigma, lam)
                if not prob.any():
                    continue
                flip = self._rng.random(p.shape) < prob
            st["weights"][i] = np.where(flip, -w, w).astype(np.int8)


_WEIGHT_OPTIMIZERS = {
    "adam": AdamWeights,
    "sgdm": SGDMWeights,
    "bop": BopWeights,
    "iir": IIRWeights,
    "switch": SwitchWeights,
}


def make_weight_optimizer(cfg, shapes: list[tuple], rng: np.random.Generator) -> WeightOptimizer:
    """The weight optimiser named by ``cfg.optimizer.name`` for weights of ``shapes``."""
    name = cfg.optimizer.name
    if name not in _WEIGHT_OPTIMIZERS:
        raise ValueError(f"optimizer.name = {name!r}; allowed: {', '.join(_WEIGHT_OPTIMIZERS)}")
    return _WEIGHT_OPTIMIZERS[name](cfg, shapes, rng)


# ---------------------------------------------------------------------------
# Float parameters (batch-norm biases)


class ParamOptimizer:
    """Adam or SGD with momentum on float parameters, updated in place.

    Used for the batch-norm biases (beta).  Parameters and state are rounded
    to ``approx.storage``; there is neither clipping nor weight decay (Quist
    applies weight decay to non-BN parameters only).  SGD uses heavy-ball
    momentum, ``buf <- mu buf + g; p <- p - lr buf``.
    """

    def __init__(self, cfg, shapes, which: str):
        if which not in ("adam", "sgdm"):
            raise ValueError(f"parameter optimiser {which!r}; allowed: adam, sgdm")
        self.cfg = cfg
        self.which = which
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.storage = cfg.approx.storage
        self.steps = 0
        keys = ("m", "v") if which == "adam" else ("momentum",)
        self._state = {k: [np.zeros(s, np.float32) for s in self.shapes] for k in keys}

    def step(self, params: list[np.ndarray], grads: list[np.ndarray], *, lr: float) -> None:
        if len(params) != len(self.shapes):
            raise ValueError(f"params: expected {len(self.shapes)} arrays, got {len(params)}")
        grads = _check_grads(grads, self.shapes)
        self.steps += 1
        st = self._state
        lr32 = np.float32(lr)
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if p.shape != self.shapes[i]:
                raise ValueError(f"params[{i}]: shape {p.shape} does not match {self.shapes[i]}")
            if self.which == "adam":
                a = self.cfg.optimizer.adam
                m = st["m"][i] = to_storage(a.beta1 * st["m"][i] + (1.0 - a.beta1) * g, self.storage)
                v = st["v"][i] = to_storage(a.beta2 * st["v"][i] + (1.0 - a.beta2) * (g * g), self.storage)
                c1 = np.float32(1.0 - a.beta1**self.steps)
                c2 = np.float32(1.0 - a.beta2**self.steps)
                upd = (m / c1) / (np.sqrt(v / c2) + np.float32(self.cfg.adam_eps))
            else:
                mu = self.cfg.optimizer.sgdm.momentum
                upd = st["momentum"][i] = to_storage(mu * st["momentum"][i] + g, self.storage)
            p[...] = to_storage(p.astype(np.float32) - lr32 * upd, self.storage)

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        return {k: [a.copy() for a in v] for k, v in self._state.items()}

    def load_state_arrays(self, arrays: dict[str, list[np.ndarray]], steps: int | None = None) -> None:
        for k, v in arrays.items():
            if k not in self._state:
                raise ValueError(f"state {k!r} is not kept by the {self.which} parameter optimiser")
            self._state[k] = [np.asarray(a, dtype=np.float32).copy() for a in v]
        if steps is not None:
            self.steps = int(steps)


def make_param_optimizer(cfg, shapes, which: str) -> ParamOptimizer:
    """Optimiser for float parameters of ``shapes``; ``which`` is ``"adam"`` or ``"sgdm"``."""
    return ParamOptimizer(cfg, shapes, which)
