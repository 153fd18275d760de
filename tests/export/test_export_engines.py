"""Engines for exported graphs: TensorRT profile validation (builds: test_tensorrt_engine.py); onnxruntime sessions.

    python -m pytest -q tests/test_export_engines.py
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from core.config import ConfigError
from export.onnxruntime_engine import OrtEngineSettings, build_session
from export.tensorrt_engine import TensorRTSettings, profile_shapes


def piper_like_graph(path) -> onnx.ModelProto:
    """Inputs shaped like the exported Piper graph; the body just echoes one of them."""
    inputs = [
        helper.make_tensor_value_info("input", TensorProto.INT64, ["batch_size", "phonemes"]),
        helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
        helper.make_tensor_value_info("prior_noise", TensorProto.FLOAT, ["batch_size", 4, "frames"]),
    ]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch_size", 4, "frames"])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["prior_noise"], ["output"])], "g",
                                                inputs, [output]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return model


def test_profile_covers_every_dynamic_input_from_named_axis_ranges(tmp_path):
    model = piper_like_graph(tmp_path / "g.onnx")
    shapes = profile_shapes(model, TensorRTSettings().axis_ranges)
    assert set(shapes) == {"input", "prior_noise"}  # scales is static
    assert shapes["input"] == {"min": [1, 2], "opt": [4, 64], "max": [16, 400]}
    assert shapes["prior_noise"] == {"min": [1, 4, 2], "opt": [4, 4, 1024], "max": [16, 4, 6400]}
    with pytest.raises(ConfigError, match="frames"):
        profile_shapes(model, {"batch_size": [1, 1, 1], "phonemes": [2, 2, 2]})


@pytest.mark.parametrize("ranges, message", [
    ({"batch_size": [4, 2, 8]}, "min <= opt <= max"),
    ({"batch_size": [1, 2]}, r"\[min, opt, max\]"),
    ({"batch_size": [0, 1, 2]}, "1 <= min"),
])
def test_bad_axis_ranges_fail_at_start(ranges, message):
    with pytest.raises(ConfigError, match=message):
        TensorRTSettings(axis_ranges=ranges)


def test_onnxruntime_session_saves_the_optimized_model_and_falls_back_from_cuda_with_a_reason(tmp_path):
    piper_like_graph(tmp_path / "g.onnx")
    settings = OrtEngineSettings(intra_op_threads=1, graph_optimization_level="extended")
    built = build_session(tmp_path / "g.onnx", settings, device="cuda", optimized_path=tmp_path / "g.opt.onnx")
    assert built.optimized_path.is_file()
    if "CUDAExecutionProvider" not in built.providers:
        assert built.fallback_reason and built.providers == ["CPUExecutionProvider"]
    noise = -np.ones((2, 4, 5), np.float32)
    (output,) = built.session.run(None, {"input": np.zeros((2, 3), np.int64), "scales": np.ones(3, np.float32),
                                         "prior_noise": noise})
    assert np.array_equal(output, np.zeros_like(noise))
    with pytest.raises(ConfigError, match="graph_optimization_level"):
        OrtEngineSettings(graph_optimization_level="max")
