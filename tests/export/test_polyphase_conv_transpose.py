"""The polyphase rewrite of ConvTranspose computes the same function (random weights, several
kernel / stride / padding combinations) and leaves no ConvTranspose behind.

    python -m pytest -q tests/export/test_polyphase_conv_transpose.py
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.nn import functional as F

from export.rewrites.polyphase_conv_transpose import (
    polyphase_conv_transpose,
    polyphase_weight,
)
from models.graph_contract import REWRITTEN_CONV_TRANSPOSE_STRIDES
from models.piper.onnx_contract import convtranspose_hop


def conv_transpose_graph(weight: np.ndarray, bias: np.ndarray | None, stride: int, pads: tuple[int, int],
                         output_padding: int = 0, group: int = 1) -> onnx.ModelProto:
    """One ConvTranspose between a LeakyRelu and a Tanh (neighbours stay wired), time axis dynamic."""
    in_channels, out_channels = weight.shape[0], weight.shape[1] * group
    initializers = [numpy_helper.from_array(weight, "up.weight")]
    inputs = ["act", "up.weight"]
    if bias is not None:
        initializers.append(numpy_helper.from_array(bias, "up.bias"))
        inputs.append("up.bias")
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["act"], alpha=0.1),
        helper.make_node("ConvTranspose", inputs, ["up"], name="/dec/ups.0/ConvTranspose", strides=[stride],
                         pads=list(pads), kernel_shape=[weight.shape[2]], output_padding=[output_padding],
                         group=group),
        helper.make_node("Tanh", ["up"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv_transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", in_channels, "frames"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_channels, "samples"])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(
    "in_channels, out_channels, kernel, stride, pads, output_padding, with_bias",
    [
        (12, 6, 16, 8, (4, 4), 0, True),  # the Lite decoder's ups: x8, kernel 16
        (18, 1, 16, 4, (0, 0), 0, False),  # the Lite iSTFT head: 9 bins x (re, im) -> samples, hop 4
        (8, 4, 4, 2, (1, 1), 0, True),  # HiFi-GAN's x2 stages
        (5, 7, 7, 3, (2, 1), 1, True),  # kernel not a multiple of the stride, asymmetric pads, output_padding
        (4, 3, 3, 5, (0, 0), 0, True),  # kernel shorter than the stride: phases of zeros
        (6, 6, 5, 1, (2, 2), 0, False),  # stride 1: a flipped ordinary convolution
    ],
)
def test_polyphase_graph_equals_conv_transpose(in_channels, out_channels, kernel, stride, pads, output_padding,
                                               with_bias):
    generator = np.random.default_rng(kernel * 100 + stride)
    weight = generator.standard_normal((in_channels, out_channels, kernel)).astype(np.float32)
    bias = generator.standard_normal(out_channels).astype(np.float32) if with_bias else None
    model = conv_transpose_graph(weight, bias, stride, pads, output_padding)
    rewritten, report = polyphase_conv_transpose(model)
    assert report == {"/dec/ups.0/ConvTranspose": "rewritten"}
    assert "ConvTranspose" not in {node.op_type for node in rewritten.graph.node}
    assert {t.name for t in rewritten.graph.initializer}.isdisjoint({"up.weight", "up.bias"})
    onnx.checker.check_model(rewritten, full_check=True)
    # The stride stays readable: Piper's runtime takes its samples per frame from the upsampling strides.
    metadata = {prop.key: prop.value for prop in rewritten.metadata_props}
    assert json.loads(metadata[REWRITTEN_CONV_TRANSPOSE_STRIDES]) == {"/dec/ups.0/ConvTranspose": stride}
    assert convtranspose_hop(rewritten) == convtranspose_hop(model) == stride
    for batch, frames in ((1, 1), (2, 37)):  # one frame: the shortest input, where edge handling shows
        x = generator.standard_normal((batch, in_channels, frames)).astype(np.float32)
        reference = F.conv_transpose1d(torch.from_numpy(np.where(x > 0, x, 0.1 * x)), torch.from_numpy(weight),
                                       None if bias is None else torch.from_numpy(bias), stride=stride,
                                       output_padding=output_padding)
        reference = torch.tanh(reference[:, :, pads[0]: reference.shape[-1] - pads[1]]).numpy()
        original, polyphase = run(model, x), run(rewritten, x)
        assert polyphase.shape == original.shape == reference.shape
        np.testing.assert_allclose(original, reference, rtol=0, atol=1e-5)
        np.testing.assert_allclose(polyphase, original, rtol=0, atol=1e-5)


def test_polyphase_weight_places_phase_r_of_channel_co_at_row_co_times_stride_plus_r():
    weight = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)  # (C_in, C_out, K)
    phases = polyphase_weight(weight, stride=2)  # (C_out * 2, C_in, 3): kernel padded to 6
    assert phases.shape == (6, 2, 3)
    # row co * 2 + r, tap t holds W[:, co, (2 - t) * 2 + r] (zero past K)
    np.testing.assert_array_equal(phases[1 * 2 + 0, :, :], weight[:, 1, [4, 2, 0]])
    np.testing.assert_array_equal(phases[2 * 2 + 1, :, 1:], weight[:, 2, [3, 1]])
    np.testing.assert_array_equal(phases[2 * 2 + 1, :, 0], 0)


def test_grouped_conv_transpose_is_left_and_named():
    weight = np.ones((4, 2, 4), dtype=np.float32)
    model = conv_transpose_graph(weight, None, stride=2, pads=(1, 1), group=2)
    rewritten, report = polyphase_conv_transpose(model)
    assert report == {"/dec/ups.0/ConvTranspose": "group=2"}
    assert [node.op_type for node in rewritten.graph.node] == ["LeakyRelu", "ConvTranspose", "Tanh"]


def test_bad_weight_is_refused_by_name():
    with pytest.raises(ValueError, match=r"\(C_in, C_out, K\)"):
        polyphase_weight(np.ones((2, 3), dtype=np.float32), stride=2)
