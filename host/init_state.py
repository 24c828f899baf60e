"""``xnortrain train --init FILE``: start the hardware arithmetic from a network trained elsewhere.

Sources: a float-reference checkpoint (``train --arith float``), or an ONNX / QONNX BNN of the same dense
topology (``xnortrain export``'s own graphs round-trip exactly; other graphs as ``MatMul`` [+ bias ``Add``] +
``BatchNormalization``, or ``MatMul`` + a one-threshold ``MultiThreshold`` per hidden layer). Every source is
read into one form per weight layer, in units of the layer's integer ``Y``: the +-1 weights and the evaluation
BN ``x = (y - mean) / scale + beta`` (``scale > 0``); :func:`hw_state` rounds it into the hardware's formats
(docs/arithmetic.md, "Starting from a model trained elsewhere"). The optimiser state, the BN biases' EMAs, the
random generators and the step count are the configuration's initial values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from host.common import UserError

__all__ = ["LayerParams", "Source", "read_source", "hw_state", "hw_state_from_float", "load_init",
           "BN_METADATA"]

#: QONNX metadata key under which ``xnortrain export`` keeps the hardware's BN integers (an exact round trip)
BN_METADATA = "xnortrain.bn"


@dataclass
class LayerParams:
    w: np.ndarray  # int8 +-1 [N, M]
    mean: np.ndarray  # float64 [M], units of Y
    scale: np.ndarray  # float64 [M], > 0
    beta: np.ndarray  # float64 [M]
    exact: dict | None = None  # {"beta_q", "mu_r", "s_r", "beta_frac", "running_frac"}: the hardware's own integers


@dataclass
class Source:
    path: str
    layers: list = field(default_factory=list)
    input_kind: str = "binary"  # binary | int8 | pm1 (real values x / 127.5 - 1) | given (already +-1)
    input_level: int | None = None  # binary: the smallest pixel level mapped to +1
    kind: str = "float checkpoint"
    note: str = ""
    option: str = "--init"  # the command-line option that named the file, for messages


def _round(x: np.ndarray, frac: int) -> np.ndarray:
    """Round half up to ``frac`` fractional bits, as integers."""
    return np.floor(np.asarray(x, dtype=np.float64) * (1 << frac) + 0.5).astype(np.int64)


def _level(prepare, cfg) -> int | None:
    levels = np.arange(256, dtype=np.uint8).reshape(256, 1, 1, 1)
    x = np.asarray(prepare(cfg, levels)).reshape(-1)
    plus = np.flatnonzero(x > 0)
    return int(plus[0]) if plus.size else 256


# ---------------------------------------------------------------------------- sources


def source_from_float(cfg_f, fstate, path: str) -> Source:
    """A float-reference state (``BNNModel.state_dict``) of configuration ``cfg_f``."""
    from sim.reference.engine import prepare_inputs

    src = Source(path)
    for k, s in enumerate(cfg_f.weight_layers()):
        if not s.spec.bn:
            raise UserError(f"--init {path}: model.layers[{s.index}] has no batch norm; the accelerator normalises "
                            "every layer")
        run = np.asarray(fstate[f"running_scale{k}"], dtype=np.float64)
        eps = float(cfg_f.approx.bn_eps)
        scale = np.sqrt(run + eps) if cfg_f.approx.bn == "l2" else run + eps
        scale = np.where(scale > 0, scale, 1.0)  # the float evaluation's divisor for a zero scale
        src.layers.append(LayerParams(np.asarray(fstate[f"w{k}"], dtype=np.int8),
                                      np.asarray(fstate[f"running_mu{k}"], dtype=np.float64), scale,
                                      np.asarray(fstate[f"beta{k}"], dtype=np.float64)))
    fmt, pre = cfg_f.model.input_format, cfg_f.data.preprocess
    if fmt == "binary" or (fmt == "float" and pre == "binarize"):
        src.input_kind, src.input_level = "binary", _level(prepare_inputs, cfg_f)
    elif fmt == "int8":
        src.input_kind = "int8"
    else:
        src.input_kind = "pm1"
    return src


def _initializer(graph, name):
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t).astype(np.float64)
    return None


def source_from_onnx(path: str) -> Source:
    """An ONNX / QONNX graph: the chain of MatMul (or Gemm) layers from its input, each followed by its BN."""
    try:
        import onnx
    except ImportError:
        raise UserError(f"--init {path}: reading ONNX needs the onnx package (the 'export' extra)") from None
    try:
        proto = onnx.load(path)
    except Exception as e:  # a protobuf decode error has no common class
        raise UserError(f"--init {path}: not an ONNX model ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                        ) from None
    g = proto.graph
    meta = {p.key: p.value for p in proto.metadata_props}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producer = {o: n for n in g.node for o in n.output}
    src = Source(path, kind="ONNX graph", input_kind="given")

    def weight_of(name):
        w = _initializer(g, name)
        if w is None and name in producer:  # an initialiser behind a quantiser (BipolarQuant, Quant, Sign)
            for i in producer[name].input:
                w = _initializer(g, i)
                if w is not None and w.ndim == 2:
                    break
        return w

    matmuls = [n for n in g.node if n.op_type in ("MatMul", "Gemm")]
    if not matmuls:
        raise UserError(f"--init {path}: no MatMul or Gemm layer found")
    # the input stage: what happens to the pixels before the first layer
    first_in = matmuls[0].input[0]
    stage = producer.get(first_in)
    while stage is not None and stage.op_type in ("Flatten", "Reshape"):
        stage = producer.get(stage.input[0])
    if stage is not None and stage.op_type == "MultiThreshold":
        t = _initializer(g, stage.input[1])
        if t is None or t.shape[1] != 1 or np.unique(t).size != 1:
            raise UserError(f"--init {path}: the input MultiThreshold {stage.name!r} is not one threshold for every "
                            "pixel")
        src.input_kind, src.input_level = "binary", int(np.ceil(t.flat[0]))
    elif stage is not None and stage.op_type == "Add" and _initializer(g, stage.input[1]) is not None \
            and float(_initializer(g, stage.input[1]).reshape(-1)[0]) == -128.0:
        src.input_kind = "int8"
    bn_exact = json.loads(meta[BN_METADATA]) if BN_METADATA in meta else None
    for j, mm in enumerate(matmuls):
        w = next((weight_of(i) for i in mm.input[1:] if weight_of(i) is not None), None)
        if w is None or w.ndim != 2:
            raise UserError(f"--init {path}: layer {j} ({mm.op_type} {mm.name!r}) has no constant 2-D weight")
        if mm.op_type == "Gemm" and any(a.name == "transB" and a.i for a in mm.attribute):
            w = w.T
        sign = np.where(w >= 0, 1, -1).astype(np.int8)
        m = w.shape[1]
        if bn_exact is not None:
            e = bn_exact["layers"][j]
            src.layers.append(LayerParams(sign, np.zeros(m), np.ones(m), np.zeros(m), exact={
                **{k: np.asarray(e[k], dtype=np.int64) for k in ("beta_q", "mu_r", "s_r")},
                "beta_frac": int(bn_exact["beta_frac"]), "running_frac": int(bn_exact["running_frac"])}))
            continue
        out, bias = mm.output[0], np.zeros(m)
        nxt = consumers.get(out, [])
        if mm.op_type == "Gemm" and len(mm.input) > 2:
            bias = bias + (_initializer(g, mm.input[2]) if _initializer(g, mm.input[2]) is not None else 0.0)
        if len(nxt) == 1 and nxt[0].op_type == "Add":
            b = next((_initializer(g, i) for i in nxt[0].input if _initializer(g, i) is not None), None)
            if b is not None:
                bias = bias + b.reshape(-1)
                nxt = consumers.get(nxt[0].output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "BatchNormalization":
            bn = nxt[0]
            gamma, beta, mu, var = (_initializer(g, i) for i in bn.input[1:5])
            eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
            if any(v is None for v in (gamma, beta, mu, var)):
                raise UserError(f"--init {path}: BatchNormalization {bn.name!r} of layer {j} has non-constant inputs")
            if (gamma == 0).any():
                raise UserError(f"--init {path}: BatchNormalization {bn.name!r} of layer {j}: channel "
                                f"{int(np.flatnonzero(gamma == 0)[0])} has scale 0 (a constant output)")
            # gamma (y - mu) / sd + beta = (y' - mu') / (sd / |gamma|) + beta with y' = sign(gamma) y:
            # a negative gamma flips the channel's weights
            flip = np.sign(gamma)
            src.layers.append(LayerParams((sign * flip.astype(np.int8)).astype(np.int8), flip * (mu - bias),
                                          np.sqrt(var + eps) / np.abs(gamma), beta))
        elif len(nxt) == 1 and nxt[0].op_type == "MultiThreshold" and j < len(matmuls) - 1:
            t = _initializer(g, nxt[0].input[1])
            if t is None or t.shape != (m, 1):
                raise UserError(f"--init {path}: the MultiThreshold after layer {j} is not one threshold per channel")
            # x = +1 iff y >= ceil(t): the evaluation BN with that mean, unit scale, zero bias
            src.layers.append(LayerParams(sign, np.ceil(t.reshape(-1)), np.ones(m), np.zeros(m)))
            src.note = "hidden layers from thresholds: their BN biases start at 0 for training"
        else:
            what = nxt[0].op_type if len(nxt) == 1 else f"{len(nxt)} nodes"
            raise UserError(f"--init {path}: layer {j} ({mm.op_type} {mm.name!r}) is followed by {what}; expected "
                            "BatchNormalization (or one MultiThreshold per hidden channel)")
    return src


def read_source(path: str) -> Source:
    """A float-reference checkpoint (``.npz``) or an ONNX graph, read into :class:`Source`."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise UserError(f"--init {path}: is a folder; give a checkpoint (.npz) or an ONNX file")
    if not p.is_file():
        raise UserError(f"--init {path}: no such file")
    with open(p, "rb") as fh:
        head = fh.read(4)
    if head.startswith(b"PK"):  # an .npz
        from sim.train_loop import load_checkpoint

        ckpt = load_checkpoint(p)
        if ckpt.engine == "hw":
            raise UserError(f"--init {path}: a hardware checkpoint; continue it with --resume {path} (--init converts "
                            "a float-reference checkpoint or an ONNX model)")
        return source_from_float(ckpt.config, ckpt.engine_state, str(path))
    return source_from_onnx(str(path))


# ---------------------------------------------------------------------------- conversion


def hw_state(cfg, src: Source) -> dict[str, np.ndarray]:
    """The bit-exact model's whole state (``HwModel.state_dict`` keys) for ``cfg`` from ``src``: weights and BN
    rounded into the hardware's formats, everything else at the configuration's initial value."""
    from sim.hw.engine import prepare_inputs
    from sim.hw.model import HwModel, validate_state

    model = HwModel(cfg)
    state = model.state_dict()
    p = model.p
    layers = model.layers
    for j, (lp, s) in enumerate(zip(src.layers, layers, strict=False)):
        if s.spec.type != "dense":
            raise UserError(f"{src.option} {src.path}: model.layers[{s.index}] is {s.spec.type}; --init converts dense "
                            "layers")
        if tuple(lp.w.shape) != tuple(model.wshapes[j]):
            n, m = lp.w.shape
            raise UserError(f"{src.option} {src.path}: model.layers[{s.index}] is dense {n} -> {m} there, "
                            f"{model.wshapes[j][0]} -> {model.wshapes[j][1]} here")
    if len(src.layers) != len(layers):
        where = f"model.layers[{layers[len(src.layers)].index}] has no counterpart there" \
            if len(src.layers) < len(layers) else f"it has {len(src.layers) - len(layers)} more after the last here"
        raise UserError(f"{src.option} {src.path}: {len(src.layers)} weight layers there, {len(layers)} here ({where})")
    kind = model.input_kind
    first = src.layers[0]
    if kind == "binary":
        if src.input_kind in ("int8", "pm1"):
            raise UserError(f"{src.option} {src.path}: its first layer takes {src.input_kind} input, the accelerator "
                            "binarises it (hw.input = binary): train the float model with --set "
                            "model.input_format=binary, or use --set hw.input=int8 (the bit-exact model only)")
        level = _level(prepare_inputs, cfg)
        if src.input_level is not None and src.input_level != level:
            raise UserError(f"{src.option} {src.path}: it binarises pixels at level {src.input_level}, this "
                            f"configuration at {level} (data.binarize_threshold = {cfg.data.binarize_threshold}); "
                            "give the same")
    else:
        if src.input_kind in ("binary", "given"):
            raise UserError(f"{src.option} {src.path}: its first layer takes +-1 input, this configuration 8-bit "
                            "pixels (hw.input = int8); use hw.input = binary")
        if src.input_kind == "pm1":
            # x = (pixel - 127.5) / 127.5 = (x_hw + 1/2) / 127.5: y = (y_hw + colsum(w) / 2) / 127.5
            colsum = first.w.astype(np.float64).sum(axis=0)
            first = LayerParams(first.w, 127.5 * first.mean - colsum / 2, 127.5 * first.scale, first.beta)
    for j, lp in enumerate([first, *src.layers[1:]]):
        run = model.bounds[j].running
        state[f"w{j}"] = lp.w.astype(np.int8)
        if lp.exact is not None:
            # the hardware's own integers; re-rounded only when this configuration has other fraction bits
            fb, fr = lp.exact["beta_frac"], lp.exact["running_frac"]
            e = lp.exact
            beta_q = e["beta_q"] if fb == p.beta_frac else _round(e["beta_q"] / float(1 << fb), p.beta_frac)
            mu_r = e["mu_r"] if fr == p.running_frac else _round(e["mu_r"] / float(1 << fr), p.running_frac)
            s_r = e["s_r"] if fr == p.running_frac else _round(e["s_r"] / float(1 << fr), p.running_frac)
        else:
            beta_q, mu_r, s_r = _round(lp.beta, p.beta_frac), _round(lp.mean, p.running_frac), _round(
                lp.scale, p.running_frac)
        state[f"beta{j}"] = np.clip(beta_q, p.beta_lo, p.beta_hi)
        state[f"mu_r{j}"] = np.clip(mu_r, -run, run)
        state[f"s_r{j}"] = np.clip(s_r, 1, run)
        if "latent" in model.opt:  # sgd: the latent keeps its initial magnitude with the new weight's sign
            lat = state[f"latent{j}"].astype(np.int64)
            mag = np.where(lat >= 0, lat, -1 - lat)
            state[f"latent{j}"] = np.where(lp.w > 0, mag, -1 - mag).astype(lat.dtype)
    validate_state(model, state)
    return state


def hw_state_from_float(cfg, cfg_f, fstate, *, source: str, option: str = "--init") -> dict[str, np.ndarray]:
    """:func:`hw_state` of a float-reference state (``option``: what named ``source``, for messages)."""
    src = source_from_float(cfg_f, fstate, source)
    src.option = option
    return hw_state(cfg, src)


def load_init(engine, src: Source, state: dict, cfg, data, log=print) -> float:
    """Write ``state`` into ``engine`` (any hardware target: the model, the simulated board, a board) and return
    (and log) the test accuracy of the target's own inference before any step."""
    from sim.train_loop import evaluate_dataset

    engine.load_state_dict(state)
    _, acc = evaluate_dataset(engine, data.x_test, data.y_test, cfg.train.eval_batch_size)
    note = f"; {src.note}" if src.note else ""
    log(f"initialised from {src.path} ({src.kind}{note}): test accuracy {100 * acc:.2f} % by the target's own "
        f"inference, before any step ({len(data.x_test)} images)")
    return acc
