"""The TensorRT readiness report: a clean graph passes; each kind of blocker is named at its node.

    python -m pytest -q tests/test_export_tensorrt_support.py
"""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.tensorrt_support import readiness_report


def graph(nodes, initializers=(), opset: int = 18) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    axis_input = helper.make_tensor_value_info("axis", TensorProto.INT64, [])
    inputs = [x, axis_input] if any("axis" in node.input for node in nodes) else [x]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [y], list(initializers)),
                              opset_imports=[helper.make_opsetid("", opset)])
    return model


def quant_params(zero_point: int):
    return [numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
            numpy_helper.from_array(np.array(zero_point, np.int8), "zero_point")]


def blocked_ops(report: dict) -> dict[str, str]:
    return {finding["node"]: finding["reason"] for finding in report["blockers"]}


def test_clean_graph_is_ready_and_json_able():
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["dq"], name="dq"),
             helper.make_node("Relu", ["dq"], ["y"], name="relu")]
    report = readiness_report(graph(nodes, quant_params(0)))
    assert report["ready"] and report["blockers"] == []
    assert report["op_histogram"] == {"QuantizeLinear": 1, "DequantizeLinear": 1, "Relu": 1}
    json.dumps(report)


def test_dft_random_normal_and_asymmetric_quantization_are_each_flagged_at_their_node():
    nodes = [helper.make_node("DFT", ["x"], ["spectrum"], name="spectrum"),
             helper.make_node("RandomNormalLike", ["x"], ["noise"], name="noise"),
             helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], name="q_asym"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"], name="dq_asym")]
    report = readiness_report(graph(nodes, quant_params(3)))
    assert not report["ready"]
    blocked = blocked_ops(report)
    assert set(blocked) == {"spectrum", "noise", "q_asym", "dq_asym"}
    assert "DFT" in blocked["spectrum"] and "seed ignored" in blocked["noise"]
    assert "asymmetric" in blocked["q_asym"] and "[3]" in blocked["q_asym"]


def test_run_time_cumsum_axis_nonzero_custom_ops_and_opset_are_flagged():
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["c"], name="cumsum"),
             helper.make_node("NonZero", ["c"], ["nz"], name="nonzero"),
             helper.make_node("FusedConv", ["x"], ["y"], name="fused", domain="com.microsoft")]
    model = graph(nodes, opset=22)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    blocked = blocked_ops(readiness_report(model))
    assert "axis" in blocked["cumsum"] and "run time" in blocked["cumsum"]
    assert "data-dependent" in blocked["nonzero"]
    assert "com.microsoft" in blocked["fused"]
    assert "opset 22" in blocked["<model>"]


def test_constant_cumsum_axis_passes():
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis_const")
    nodes = [helper.make_node("CumSum", ["x", "axis_const"], ["y"], name="cumsum")]
    assert readiness_report(graph(nodes, [axis]))["ready"]
