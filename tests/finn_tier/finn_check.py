"""Run in FINN's own environment (``make test-finn`` makes ``.venv-finn`` with finn-plus): FINN's front end on an
``xnortrain export`` graph. Streamlining (as FINN's ``step_streamline``: bipolar MatMuls to XNOR-popcounts, the
thresholds adjusted), conversion to hardware layers (``step_convert_to_hw``'s binary MVAU and thresholding
inferences), and FINN's Python execution of the graph after each stage, on the images given.

    .venv-finn/bin/python tests/finn_tier/finn_check.py MODEL.onnx IMAGES.npz OUT.json

``IMAGES.npz``: ``x`` (raw images as float32, the graph's input shape, one execution per image). ``OUT.json``: the
classes (first maximum) after each stage and the op types of the hardware graph. Imports nothing of xnortrain."""

from __future__ import annotations

import json
import sys

import numpy as np


def classes(model, x, execute_onnx) -> list[int]:
    name = model.graph.input[0].name
    out_name = model.graph.output[0].name
    return [int(np.argmax(execute_onnx(model, {name: xi[None]})[out_name].reshape(-1))) for xi in x]


def main(path: str, images: str, out: str) -> int:
    from finn.core.onnx_exec import execute_onnx
    from finn.transformation.fpgadataflow.convert_to_hw.binary_matrix_vector_activation import (
        InferBinaryMatrixVectorActivation,
    )
    from finn.transformation.fpgadataflow.convert_to_hw.quantized_matrix_vector_activation import (
        InferQuantizedMatrixVectorActivation,
    )
    from finn.transformation.fpgadataflow.convert_to_hw.thresholding import InferThresholdingLayer
    from finn.transformation.streamline import Streamline, absorb
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.bipolar_to_xnor import ConvertBipolarMatMulToXnorPopcount
    from qonnx.transformation.fold_constants import FoldConstants
    from qonnx.transformation.general import (
        GiveReadableTensorNames,
        GiveUniqueNodeNames,
        RemoveStaticGraphInputs,
        RemoveUnusedTensors,
    )
    from qonnx.transformation.infer_data_layouts import InferDataLayouts
    from qonnx.transformation.infer_datatypes import InferDataTypes
    from qonnx.transformation.infer_shapes import InferShapes

    x = np.load(images)["x"].astype(np.float32)
    model = ModelWrapper(path)
    for t in (InferShapes(), FoldConstants(), GiveUniqueNodeNames(), GiveReadableTensorNames(), InferDataTypes(),
              RemoveStaticGraphInputs()):
        model = model.transform(t)
    result = {"tidy": classes(model, x, execute_onnx)}
    # FINN's step_streamline
    model = model.transform(absorb.AbsorbScalarBiasIntoMultiThreshold())
    model = model.transform(Streamline())
    model = model.transform(ConvertBipolarMatMulToXnorPopcount())
    model = model.transform(Streamline())
    model = model.transform(InferDataLayouts())
    model = model.transform(RemoveUnusedTensors())
    result["streamlined"] = classes(model, x, execute_onnx)
    result["streamlined_ops"] = [n.op_type for n in model.graph.node]
    # FINN's step_convert_to_hw (the layers an MLP has)
    model = model.transform(InferBinaryMatrixVectorActivation())
    model = model.transform(InferQuantizedMatrixVectorActivation())
    model = model.transform(InferThresholdingLayer())
    model = model.transform(GiveUniqueNodeNames())
    model = model.transform(InferDataLayouts())
    result["hw_ops"] = [n.op_type for n in model.graph.node]
    result["hw"] = classes(model, x, execute_onnx)
    with open(out, "w") as fh:
        json.dump(result, fh)
    print(json.dumps({k: v for k, v in result.items() if k.endswith("ops")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
