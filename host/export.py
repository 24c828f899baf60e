"""``xnortrain export``: a trained network as a QONNX graph, the form FINN's front end reads for a binarised MLP.

The graph evaluates what the accelerator's ``infer`` evaluates (docs/arithmetic.md 3.7), class for class:

* input: the raw image as the dataset holds it (``uint8`` levels 0-255 as float32; ``[N, C, H, W]`` or
  ``[N, C H W]``, ``--input-shape``), with the first layer's binarisation in the graph: a ``MultiThreshold``
  with one threshold per pixel giving +-1 (``out_scale = 2``, ``out_bias = -1``, BIPOLAR), the smallest level
  that ``sim.hw.engine.prepare_inputs`` maps to +1; or, with ``hw.input = int8``, an ``Add`` of -128;
* every layer: ``MatMul`` with the +-1 weights (BIPOLAR initialisers, ``[in, out]``), exact in float32 (the
  sums are integers below 2^24);
* every hidden layer's BN and sign: a per-channel ``MultiThreshold`` (BIPOLAR out) whose threshold is the
  accelerator's evaluation threshold ``ceil((mu_r 2^Fb - beta_q s_r') / 2^(Fr+Fb))``: found as the smallest
  reachable ``Y`` that :func:`sim.hw.arith.bn_forward_eval` maps to +1, so the graph holds the model's own
  decision at every ``Y`` a layer can produce;
* the output layer: a per-channel ``MultiThreshold`` whose count is the *rank* of the accelerator's Q.FL logit
  (:func:`sim.hw.arith.output_logits_eval`) among every value any class's logit takes over the reachable
  ``Y``: integers that keep the logits' order and their ties across classes, so the first maximum of the
  graph's output is the accelerator's class. (Thresholds at the logits' own levels would need one per Q.FL
  step: 2^(Fr+FL) per unit of ``Y`` when a channel's running scale is small.)

Reachable ``Y`` of a layer with +-1 input and fan-in ``N``: the integers of ``[-N, N]`` with the parity of
``N``; with 8-bit input every integer of ``[-128 N, 128 N]``. Dense layers only: a conv layer is refused
naming it (the accelerator builds dense networks; conv comes with the conv issue).
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["export_qonnx", "export_main", "reachable_y", "QONNX_PIN"]

#: the qonnx release the export and its test were written against (the ``export`` extra pins it)
QONNX_PIN = "1.0.0"
_OPSET = 13
_DOMAIN = "qonnx.custom_op.general"


def _require_qonnx():
    from host.common import UserError

    try:
        import onnx  # noqa: F401
        import qonnx  # noqa: F401
    except ImportError:
        raise UserError("export needs the qonnx package (the 'export' extra: pip install -e '.[export]'; not "
                        "needed on a board)") from None


def reachable_y(fan_in: int, x_max: int) -> np.ndarray:
    """Every value ``Y`` of a layer of fan-in ``fan_in`` can take: +-1 input (``x_max = 1``): the integers of
    ``[-N, N]`` of ``N``'s parity; 8-bit input: every integer of ``[-x_max N, x_max N]``."""
    bound = fan_in * x_max
    step = 2 if x_max == 1 else 1
    return np.arange(-bound, bound + 1, step, dtype=np.int64)


def hidden_thresholds(model, j: int) -> np.ndarray:
    """Per channel of hidden layer ``j``: the smallest reachable ``Y`` the accelerator's evaluation maps to +1
    (``Ymax + 1`` when none does), by a bisection over :func:`reachable_y` on ``bn_forward_eval`` itself."""
    from sim.hw import arith as A

    s = model.layers[j]
    ys = reachable_y(s.fan_in, model.x_max[j])
    m = s.out_channels
    args = (model.beta[j], model.mu_r[j], model.s_r[j], model.p, model.bounds[j].y)

    def positive(idx: np.ndarray) -> np.ndarray:
        return A.bn_forward_eval(ys[idx].reshape(1, m), *args)[0] > 0

    n = len(ys)
    lo, hi = np.zeros(m, np.int64), np.full(m, n, np.int64)  # the first +1 index is in [lo, hi]; n: none
    while (lo < hi).any():
        active = lo < hi
        mid = (lo + hi) // 2
        pos = positive(np.minimum(mid, n - 1))
        hi = np.where(active & pos, mid, hi)
        lo = np.where(active & ~pos, mid + 1, lo)
    theta = np.where(hi < n, ys[np.minimum(hi, n - 1)], ys[-1] + 1)
    # the model's monotone decision, checked at both sides of every threshold
    assert (positive(np.minimum(hi, n - 1)) | (hi == n)).all()
    assert (~positive(np.maximum(hi - 1, 0)) | (hi == 0)).all()
    return theta


def output_rank_thresholds(model) -> tuple[np.ndarray, np.ndarray]:
    """``(thresholds [M, T], values)`` of the output layer: channel ``c``'s count over the thresholds at ``Y``
    is the rank of its Q.FL logit among ``values`` (the sorted distinct logits of every class over the
    reachable ``Y``)."""
    from sim.hw import arith as A

    j = len(model.layers) - 1
    s = model.layers[j]
    ys = reachable_y(s.fan_in, model.x_max[j])
    m = s.out_channels
    logits = np.concatenate([
        A.output_logits_eval(np.repeat(chunk[:, None], m, axis=1), model.beta[j], model.mu_r[j], model.s_r[j],
                             model.p)
        for chunk in np.array_split(ys, max(1, len(ys) // 4096))])  # [len(ys), M]
    if (np.diff(logits, axis=0) < 0).any():
        raise AssertionError("output_logits_eval is not monotone in Y")  # s_r' > 0: cannot happen
    values = np.unique(logits)
    rank = np.searchsorted(values, logits)  # [len(ys), M], non-decreasing down each column
    t = max(len(values) - 1, 1)
    thr = np.empty((m, t), dtype=np.int64)
    for c in range(m):
        # level r (1..T) is reached at the first Y whose rank >= r; never reached: above every reachable Y
        first = np.searchsorted(rank[:, c], np.arange(1, t + 1), side="left")
        thr[c] = np.where(first < len(ys), ys[np.minimum(first, len(ys) - 1)], ys[-1] + 1)
    return thr, values


def input_threshold(cfg) -> int:
    """The smallest pixel level the accelerator's input binarisation maps to +1 (256 if none)."""
    from sim.hw.engine import prepare_inputs

    levels = np.arange(256, dtype=np.uint8).reshape(256, 1, 1, 1)
    x = prepare_inputs(cfg, levels).reshape(-1)
    plus = np.flatnonzero(x > 0)
    if plus.size and plus[0] > 0 and not (x[plus[0]:] > 0).all():
        raise AssertionError("the input binarisation is not a threshold")
    return int(plus[0]) if plus.size else 256


def _check_exportable(cfg) -> None:
    from host.common import UserError

    for s in cfg.layer_shapes():
        if s.spec.type != "dense":
            raise UserError(f"model.layers[{s.index}] ({s.spec.type}): export writes dense networks only (the "
                            "layers the accelerator builds)")


def export_qonnx(cfg, state, *, batch: int = 1, input_shape: str = "image", name: str = "xnortrain"):
    """The QONNX :class:`qonnx.core.modelwrapper.ModelWrapper` of the hardware state ``state`` (keyed as
    :meth:`sim.hw.model.HwModel.state_dict`) of configuration ``cfg``: ``batch`` images per execution (fixed:
    qonnx's executor checks the shape), ``input_shape`` ``image`` (``[N, C, H, W]``) or ``flat``."""
    _require_qonnx()
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from qonnx.core.datatype import DataType
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.infer_datatypes import InferDataTypes
    from qonnx.transformation.infer_shapes import InferShapes

    from host.init_state import BN_METADATA
    from sim.hw.model import HwModel

    _check_exportable(cfg)
    model = HwModel(cfg)
    model.load_state_dict(state)
    c, h, w = cfg.model.input_shape
    features = c * h * w
    shape = [batch, c, h, w] if input_shape == "image" else [batch, features]
    nodes, inits, annotate = [], [], {}

    def const(tensor_name: str, value: np.ndarray, dtype: str | None = None) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), tensor_name))
        if dtype:
            annotate[tensor_name] = dtype
        return tensor_name

    def threshold(src: str, dst: str, thr: np.ndarray, bipolar: bool, out_dtype: str) -> None:
        t = const(f"{dst}_thresholds", thr.astype(np.float32))
        nodes.append(helper.make_node("MultiThreshold", [src, t], [dst], domain=_DOMAIN,
                                      out_dtype=out_dtype, out_scale=2.0 if bipolar else 1.0,
                                      out_bias=-1.0 if bipolar else 0.0, data_layout="NC"))
        annotate[dst] = out_dtype

    cur = "global_in"
    annotate[cur] = "UINT8"
    if input_shape == "image":
        nodes.append(helper.make_node("Flatten", [cur], ["pixels"], axis=1))
        cur = "pixels"
        annotate[cur] = "UINT8"
    if model.input_kind == "binary":
        threshold(cur, "x0", np.full((features, 1), input_threshold(cfg)), True, "BIPOLAR")
    else:
        nodes.append(helper.make_node("Add", [cur, const("input_offset", np.array(-128.0))], ["x0"]))
        annotate["x0"] = "INT8"
    cur = "x0"
    last = len(model.layers) - 1
    for j in range(last + 1):
        y = f"y{j}"
        nodes.append(helper.make_node("MatMul", [cur, const(f"w{j}", model.w[j], "BIPOLAR")], [y]))
        if j < last:
            threshold(y, f"x{j + 1}", hidden_thresholds(model, j).reshape(-1, 1), True, "BIPOLAR")
            cur = f"x{j + 1}"
        else:
            thr, values = output_rank_thresholds(model)
            bits = max(1, int(thr.shape[1]).bit_length())
            threshold(y, "global_out", thr, False, f"UINT{bits}")
    m_out = model.layers[last].out_channels
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("global_in", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("global_out", TensorProto.FLOAT, [batch, m_out])], initializer=inits)
    proto = helper.make_model(graph, producer_name="xnortrain",
                              opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid(_DOMAIN, 1)])
    onnx.helper.set_model_props(proto, {
        "xnortrain.config": cfg.name,
        "xnortrain.output": "per class: the rank of the accelerator's Q.FL evaluation logit among every logit value "
                            "(order and ties kept); the class is the first maximum",
        "xnortrain.input": f"raw pixels 0-255, shape {shape}",
        # the BN integers themselves, for `train --init` of this file (an exact round trip; the graph's
        # thresholds and output ranks do not give back the biases and statistics training continues from)
        BN_METADATA: json.dumps({"beta_frac": model.p.beta_frac, "running_frac": model.p.running_frac, "layers": [
            {"beta_q": model.beta[j].tolist(), "mu_r": model.mu_r[j].tolist(), "s_r": model.s_r[j].tolist()}
            for j in range(last + 1)]}),
    })
    wrapped = ModelWrapper(proto)
    for tensor, dtype in annotate.items():
        wrapped.set_tensor_datatype(tensor, DataType[dtype])
    wrapped = wrapped.transform(InferShapes()).transform(InferDataTypes())
    return wrapped


def hw_state_of(ckpt):
    """``(cfg, state)``: the hardware configuration and state of a checkpoint (a float-reference one converted as
    ``train --init`` converts it)."""
    if ckpt.engine == "hw":
        return ckpt.config, ckpt.engine_state
    from host.init_state import hw_state_from_float

    cfg = ckpt.config
    return cfg, hw_state_from_float(cfg, cfg, ckpt.engine_state, source=str(ckpt.path), option="--checkpoint")


def export_main(args) -> int:
    """``xnortrain export --checkpoint CKPT --out model.onnx``."""
    from host.common import EXIT_OK, UserError, output_file
    from host.outputs import OutputLock, check_distinct
    from sim.train_loop import atomic_write, load_checkpoint

    if args.batch < 1:
        raise UserError(f"--batch {args.batch}: must be >= 1 (images per execution of the graph)")
    out = output_file("--out", args.out, ".onnx")
    check_distinct([("--out", out)], [("--checkpoint", args.checkpoint)])
    if out.is_file() and not args.force:
        raise UserError(f"--out {out}: exists; give another file or --force to overwrite it")
    _require_qonnx()
    ckpt = load_checkpoint(args.checkpoint)
    cfg, state = hw_state_of(ckpt)
    _check_exportable(cfg)
    with OutputLock([("--out", out)]):
        wrapped = export_qonnx(cfg, state, batch=args.batch, input_shape=args.input_shape)
        data = wrapped.model.SerializeToString()
        atomic_write(out, lambda fh: fh.write(data))
    nodes = [n.op_type for n in wrapped.graph.node]
    print(f"{out}: QONNX, {len(nodes)} nodes ({', '.join(nodes)}), input {wrapped.get_tensor_shape('global_in')} "
          f"raw pixels, output {wrapped.get_tensor_shape('global_out')} (the class is the first maximum)")
    return EXIT_OK
