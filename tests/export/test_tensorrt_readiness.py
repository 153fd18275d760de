"""The readiness report's verdict is the real builder's; the operator table stays beside it as a hint.

    python -m pytest -q tests/export/test_tensorrt_readiness.py
"""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import export.tensorrt_engine as tensorrt_engine
from export.settings import TensorRTSettings
from export.tensorrt_support import engine_readiness

SETTINGS = TensorRTSettings(axis_ranges={"batch_size": [1, 2, 4], "frames": [2, 16, 64]}, workspace_mib=64)


def scatter_add_graph(path):
    """Relative attention's per-offset sum as our exporter wrote it before it became a gather:
    ScatterElements(reduction=add)."""
    weights = helper.make_tensor_value_info("weights", TensorProto.FLOAT, ["batch_size", 4, "frames"])
    summed = helper.make_tensor_value_info("summed", TensorProto.FLOAT, ["batch_size", 4, "frames"])
    index = numpy_helper.from_array(np.zeros((1, 4, 1), np.int64), "index_row")
    nodes = [helper.make_node("Shape", ["weights"], ["shape"], name="/Shape"),
             helper.make_node("Expand", ["index_row", "shape"], ["index"], name="/Expand"),
             helper.make_node("Mul", ["weights", "zero"], ["zeros"], name="/zeros_like"),
             helper.make_node("ScatterElements", ["zeros", "index", "weights"], ["summed"], axis=2, reduction="add",
                              name="/enc_p/encoder/attn_layers.0/ScatterElements")]
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    onnx.save(helper.make_model(helper.make_graph(nodes, "scatter_add", [weights], [summed], [index, zero]),
                                opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def relu_graph(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 4, "frames"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch_size", 4, "frames"])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_the_builder_overrules_the_table_and_the_table_stays_as_a_hint(tmp_path):
    report = engine_readiness(scatter_add_graph(tmp_path / "g.onnx"), tmp_path / "g.plan", SETTINGS)
    assert report["op_table_hint"]["ready"]  # the table only warns about reduction=add
    assert [w["op"] for w in report["op_table_hint"]["warnings"]] == ["ScatterElements"]
    backend = report["engine"]["backend"]
    assert report["verdict_source"] == f"{backend} {report['engine']['backend_version']} builder"
    if backend == "tensorrt_rtx":
        assert not report["ready"] and report["engine"]["status"] == "failed"
        assert "Unsupported reduction type" in report["engine"]["reason"]
    json.dumps(report)  # logged as it is


def test_a_built_graph_is_ready_with_its_engine_figures(tmp_path):
    report = engine_readiness(relu_graph(tmp_path / "g.onnx"), tmp_path / "g.plan", SETTINGS)
    assert report["ready"] and report["op_table_hint"]["ready"]
    engine = report["engine"]
    assert engine["status"] == "built" and engine["plan_bytes"] > 0 and engine["build_time_s"] > 0
    assert engine["precision_counts"].get("fp32", 0) >= 1 and engine["layers"]


def test_without_a_builder_the_table_decides_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorrt_engine, "import_backend", lambda: (None, "no TensorRT is installed here (test)"))
    report = engine_readiness(relu_graph(tmp_path / "g.onnx"), tmp_path / "g.plan", SETTINGS)
    assert report["ready"] and report["verdict_source"] == "op table only: no TensorRT is installed here (test)"
    assert report["engine"]["status"] == "unavailable"
