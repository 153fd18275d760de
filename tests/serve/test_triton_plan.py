"""The Triton repository's TensorRT entry: model.plan built beside model.onnx, the tensorrt_plan config,
and an empty slot with the builder's own reason when the graph is refused.

    python -m pytest -q tests/serve/test_triton_plan.py
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.settings import TensorRTSettings
from models.family import ServedTensor, TritonLayout
from models.registry import FAMILIES, get_family
from serve.triton_repo import BatchingSettings, VariantGraph, plan_settings, write_repository

CHANNELS = 4
LAYOUT = TritonLayout(  # a decoder-shaped graph served as it is: z (B, C, T) -> audio (B, C, T)
    batchable_graph=lambda graph: graph,
    inputs=lambda graph: (ServedTensor("z", "float32", (CHANNELS, -1)),),
    outputs=lambda graph: (ServedTensor("audio", "float32", (CHANNELS, -1)),),
)
BATCHING = BatchingSettings(max_batch_size=8, preferred_batch_sizes=(2, 4), instance_kind="gpu")
SETTINGS = TensorRTSettings(axis_ranges={"frames": [2, 64, 512]}, workspace_mib=64)


@pytest.fixture
def decoder_family(monkeypatch):
    family = dataclasses.replace(get_family("piper"), name="decoder_only", triton=LAYOUT)
    monkeypatch.setitem(FAMILIES, "decoder_only", family)
    return family.name


def graph(nonzero: bool = False) -> onnx.ModelProto:
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    audio = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch_size", CHANNELS, "frames"])
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((CHANNELS, CHANNELS, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["z", "w"], ["audio"], pads=[1, 1], name="conv")]
    outputs = [audio]
    if nonzero:  # the original Piper graph's alignment op
        nodes.append(helper.make_node("NonZero", ["z"], ["where"], name="/dp/flows.7/NonZero"))
        outputs.append(helper.make_tensor_value_info("where", TensorProto.INT64, None))
    return helper.make_model(helper.make_graph(nodes, "decoder", [z], outputs, [weight]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_triton_plan_slot_holds_the_built_plan_with_a_batch_range_triton_can_fill(decoder_family, tmp_path):
    variant = VariantGraph("lite", decoder_family, "bundled:joe", graph())
    configs = write_repository(variant, tmp_path, BATCHING, SETTINGS)
    plan = tmp_path / "tts_lite_trt" / "1" / "model.plan"
    assert plan.is_file() and plan.stat().st_size > 0
    text = configs["tts_lite_trt"].read_text()
    assert 'platform: "tensorrt_plan"' in text and "max_batch_size: 8" in text and "kind: KIND_GPU" in text
    assert "# 1/model.plan: built from tts_lite/1/model.onnx by tensorrt" in text and "fp32" in text
    assert 'backend: "onnxruntime"' in configs["tts_lite"].read_text()  # the onnxruntime entry beside it
    assert plan_settings(SETTINGS, BATCHING).axis_ranges == {"frames": [2, 64, 512], "batch_size": [1, 4, 8]}


def test_triton_plan_slot_stays_empty_with_the_parsers_reason_for_a_refused_graph(decoder_family, tmp_path):
    variant = VariantGraph("original_onnx", decoder_family, "bundled:joe", graph(nonzero=True))
    configs = write_repository(variant, tmp_path, BATCHING, SETTINGS)
    text = configs["tts_original_onnx_trt"].read_text()
    if "not built (failed: ONNX parser:" not in text:
        pytest.skip("this TensorRT imports NonZero (full TensorRT): the graph builds")
    assert "/dp/flows.7/NonZero" in text and "--load-model=tts_original_onnx" in text
    assert not (tmp_path / "tts_original_onnx_trt" / "1" / "model.plan").exists()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert all(line.startswith("# ") or line == "#" for line in header)  # the reason stays inside comments


def test_triton_repository_without_a_plan_when_asked(decoder_family, tmp_path):
    configs = write_repository(VariantGraph("lite", decoder_family, "bundled:joe", graph()), tmp_path, BATCHING, None)
    assert not any((tmp_path / "tts_lite_trt" / "1").iterdir())
    assert "not built (no plan was asked for)" in configs["tts_lite_trt"].read_text()
