"""The float reference BNN: Algorithm 1 (standard) and Algorithm 2 (proposed) of Wang et al.

:class:`BNNModel` is built from ``cfg.layer_shapes()``. Every dense / conv layer
multiplies its binary input by its binary weights (``Y = X_hat W_hat``), batch
normalises ``Y`` per output channel when ``spec.bn`` is set (learnable bias
``beta``, no scale: it would not change a sign) and hands the result to the next
layer, which binarises it. A maxpool layer pools the batch-normalised values
*before* the sign::

    conv -> BN -> maxpool -> sign -> next layer

Pooling before or after the sign gives the same forward pass, because ``sign`` is
monotone non-decreasing: ``max_i sign(x_i) = sign(max_i x_i)``. Pooling first is
cheaper (one sign per pooled value, not per input) and gives the straight-through
estimator one well-defined pre-activation per binary output: its mask
``|x| <= 1`` is taken at the pooled maximum and the gradient goes back to the
arg-max position only.

A maxpool with ``before_bn = true`` pools the conv layer's ``Y`` instead, as
BinaryNet does::

    conv -> maxpool -> BN -> sign -> next layer

BN's statistics are then those of the pooled values the sign sees (so its bias
starts at 0, not at ``ops.pooled_bn_beta``); the BN backward runs over the pooled
positions and ``dY`` (after its quantisation) goes to each window's first maximum.

Which variant runs is set by ``cfg.approx`` (each switch on its own, so the
ablation of Table 4 is any combination):

``bn``
    ``l2`` (Algorithm 1 lines 6 and 10-11), ``l1`` (the l1 forward pass of
    Algorithm 2 line 6 with the *exact* gradient of that forward pass, not an
    equation of the paper: see ``ops.bn_backward``) or ``l1_bnn`` (Algorithm 2
    lines 6-7 and 10-11). For the l1 kinds a channel whose batch values are all
    equal (l1 scale ``s = 0``) outputs ``beta`` and passes no gradient (``dY = 0``;
    docs/arithmetic.md section 5.1). Per layer the model retains between the
    forward and the backward pass only what the chosen variant needs: for
    ``l1_bnn`` the binary activations, the 1-bit straight-through mask and a few
    per-channel numbers (``alpha``, mean, scale); ``l2`` and ``l1`` keep the
    full-precision BN output, as Algorithm 1 does.
``storage``
    every retained variable (pre-activations ``Y``, BN outputs, ``dX``, BN
    statistics, biases) is rounded to this format with
    :func:`sim.reference.storage.to_storage`.
``dy`` / ``dy_bits``
    ``dY`` is quantised right after the BN backward pass (Algorithm 2 line 13),
    before it is used for ``dX = dY W^T`` and ``dW = X_hat^T dY``.
``dw``
    ``float``: the optimiser sees ``dW``; ``bool``: it sees
    ``sign(dW) / sqrt(fan_in)`` (Algorithm 2 lines 16 and 18), or with
    ``cfg.e2train.psg`` the predictive sign gradient of E2-Train. A 1-bit
    gradient has no code for zero: an exactly-zero ``dW`` (rare, 0.01-0.1 % of
    the entries with po2 dY) counts as +1, the convention of
    :func:`sim.reference.ops.sign` (and of the authors' implementation), except
    in an output channel whose ``dY`` is 0 for every sample (a constant or fully
    masked channel): its weights get gradient 0.

The first layer's input follows ``cfg.model.input_format`` (real values for
``float``, as is standard BNN practice; +-1 for ``binary``); its input gradient
is never computed. The loss (``cfg.train.loss``) is taken on the output of the
last layer's batch norm. Running BN statistics (rate ``cfg.approx.bn_momentum``)
serve evaluation.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..config import Config
from . import ops
from .optim import make_param_optimizer, make_weight_optimizer
from .storage import to_storage

__all__ = ["BNNModel", "ForwardResult"]


class ForwardResult:
    """Output of a forward pass: logits and, in training mode, what the backward pass needs."""

    def __init__(self, logits: np.ndarray, saved: list[dict] | None):
        self.logits = logits
        self.saved = saved


class BNNModel:
    """A binary neural network trained with Algorithm 1 / 2 (see the module docstring)."""

    def __init__(self, cfg: Config, rng: np.random.Generator | None = None):
        self.cfg = cfg
        self.rng = rng if rng is not None else np.random.default_rng([cfg.train.seed, 0])
        self.shapes = cfg.layer_shapes()
        self.wlayers = [s for s in self.shapes if s.spec.has_weights]
        self.storage = cfg.approx.storage
        self.bn_kind = cfg.approx.bn
        self.eps = float(cfg.approx.bn_eps)
        self.momentum = float(cfg.approx.bn_momentum)
        self.n_weights = cfg.n_weights
        # Which weight layers are followed by batch norm, and their channel counts.
        self.bn_layers = [k for k, s in enumerate(self.wlayers) if s.spec.bn]
        self.wopt = make_weight_optimizer(cfg, [s.weight_shape for s in self.wlayers], self.rng)
        beta_shapes = [(self.wlayers[k].out_channels,) for k in self.bn_layers]
        # BN biases: the weight optimiser's family for adam / sgdm, else optimizer.beta_optimizer.
        which = cfg.optimizer.name if cfg.optimizer.name in ("adam", "sgdm") else cfg.optimizer.beta_optimizer
        self.popt = make_param_optimizer(cfg, beta_shapes, which) if beta_shapes else None
        self.beta = [np.zeros(s, dtype=np.float32) for s in beta_shapes]
        # A BN layer max-pooled before the sign starts with the bias that makes half the pooled signs +1
        # (ops.pooled_bn_beta; the bit-exact model starts from the same value in Q.beta_frac).
        pools = []  # per weight layer: the window of the maxpool after it (0: none)
        for sh in self.shapes:
            if sh.spec.has_weights:
                pools.append(0)
            elif pools:
                pools[-1] = sh.spec.pool
        # A maxpool with before_bn pools its conv layer's Y before the BN (conv -> maxpool -> BN -> sign):
        # per weight layer its window, and the maxpool layers so folded into the layer above.
        self.pool_first: dict[int, int] = {}
        self._fused_pools: set[int] = set()
        for prev, sh in zip(self.shapes, self.shapes[1:], strict=False):
            if sh.spec.type == "maxpool" and sh.spec.before_bn and prev.spec.type == "conv":
                self.pool_first[self.wlayers.index(prev)] = sh.spec.pool
                self._fused_pools.add(sh.index)
        for j, k in enumerate(self.bn_layers):
            if pools[k] > 1 and k not in self.pool_first:
                self.beta[j][:] = self._store(np.float32(ops.pooled_bn_beta(pools[k], self.bn_kind)))
        self.running_mu = [np.zeros(s, dtype=np.float32) for s in beta_shapes]
        self.running_scale = [np.ones(s, dtype=np.float32) for s in beta_shapes]
        self._bn_index = {k: i for i, k in enumerate(self.bn_layers)}
        self.last_psg_fraction: float | None = None
        # Akesson's Network VIII needs per-image gradients: keep (input, dY) of the step for them.
        self._per_image = cfg.optimizer.name == "switch" and cfg.optimizer.switch.mode == "per_image"
        self._pi_data: dict[int, tuple] = {}
        # Akesson's undo function (Networks IV-VIII): optimizer.switch.undo.
        self._undo = cfg.optimizer.name == "switch" and bool(cfg.optimizer.switch.undo)
        self.last_undone: list[int] = []  # weight layers whose update the last step reverted

    # ------------------------------------------------------------------ helpers
    def _store(self, x: np.ndarray) -> np.ndarray:
        return to_storage(x, self.storage)

    def _store_tree(self, cache):
        """Round the floating-point arrays of a cache to the storage format (others untouched)."""
        if isinstance(cache, dict):
            return {k: self._store_tree(v) for k, v in cache.items()}
        if isinstance(cache, np.ndarray) and cache.dtype.kind == "f":
            return self._store(cache)
        return cache

    def binary_weights(self) -> list[np.ndarray]:
        return self.wopt.binary_weights()

    # ------------------------------------------------------------------ forward
    def forward(self, x: np.ndarray, train: bool = True, wb: list[np.ndarray] | None = None) -> ForwardResult:
        """Forward pass on prepared input ``x`` ([B, C, H, W] or [B, N]).

        In training mode BN uses batch statistics (and updates the running ones) and the
        returned ``saved`` list holds, per layer, what the backward pass reads.
        ``wb``: the binary weights, when the caller already has them.
        """
        x = np.asarray(x, dtype=np.float32)
        B = x.shape[0]
        x = x.reshape((B, *self.cfg.model.input_shape))
        if wb is None:
            wb = self.wopt.binary_weights()
        saved: list[dict] = []
        cur = x  # the value flowing forward: the network input, then pre-sign activations
        at_input = True
        k = 0
        for s in self.shapes:
            rec: dict = {"type": s.spec.type, "index": s.index}
            if s.spec.type == "maxpool":
                if s.index in self._fused_pools:
                    continue  # pooled Y before its BN (conv layer above)
                rec["in_shape"] = cur.shape
                cur, pcache = ops.maxpool_forward(cur, s.spec.pool)
                rec["pool"] = pcache
                rec["at_input"] = at_input
                saved.append(rec)
                continue
            # Layer input: the network input (first layer) or the sign of the previous activations.
            if at_input:
                xin = cur
                rec["first"] = True
            else:
                xin = ops.sign(cur)
                if train:
                    rec["mask"] = ops.ste_mask(cur).astype(bool)  # 1 bit per activation
                rec["first"] = False
            w = wb[k].astype(np.float32, copy=False)
            if s.spec.type == "dense":
                flat = xin.reshape(B, -1)
                y = flat @ w
                if train:
                    rec["x_in"] = self._retain_input(flat, rec["first"])
            else:
                y, cols = ops.conv2d_forward(xin, w, s.spec.padding)
                if train:
                    rec["x_in"] = self._retain_input(cols, rec["first"])
                    rec["x_shape"] = xin.shape
            y = self._store(y)
            if k in self.pool_first:
                rec["pre_pool"] = (y.shape, self.pool_first[k])
                y, rec["pre_pool_idx"] = ops.maxpool_forward(y, self.pool_first[k])
            if s.spec.bn:
                j = self._bn_index[k]
                if train:
                    out, cache = ops.bn_forward(y, self.beta[j], self.bn_kind, self.eps)
                    self._update_running(j, cache)
                    rec["bn"] = self._retained_bn(cache)
                else:
                    out = ops.bn_forward_eval(
                        y, self.beta[j], self.bn_kind, self.running_mu[j], self.running_scale[j], self.eps
                    )
                out = self._store(out)
            else:
                out = y
            rec["k"] = k
            saved.append(rec)
            cur = out
            at_input = False
            k += 1
        logits = cur.reshape(B, -1)
        return ForwardResult(logits, saved if train else None)

    def _retain_input(self, a: np.ndarray, first: bool) -> np.ndarray:
        """Keep a layer input for dW: binary as int8 (+-1, and 0 at 'same' padding), a real first-layer input rounded.

        A conv layer keeps its im2col matrix (binary, so still int8).
        """
        if not first or self.cfg.model.input_format == "binary":
            return a.astype(np.int8)
        return self._store(a)

    def _retained_bn(self, cache: dict) -> dict:
        """What the BN backward pass needs, rounded to the storage format.

        For ``l1_bnn`` a full-precision BN output is *not* kept even if the op computed one:
        Algorithm 2 reads only its sign (binary, kept as int8) and per-channel numbers.
        """
        cache = dict(cache)
        if self.bn_kind == "l1_bnn":
            for key, v in list(cache.items()):
                if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.ndim > 1:
                    raise RuntimeError(
                        f"ops.bn_forward(kind='l1_bnn') cache entry {key!r} is a full-precision {v.shape} array; "
                        "Algorithm 2 must retain only binary activations and per-channel values"
                    )
        return self._store_tree(cache)

    def _update_running(self, j: int, cache: dict) -> None:
        m = self.momentum
        mu = np.asarray(cache["mu"], dtype=np.float32).reshape(-1)
        scale = np.asarray(cache["scale"], dtype=np.float32).reshape(-1)
        self.running_mu[j] = self._store((1 - m) * self.running_mu[j] + m * mu)
        self.running_scale[j] = self._store((1 - m) * self.running_scale[j] + m * scale)

    # ------------------------------------------------------------------ loss
    def loss(self, logits: np.ndarray, labels: np.ndarray):
        """(mean loss, dlogits, correct) per ``cfg.train.loss``."""
        if self.cfg.train.loss == "squared_hinge":
            return ops.squared_hinge(logits, labels)
        return ops.softmax_cross_entropy(logits, labels)

    # ------------------------------------------------------------------ backward
    def backward(self, dlogits: np.ndarray, saved: list[dict], wb: list[np.ndarray] | None = None):
        """Gradients of one step: (weight gradients as the optimiser wants them, beta gradients).

        ``wb`` must be the binary weights the forward pass used (fetched again when None).
        """
        a = self.cfg.approx
        if wb is None:
            wb = self.wopt.binary_weights()
        grads: list[np.ndarray | None] = [None] * len(self.wlayers)
        dbetas: list[np.ndarray | None] = [None] * len(self.bn_layers)
        psg_fracs = []
        g = self._store(np.asarray(dlogits, dtype=np.float32))
        B = g.shape[0]
        for rec in reversed(saved):
            if rec["type"] == "maxpool":
                if rec["at_input"]:
                    break  # pooling of the raw input: nothing upstream to train
                g = ops.maxpool_backward(g, rec["pool"], rec["in_shape"], self.shapes[rec["index"]].spec.pool)
                continue
            k = rec["k"]
            s = self.wlayers[k]
            pre = rec.get("pre_pool")
            if pre is not None:
                g = g.reshape((B, pre[0][1], pre[0][2] // pre[1], pre[0][3] // pre[1]))
            else:
                g = g.reshape((B, *s.out_shape))
            if s.spec.bn:
                j = self._bn_index[k]
                dy, dbeta = ops.bn_backward(g, rec["bn"], self.bn_kind)
                dbetas[j] = np.asarray(dbeta, dtype=np.float32).reshape(-1)
            else:
                dy = g
            dy = ops.quantise_dy(np.asarray(dy, dtype=np.float32), a.dy, a.dy_bits)  # Algorithm 2 line 13
            if pre is not None:
                dy = ops.maxpool_backward(dy, rec["pre_pool_idx"], pre[0], pre[1])
            xin = rec["x_in"].astype(np.float32)
            w = wb[k].astype(np.float32, copy=False)
            if self._per_image:
                self._pi_data[k] = (xin, dy)
            if s.spec.type == "dense":
                dy2 = dy.reshape(B, -1)
                if a.dw == "bool" and self.cfg.e2train.psg:
                    sdw, frac = ops.predictive_sign_grad(
                        xin, dy2, self.cfg.e2train.psg_msb_bits, self.cfg.e2train.psg_beta
                    )
                    psg_fracs.append(frac)
                    grads[k] = self._silent(np.asarray(sdw, dtype=np.float32) / math.sqrt(s.fan_in), dy, s)
                else:
                    dw = xin.T @ dy2
                    grads[k] = self._silent(self._weight_grad(dw, s), dy, s)
                if not rec["first"]:
                    dx = dy2 @ w.T
            else:
                if a.dw == "bool" and self.cfg.e2train.psg:
                    dyc = ops.conv_dy_matrix(dy)
                    sdw, frac = ops.predictive_sign_grad(
                        xin, dyc, self.cfg.e2train.psg_msb_bits, self.cfg.e2train.psg_beta
                    )
                    psg_fracs.append(frac)
                    grads[k] = self._silent(
                        np.asarray(sdw, dtype=np.float32).T.reshape(s.weight_shape) / math.sqrt(s.fan_in), dy, s
                    )
                    if not rec["first"]:
                        dx = ops.conv2d_backward_input(dy, w, rec["x_shape"], s.spec.padding)
                else:
                    if rec["first"]:
                        dw = ops.conv2d_backward_weight(dy, xin, w.shape)
                    else:
                        dx, dw = ops.conv2d_backward(dy, w, xin, rec["x_shape"], s.spec.padding)
                    grads[k] = self._silent(self._weight_grad(dw, s), dy, s)
            if rec["first"]:
                break
            # Straight-through estimator of the sign: pass the gradient where |x| <= 1.
            g = self._store(dx.reshape((B, *s.in_shape)) * rec["mask"])
        self.last_psg_fraction = float(np.mean(psg_fracs)) if psg_fracs else None
        return grads, dbetas

    def _per_image_sources(self, saved):
        """For switch mode ``per_image``: per layer, a callable yielding each image's raw dW."""
        if not self._per_image:
            return None
        sources = []
        for k, s in enumerate(self.wlayers):
            xin, dy = self._pi_data[k]

            def gen(xin=xin, dy=dy, s=s):
                for n in range(dy.shape[0]):
                    if s.spec.type == "dense":
                        yield np.outer(xin[n], dy[n].reshape(-1))
                    else:
                        yield self._conv_dw(dy[n : n + 1], self._image_cols(xin, n, dy.shape[0]), s)

            sources.append(gen)
        return sources

    @staticmethod
    def _image_cols(cols: np.ndarray, n: int, batch: int) -> np.ndarray:
        """Rows of the im2col matrix that belong to image ``n`` (rows are ordered image, row, column)."""
        per = cols.shape[0] // batch
        return cols[n * per : (n + 1) * per]

    @staticmethod
    def _conv_dw(dy: np.ndarray, cols: np.ndarray, s) -> np.ndarray:
        return ops.conv2d_backward_weight(dy, cols, s.weight_shape)

    def _silent(self, grad: np.ndarray, dy: np.ndarray, s) -> np.ndarray:
        """A 1-bit ``dW`` with zero for every output channel whose ``dY`` is 0 for all samples.

        Such a channel passes no gradient (a constant channel, see ``ops.bn_backward``, or one whose
        every ``dx`` was masked); the ``sign(0) = +1`` convention would otherwise push each of its
        weights by ``+1/sqrt(fan_in)``. The bit-exact model's ternary ``sgn(dW)`` is 0 there too.
        """
        if self.cfg.approx.dw != "bool":
            return grad
        silent = ~np.any(dy.reshape(dy.shape[0], dy.shape[1], -1) != 0, axis=(0, 2))
        if not silent.any():
            return grad
        axis = 1 if s.spec.type == "dense" else 0  # dense (in, out), conv (out_c, in_c, k, k)
        shape = [1] * grad.ndim
        shape[axis] = -1
        return np.where(silent.reshape(shape), np.float32(0), grad).astype(np.float32, copy=False)

    def _weight_grad(self, dw: np.ndarray, s) -> np.ndarray:
        dw = np.asarray(dw, dtype=np.float32).reshape(s.weight_shape)
        if self.cfg.approx.dw == "bool":
            return ops.sign(dw).astype(np.float32) / np.float32(math.sqrt(s.fan_in))  # Algorithm 2 lines 16, 18
        return self._store(dw)

    # ------------------------------------------------------------------ step
    def train_step(self, x: np.ndarray, y: np.ndarray, *, lr: float, progress: float = 0.0):
        """Forward, backward and update on one mini-batch: (mean loss, correct, flips).

        With ``optimizer.switch.undo`` the update is followed by Akesson's undo function
        (:meth:`_undo_layers`); ``flips`` then counts only the switches that were kept.
        """
        wb = self.wopt.binary_weights()
        fw = self.forward(x, train=True, wb=wb)
        loss, dlogits, correct = self.loss(fw.logits, y)
        grads, dbetas = self.backward(dlogits, fw.saved, wb)
        snap = self.wopt.snapshot() if self._undo else None
        flips = self.wopt.step(grads, lr=lr, progress=progress, per_image=self._per_image_sources(fw.saved))
        if self.popt is not None:
            self.popt.step(self.beta, dbetas, lr=lr)  # in place, rounded to the storage format
        if self._undo:
            self.last_undone = self._undo_layers(x, y, wb, snap, float(loss))
            flips = [0 if k in self.last_undone else f for k, f in enumerate(flips)]
        n_flips = int(sum(flips))
        return float(loss), int(correct), n_flips

    def _undo_layers(self, x, y, old_wb: list[np.ndarray], snap, loss0: float) -> list[int]:
        """Akesson's undo function, layer by layer (seed 004, Network IV: "applied separately to each layer").

        The batch is run forward again (training-mode BN, batch statistics; the running statistics are
        not touched) with the layers' new weights taken one layer at a time, first layer first: a layer's
        switches are kept when the batch loss with them (and with the layers kept so far) is not higher
        than without them, and reverted otherwise; ``loss0`` is the loss before the update. A reverted
        layer gets back exactly its binary weights of ``snap``; optimiser state (the switch counters) and
        the BN biases keep their update, as in Akesson's undo. Returns the reverted layers. (The hardware
        decides once for all layers: docs/arithmetic.md section 7.1.)
        """
        new_wb = self.wopt.binary_weights()
        cur = list(old_wb)
        cur_loss = loss0
        reverted = []
        for k in range(len(new_wb)):
            if np.array_equal(new_wb[k], old_wb[k]):
                continue
            trial = list(cur)
            trial[k] = new_wb[k]
            trial_loss = self._batch_loss(x, y, trial)
            if trial_loss > cur_loss:
                reverted.append(k)
            else:
                cur, cur_loss = trial, trial_loss
        if reverted:
            self.wopt.restore(snap, layers=reverted)
        return reverted

    def _batch_loss(self, x, y, wb: list[np.ndarray]) -> float:
        """Training-mode loss of a batch under binary weights ``wb``, leaving the running BN statistics as they were."""
        mu, sc = list(self.running_mu), list(self.running_scale)
        try:
            fw = self.forward(x, train=True, wb=wb)
        finally:
            self.running_mu, self.running_scale = mu, sc
        return float(self.loss(fw.logits, y)[0])

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        fw = self.forward(x, train=False)
        loss, _, correct = self.loss(fw.logits, y)
        return float(loss), int(correct)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything a resumed run needs, as named arrays.

        ``w{k}``: the binary weights (int8, derived from the optimiser state; checked, not read, on load);
        ``beta{k}``, ``running_mu{k}``, ``running_scale{k}`` per BN layer ``k``; ``opt_{name}{k}`` the weight
        optimiser's arrays and ``opt_steps`` its update count; ``beta_opt_{name}{k}`` / ``beta_opt_steps``
        the same for the BN biases; ``rng``: the model generator's state as JSON text (a 0-d string array).
        """
        out: dict[str, np.ndarray] = {}
        for k, w in enumerate(self.wopt.binary_weights()):
            out[f"w{k}"] = np.asarray(w, dtype=np.int8)
        for j, k in enumerate(self.bn_layers):
            out[f"beta{k}"] = self.beta[j].copy()
            out[f"running_mu{k}"] = self.running_mu[j].copy()
            out[f"running_scale{k}"] = self.running_scale[j].copy()
        for name, arrays in self.wopt.state_arrays().items():
            for k, arr in enumerate(arrays):
                out[f"opt_{name}{k}"] = np.asarray(arr)
        out["opt_steps"] = np.array(self.wopt.steps, dtype=np.int64)
        if self.popt is not None:
            for name, arrays in self.popt.state_arrays().items():
                for j, arr in enumerate(arrays):
                    out[f"beta_opt_{name}{self.bn_layers[j]}"] = np.asarray(arr)
            out["beta_opt_steps"] = np.array(self.popt.steps, dtype=np.int64)
        out["rng"] = np.array(json.dumps(self.rng.bit_generator.state))
        return out

    def load_state_dict(self, state) -> None:
        """Restore a :meth:`state_dict`. The whole state is checked first (the same keys, shapes and
        kinds as this model's own state, finite values, +-1 signs, a generator state of this model's
        kind); a ``ValueError`` names the first offending key and nothing is changed."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise ValueError(f"state lacks {missing[0]!r} (this configuration keeps: {', '.join(sorted(own))})")
        extra = sorted(k for k in state if k not in own)
        if extra:
            raise ValueError(f"state has {extra[0]!r}, which this configuration does not keep")
        arrays = {k: np.asarray(state[k]) for k in own}
        for k, ref in own.items():
            a = arrays[k]
            if k == "rng":
                continue
            if a.shape != ref.shape:
                raise ValueError(f"{k} has shape {a.shape}; this configuration needs {ref.shape}")
            if a.dtype.kind not in "fiu":
                raise ValueError(f"{k} has dtype {a.dtype}; expected numbers")
            if not np.isfinite(a).all():
                raise ValueError(f"{k} holds {a[~np.isfinite(a)].flat[0]} (not finite)")
            if ref.dtype.kind in "iu":
                info = np.iinfo(ref.dtype)
                if (a != np.round(a)).any() or a.min(initial=0) < info.min or a.max(initial=0) > info.max:
                    raise ValueError(f"{k} must hold {ref.dtype} integers (values {a.min()}..{a.max()})")
                if ref.dtype == np.int8 and a.size and not np.isin(a, (-1, 1)).all():
                    raise ValueError(f"{k} holds {a[~np.isin(a, (-1, 1))].flat[0]}; signs are -1 or +1")
        try:
            rng_state = json.loads(str(arrays["rng"]))
            np.random.Generator(type(self.rng.bit_generator)()).bit_generator.state = rng_state
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"rng: not a {type(self.rng.bit_generator).__name__} state ({e})") from None
        before = own
        self._write_state(arrays, rng_state)
        for k, w in enumerate(self.wopt.binary_weights()):
            if not np.array_equal(np.asarray(w, dtype=np.int8), arrays[f"w{k}"]):
                self._write_state(before, json.loads(str(before["rng"])))
                raise ValueError(f"w{k} does not match the binary weights of the optimiser state opt_*{k}")

    def _write_state(self, arrays: dict, rng_state: dict) -> None:
        wstate = {n: [arrays[f"opt_{n}{i}"] for i in range(len(self.wlayers))] for n in self.wopt.state_arrays()}
        self.wopt.load_state_arrays(wstate, steps=int(arrays["opt_steps"]))
        for j, k in enumerate(self.bn_layers):
            self.beta[j] = np.asarray(arrays[f"beta{k}"], dtype=np.float32).copy()
            self.running_mu[j] = np.asarray(arrays[f"running_mu{k}"], dtype=np.float32).copy()
            self.running_scale[j] = np.asarray(arrays[f"running_scale{k}"], dtype=np.float32).copy()
        if self.popt is not None:
            pstate = {n: [arrays[f"beta_opt_{n}{k}"] for k in self.bn_layers] for n in self.popt.state_arrays()}
            self.popt.load_state_arrays(pstate, steps=int(arrays["beta_opt_steps"]))
        self.rng.bit_generator.state = rng_state
