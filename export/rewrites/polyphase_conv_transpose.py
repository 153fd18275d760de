"""A 1-D ConvTranspose as a polyphase Conv + Reshape/Transpose/Slice: same function, ops with INT8 CPU kernels.

onnxruntime's CPU provider has no INT8 kernel for ConvTranspose, so in a QDQ graph it runs fp32
on dequantized weights (quantizing it only adds error). A transposed convolution of stride ``s``
is ``s`` ordinary convolutions interleaved ("polyphase"): output sample ``q * s + r`` is

    y[q * s + r] = sum_j x[q - j] . W[:, :, j * s + r],   j = 0 .. ceil(K / s) - 1

so one Conv with ``C_out * s`` output channels and ``ceil(K / s)`` taps (the phase kernels,
flipped, the kernel zero-padded to a multiple of ``s``) computes every phase at the input rate;
a Reshape to ``(B, C_out, s, Q)``, a Transpose to ``(B, C_out, Q, s)`` and a Reshape to
``(B, C_out, Q * s)`` interleave them, and a Slice removes ConvTranspose's ``pads``. It is exact
up to float summation order. The Conv runs at the input rate, where ConvTranspose's col2im
scatters at the output rate, so the rewrite is also faster in fp32.

    graph, rewritten = polyphase_conv_transpose(onnx.load("lite.onnx"))   # every eligible node replaced

A node is eligible when it is 1-D, ``group`` 1, dilation 1, ``auto_pad`` NOTSET and its weight
(and bias) are initializers; any other ConvTranspose is left as it is and named in the return.
The strides of the nodes replaced are kept in the graph's metadata
(``models.graph_contract.REWRITTEN_CONV_TRANSPOSE_STRIDES``): a runtime that reads a voice's
samples per frame from its upsampling strides (Piper's) still finds them.
"""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from models.graph_contract import REWRITTEN_CONV_TRANSPOSE_STRIDES

INT64_MAX = np.iinfo(np.int64).max


def polyphase_weight(weight: np.ndarray, stride: int) -> np.ndarray:
    """ConvTranspose weight (C_in, C_out, K) -> Conv weight (C_out * stride, C_in, ceil(K / stride)).

    Output channel ``co * stride + r`` holds phase ``r`` of output channel ``co``, its taps flipped
    (a Conv correlates where the transposed convolution's sum runs backwards over the input).
    """
    if weight.ndim != 3 or stride < 1:
        raise ValueError(f"polyphase_weight: weight shape {weight.shape}, stride {stride}; "
                         "give a (C_in, C_out, K) ConvTranspose1d weight and a stride >= 1")
    in_channels, out_channels, kernel = weight.shape
    taps = math.ceil(kernel / stride)
    padded = np.zeros((in_channels, out_channels, taps * stride), dtype=weight.dtype)
    padded[:, :, :kernel] = weight
    phases = padded.reshape(in_channels, out_channels, taps, stride)  # [ci, co, j, r] = W[ci, co, j * s + r]
    phases = phases[:, :, ::-1, :]  # tap t = taps - 1 - j
    return np.ascontiguousarray(phases.transpose(1, 3, 0, 2).reshape(out_channels * stride, in_channels, taps))


def _attribute(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _ineligible_reason(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> str:
    """Why ``node`` cannot be rewritten ("" when it can)."""
    weight = initializers.get(node.input[1])
    if weight is None:
        return "weight is not an initializer"
    if len(weight.dims) != 3:
        return f"weight has {len(weight.dims)} dims, not 3 (1-D ConvTranspose)"
    if len(node.input) > 2 and node.input[2] and node.input[2] not in initializers:
        return "bias is not an initializer"
    if _attribute(node, "group", 1) != 1:
        return f"group={_attribute(node, 'group', 1)}"
    if list(_attribute(node, "dilations", [1])) != [1]:
        return f"dilations={list(_attribute(node, 'dilations', [1]))}"
    auto_pad = _attribute(node, "auto_pad", b"NOTSET")
    if auto_pad not in (b"NOTSET", "NOTSET"):
        return f"auto_pad={auto_pad!r}"
    if _attribute(node, "output_shape", None) is not None:
        return "output_shape is set"
    return ""


def _replacement(node: onnx.NodeProto, weight: np.ndarray, bias: np.ndarray | None
                 ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes and initializers that compute ``node``'s output from its input."""
    stride = int(_attribute(node, "strides", [1])[0])
    pad_begin, pad_end = (int(p) for p in _attribute(node, "pads", [0, 0]))
    output_padding = int(_attribute(node, "output_padding", [0])[0])
    out_channels, kernel = weight.shape[1], weight.shape[2]
    taps = math.ceil(kernel / stride)
    # The Conv yields Q = T + taps - 1 frames of ``stride`` samples; ConvTranspose's full output is
    # (T - 1) * stride + kernel of them, so ``tail`` samples of zero-padded kernel end the Q * stride.
    tail = taps * stride - kernel + pad_end - output_padding
    if tail < 0:
        raise ValueError(f"ConvTranspose {node.name!r}: output_padding={output_padding} reaches past the kernel's "
                         f"last sample (kernel {kernel}, stride {stride}, pads {pad_begin},{pad_end}); "
                         "the rewrite takes output_padding <= ceil(K/s)*s - K + pads_end")
    prefix = f"{node.name or node.output[0]}/polyphase"
    conv_weight = numpy_helper.from_array(polyphase_weight(weight, stride), f"{prefix}.weight")
    initializers = [
        conv_weight,
        numpy_helper.from_array(np.array([0, out_channels, stride, -1], dtype=np.int64), f"{prefix}.phase_shape"),
        numpy_helper.from_array(np.array([0, out_channels, -1], dtype=np.int64), f"{prefix}.audio_shape"),
        numpy_helper.from_array(np.array([pad_begin], dtype=np.int64), f"{prefix}.starts"),
        numpy_helper.from_array(np.array([-tail if tail else INT64_MAX], dtype=np.int64), f"{prefix}.ends"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), f"{prefix}.axes"),
    ]
    conv_inputs = [node.input[0], conv_weight.name]
    if bias is not None:  # every output sample of ConvTranspose gets its channel's bias: every phase does
        initializers.append(numpy_helper.from_array(np.repeat(bias, stride).astype(bias.dtype), f"{prefix}.bias"))
        conv_inputs.append(f"{prefix}.bias")
    nodes = [
        helper.make_node("Conv", conv_inputs, [f"{prefix}/conv_out"], name=f"{prefix}/Conv",
                         kernel_shape=[taps], pads=[taps - 1, taps - 1], strides=[1]),  # (B, C_out * s, Q)
        helper.make_node("Reshape", [f"{prefix}/conv_out", f"{prefix}.phase_shape"], [f"{prefix}/phases"],
                         name=f"{prefix}/Reshape_phases"),  # (B, C_out, s, Q)
        helper.make_node("Transpose", [f"{prefix}/phases"], [f"{prefix}/interleaved"],
                         name=f"{prefix}/Transpose", perm=[0, 1, 3, 2]),  # (B, C_out, Q, s)
        helper.make_node("Reshape", [f"{prefix}/interleaved", f"{prefix}.audio_shape"], [f"{prefix}/full"],
                         name=f"{prefix}/Reshape_samples"),  # (B, C_out, Q * s)
        helper.make_node("Slice", [f"{prefix}/full", f"{prefix}.starts", f"{prefix}.ends", f"{prefix}.axes"],
                         [node.output[0]], name=f"{prefix}/Slice"),  # (B, C_out, (T - 1) * s + K - pads + op)
    ]
    return nodes, initializers


def polyphase_conv_transpose(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of ``model`` with every eligible ConvTranspose rewritten; returns it and
    {node name: "rewritten" or why it was left}."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    report: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    replaced_weights: set[str] = set()
    strides = _recorded_strides(rewritten)  # a graph rewritten before keeps what it recorded
    for node in graph.node:
        if node.op_type != "ConvTranspose":
            nodes.append(node)
            continue
        reason = _ineligible_reason(node, initializers)
        if reason:
            report[node.name] = reason
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        has_bias = len(node.input) > 2 and node.input[2]
        bias = numpy_helper.to_array(initializers[node.input[2]]) if has_bias else None
        new_nodes, new_initializers = _replacement(node, weight, bias)
        nodes.extend(new_nodes)
        graph.initializer.extend(new_initializers)
        replaced_weights.update(node.input[1:3] if has_bias else node.input[1:2])
        report[node.name] = "rewritten"
        strides[node.name] = int(_attribute(node, "strides", [1])[0])
    del graph.node[:]
    graph.node.extend(nodes)
    # The ConvTranspose weights no other node reads are dropped, so the file does not carry both.
    still_read = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name not in replaced_weights or tensor.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if strides:
        props = {prop.key: prop.value for prop in rewritten.metadata_props}
        helper.set_model_props(rewritten, props | {REWRITTEN_CONV_TRANSPOSE_STRIDES: json.dumps(strides)})
    return rewritten, report


def _recorded_strides(model: onnx.ModelProto) -> dict[str, int]:
    for prop in model.metadata_props:
        if prop.key == REWRITTEN_CONV_TRANSPOSE_STRIDES:
            return json.loads(prop.value)
    return {}
