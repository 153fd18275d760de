"""Is a graph TensorRT-ready? The real builder's verdict, with our operator table as a hint beside it.

    from export.tensorrt_support import engine_readiness, readiness_report
    report = engine_readiness("outputs/export/teacher.onnx", "outputs/export/teacher.plan", settings.engine.tensorrt)
    report["ready"], report["verdict_source"]   # True/False from the TensorRT builder that ran
    report["engine"]                            # status, the parser's/builder's error, time, size, layer precisions
    report["op_table_hint"]["blockers"]         # what the table below predicts, node by node

    readiness_report("outputs/export/teacher.onnx")   # the table alone: {"ready", "blockers", "warnings", ...}

``engine_readiness`` builds the graph with whichever TensorRT is importable
(export/tensorrt_engine.py: full TensorRT, else TensorRT-RTX, which builds without a GPU); only
where none imports does the verdict fall back to the table, and the report says so.

Source of the table: onnx-tensorrt's docs/operators.md ("Supported ONNX Operators",
https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md; the operator table of the 8.5
revision, with the TensorRT 10 changes its header and changelog state: opsets 9 to 20, native
INT64/BF16, LayerNormalization through INormalizationLayer since 8.6). It is a hint: the builder
finds what a table cannot (TensorRT-RTX has no NonZero importer; a shape computed from float
activations is refused), so the verdict is the builder's.

A finding is a *blocker* when the parser rejects the node, or when it accepts it but the engine
would not compute what the graph says (random ops ignore their seed, so no run can be compared
with PyTorch; NonZero gives data-dependent shapes this project replaces with cumsum alignment).
A *warning* is accepted with a caveat worth reading.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from export.graph_checks import all_nodes, default_opset, load, op_histogram
from export.settings import TensorRTSettings
from export.tensorrt_engine import build_engine

MIN_OPSET, MAX_OPSET = 9, 20  # "TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20"

# Operators the parser imports (operators.md "Supported: Y").
SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast Ceil Celu Clip
Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div Dropout
Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather GatherElements GatherND Gemm GlobalAveragePool
GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample HardSigmoid HardSwish Identity If ImageScaler
InstanceNormalization IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop
LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mod Mul Neg NonMaxSuppression
NonZero Not OneHot Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomNormal RandomNormalLike
RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round
Scan ScaledTanh Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu
Unsqueeze Upsample Where Xor
""".split())

# Operators the parser rejects (operators.md "Supported: N"), with the reason we give.
UNSUPPORTED_OPS = {
    **{op: "no TensorRT importer (operators.md: N)" for op in """
Bernoulli BitShift BlackmanWindow Compress ConcatFromSequence ConvInteger Det DynamicQuantizeLinear HammingWindow
HannWindow Hardmax IsInf MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss
Optional OptionalGetElement OptionalHasElement QLinearConv QLinearMatMul SequenceAt SequenceConstruct
SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence
StringNormalizer TfIdfVectorizer Unique
""".split()},
    "DFT": "no DFT in TensorRT's ONNX parser: compute spectra with Conv/MatMul against a fixed basis",
    "STFT": "no STFT in TensorRT's ONNX parser: frame with Conv1d and multiply by a fixed DFT basis",
}

# Supported, but the engine would not compute what the graph says: blockers under this project's rules.
POLICY_BLOCKERS = {
    "RandomNormal": "seed ignored by TensorRT: feed the noise as a graph input (duration_noise / prior_noise)",
    "RandomNormalLike": "seed ignored by TensorRT: feed the noise as a graph input (duration_noise / prior_noise)",
    "RandomUniform": "seed ignored by TensorRT: feed the noise as a graph input",
    "RandomUniformLike": "seed ignored by TensorRT: feed the noise as a graph input",
    "NonZero": "data-dependent output shape: build the alignment from cumulative sums instead",
}

# What no exported graph of this project may hold, whatever the runtime: spectra TensorRT cannot
# compute and the policy blockers above.
EXPORT_HOSTILE_OPS = frozenset({"STFT", "DFT", *POLICY_BLOCKERS})

# Supported with a caveat worth reading in the report.
CAVEATS = {
    "ArgMin": "imported as TopK(k=1): select_last_index must be 0",
    "ArgMax": "imported as TopK(k=1): select_last_index must be 0",
    "ScatterElements": "reduction other than 'none' needs a recent TensorRT 10 release",
    "Loop": "runs, but each iteration is a separate launch: slow for long trip counts",
    "ReverseSequence": "dynamic input shapes are unsupported",
}

# Inputs that must be initializers/constants for the parser: op -> (input index, restriction text).
CONSTANT_INPUTS = {
    "CumSum": (1, "`axis` must be an initializer"),
    "Slice": (3, "`axes` must be an initializer"),
    "TopK": (1, "`K` must be an initializer"),
}
LARGE_INT64_INITIALIZER_ELEMENTS = 1024  # shape constants are small; a large int64 tensor is a weight


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs by tensor name."""
    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    for node in all_nodes(model.graph):
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _finding(node: onnx.NodeProto, reason: str) -> dict:
    return {"node": node.name or node.output[0], "op": node.op_type, "reason": reason}


def _zero_point_finding(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> str | None:
    """Why a Q/DQ node's zero point blocks TensorRT (must be an all-zero constant), or None."""
    if len(node.input) < 3 or not node.input[2]:
        return None  # no zero point: 0 by definition
    zero_point = constants.get(node.input[2])
    if zero_point is None:
        return f"zero point '{node.input[2]}' is computed at run time; TensorRT needs a constant 0"
    if np.any(zero_point != 0):
        return (f"asymmetric quantization: zero point {zero_point.ravel()[:4].tolist()} (TensorRT accepts only 0; "
                "quantize symmetrically)")
    return None


def readiness_report(model_or_path: onnx.ModelProto | str | Path) -> dict:
    """JSON-able: ``ready`` (no blockers), ``blockers`` and ``warnings`` (each names node, op, reason), op histogram."""
    model = load(model_or_path)
    constants = _constants(model)
    blockers, warnings = [], []
    opset = default_opset(model)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        blockers.append({"node": "<model>", "op": "opset", "reason": f"opset {opset} outside TensorRT 10's {MIN_OPSET}-{MAX_OPSET}"})
    for node in all_nodes(model.graph):
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            blockers.append(_finding(node, f"custom domain '{node.domain}': TensorRT needs a plugin for it"))
            continue
        if op in UNSUPPORTED_OPS:
            blockers.append(_finding(node, UNSUPPORTED_OPS[op]))
        elif op in POLICY_BLOCKERS:
            blockers.append(_finding(node, POLICY_BLOCKERS[op]))
        elif op not in SUPPORTED_OPS:
            blockers.append(_finding(node, "not in TensorRT's ONNX operator table"))
        if op in ("QuantizeLinear", "DequantizeLinear"):
            reason = _zero_point_finding(node, constants)
            if reason:
                blockers.append(_finding(node, reason))
        if op in CONSTANT_INPUTS:
            index, restriction = CONSTANT_INPUTS[op]
            if len(node.input) > index and node.input[index] and node.input[index] not in constants:
                blockers.append(_finding(node, f"{restriction}; '{node.input[index]}' is computed at run time"))
        if op in ("ArgMin", "ArgMax"):
            select_last = next((onnx.helper.get_attribute_value(a) for a in node.attribute
                                if a.name == "select_last_index"), 0)
            if select_last:
                blockers.append(_finding(node, "select_last_index=1: TensorRT's TopK import supports only 0"))
        if op == "ScatterElements":
            reduction = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "reduction"), b"none")
            if reduction not in (b"none", "none"):
                warnings.append(_finding(node, CAVEATS[op] + f" (reduction={reduction.decode()})"))
        elif op in CAVEATS:
            warnings.append(_finding(node, CAVEATS[op]))
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.DOUBLE:
            warnings.append({"node": tensor.name, "op": "initializer", "reason": "DOUBLE is cast down to FLOAT by TensorRT"})
        if tensor.data_type == onnx.TensorProto.INT64 and int(np.prod(tensor.dims)) > LARGE_INT64_INITIALIZER_ELEMENTS:
            warnings.append({"node": tensor.name, "op": "initializer",
                             "reason": f"int64 weight of {int(np.prod(tensor.dims))} elements: few TensorRT layers take INT64"})
    return {"ready": not blockers, "opset": opset, "blockers": blockers, "warnings": warnings,
            "op_histogram": op_histogram(model)}


def engine_readiness(onnx_path: str | Path, engine_path: str | Path, settings: TensorRTSettings) -> dict:
    """JSON-able: ``ready`` and ``verdict_source`` (the builder that decided, or the table where no
    TensorRT imports), ``engine`` (export/tensorrt_engine.py's result: status, the parser's or
    builder's error verbatim, build time, plan size, layers and precision counts) and
    ``op_table_hint`` (``readiness_report``'s blockers and warnings)."""
    hint = readiness_report(onnx_path)
    built = build_engine(onnx_path, engine_path, settings)
    if built.status == "unavailable":
        ready, source = hint["ready"], f"op table only: {built.reason}"
    else:
        ready, source = built.status == "built", f"{built.backend} {built.backend_version} builder"
    return {"ready": ready, "verdict_source": source, "engine": built.to_dict(),
            "op_table_hint": {"ready": hint["ready"], "blockers": hint["blockers"], "warnings": hint["warnings"]},
            "opset": hint["opset"], "op_histogram": hint["op_histogram"]}
