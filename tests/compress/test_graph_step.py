"""The pipeline's graph step builds a TensorRT engine from every graph of a variant and logs the builder's verdict.

    python -m pytest -q tests/compress/test_graph_step.py
"""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compress.graph_step import variant_graph
from compress.registration import GRAPH_ARTIFACT
from compress.run_config import settings_from_config
from compress.variants import Variant
from models.registry import get_family

CHANNELS = 4


def qdq_decoder_graph(path):
    """A Q/DQ conv in the form of int8_modelopt's decoder graph: symmetric, per-channel weight scales."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((CHANNELS, CHANNELS, 3)).astype(np.float32)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    audio = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    initializers = [
        numpy_helper.from_array(weight, "weight"),
        numpy_helper.from_array((np.abs(weight).reshape(CHANNELS, -1).max(1) / 127).astype(np.float32), "weight_scale"),
        numpy_helper.from_array(np.zeros(CHANNELS, np.int8), "weight_zero"),
        numpy_helper.from_array(np.array(0.05, np.float32), "z_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "z_zero"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["z", "z_scale", "z_zero"], ["z_q"]),
             helper.make_node("DequantizeLinear", ["z_q", "z_scale", "z_zero"], ["z_dq"]),
             helper.make_node("QuantizeLinear", ["weight", "weight_scale", "weight_zero"], ["w_q"], axis=0),
             helper.make_node("DequantizeLinear", ["w_q", "weight_scale", "weight_zero"], ["w_dq"], axis=0),
             helper.make_node("Conv", ["z_dq", "w_dq"], ["audio"], pads=[1, 1], name="conv")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "qdq", [z], [audio], initializers),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def settings(debug_config):
    resolved = debug_config("engine.tensorrt.axis_ranges.frames=[2,64,512]")
    return settings_from_config(resolved)


def onnxruntime_variant(name, graph_path, artifacts=None) -> Variant:
    model = SimpleNamespace(family="piper", voice="bundled:joe", graph_path=graph_path)
    return Variant(name=name, model=model, engine="onnxruntime", device="cpu", params_m=0.0, size_mb=0.0,
                   artifacts=dict(artifacts or {}))


def test_graph_step_builds_every_graph_and_the_original_piper_graph_is_refused_at_nonzero(settings, tmp_path):
    """The voice's own graph (prepared, as the pipeline deploys it) goes through the real builder and
    fails in its parser; the stage's Q/DQ graph beside it builds INT8 layers. Both land in the run."""
    original = get_family("piper").reference.graph_path("bundled:joe")
    qdq = qdq_decoder_graph(tmp_path / "qdq_decoder.onnx")
    variant = onnxruntime_variant("original_onnx", original, {"qdq_decoder_onnx": qdq})
    metrics, tags, artifacts = variant_graph(variant, settings, [], tmp_path / "graphs")
    assert tags["graph_status"] == "ok" and artifacts[GRAPH_ARTIFACT].name == "original_prepared.onnx"
    backend = tags["tensorrt_backend"]
    if backend.startswith("tensorrt_rtx"):
        assert tags["tensorrt_engine"] == "failed" and metrics["trt_ready"] == 0.0
        assert "NonZero" in tags["tensorrt_engine_reason"] and tags["tensorrt_engine_reason"].startswith("ONNX parser")
    assert metrics["trt_blockers"] >= 1  # the op table predicts it too: NonZero is a policy blocker
    assert tags["tensorrt_engine.qdq_decoder"] == "built" and metrics["trt_qdq_decoder_ready"] == 1.0
    assert metrics["trt_qdq_decoder_layers_int8"] >= 1 and metrics["trt_qdq_decoder_plan_mib"] > 0
    assert metrics["trt_qdq_decoder_build_s"] > 0
    assert tags["trt_verdict_source.qdq_decoder"] == f"{backend} builder"
    report = json.loads(artifacts["tensorrt_report"].read_text())
    assert set(report) == {"main", "qdq_decoder"}
    assert report["qdq_decoder"]["engine"]["layers"]
    assert any(b["op"] == "NonZero" for b in report["main"]["op_table_hint"]["blockers"])
    assert (tmp_path / "graphs" / "original_onnx.qdq_decoder.plan").is_file()


def test_graph_step_without_engine_builds_reports_the_table_and_says_why(settings, tmp_path):
    settings = dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, build_tensorrt=False))
    variant = onnxruntime_variant("int8_ort", qdq_decoder_graph(tmp_path / "int8.onnx"))
    metrics, tags, _ = variant_graph(variant, settings, [], tmp_path / "graphs")
    assert tags["tensorrt_engine"] == "skipped" and metrics["trt_ready"] == 1.0
    assert tags["trt_verdict_source"] == "op table only: engine.build_tensorrt is false"
    assert not list((tmp_path / "graphs").glob("*.plan"))
