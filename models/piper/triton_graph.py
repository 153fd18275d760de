"""Make a prepared Piper graph batchable by Triton's dynamic batcher, and state its served tensors.

Triton's ONNX backend (with ``max_batch_size > 0``) concatenates requests along the first
dimension of every input, so every input needs a batch dimension first. The Piper contract's
``scales`` is one (3,) vector for the whole batch; here it becomes a per-request (B, 3) input.
The graph read ``scales`` through three ``Gather`` nodes whose scalar outputs each scale one
rank-3 tensor by a ``Mul`` (prior noise (B, C, T_frames), widths (B, 1, T_text), duration noise
(B, 2, T_text)); each Gather is replaced by a (B, 1, 1) slice, so row b of the batch is synthesized
with row b's scales, exactly as if it had been run alone.

The durations output (the graph's ``Ceil``, added by ``prepare_graph``) gets the plain name
``durations`` for Triton clients::

    graph = triton_graph(prepare_graph(PiperVoiceFiles.resolve("bundled:joe").onnx_path))
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from models.family import ServedTensor, TritonLayout
from models.piper.onnx_runtime import _duration_output_name, _latent_channels

SCALE_NAMES = ("noise_scale", "length_scale", "noise_scale_w")  # the column order of ``scales``


def _constant_index(model: onnx.ModelProto, name: str) -> int:
    """The value of the scalar index ``name`` (a Constant node's output or an initializer)."""
    for initializer in model.graph.initializer:
        if initializer.name == name:
            return int(numpy_helper.to_array(initializer))
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return int(numpy_helper.to_array(node.attribute[0].t))
    raise ValueError(f"the index {name!r} of a Gather on 'scales' is not a constant; cannot make 'scales' batched")


def _with_batched_scales(model: onnx.ModelProto) -> onnx.ModelProto:
    scales_input = next((i for i in model.graph.input if i.name == "scales"), None)
    if scales_input is None:
        raise ValueError("graph has no 'scales' input: give a Piper graph made by prepare_graph")
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] == "scales"]
    if len(gathers) != 3 or any(n.input[0] == "scales" for n in model.graph.node if n not in gathers):
        raise ValueError("expected 'scales' read by exactly three Gather nodes (Piper's export); "
                         f"found {len(gathers)} Gathers among its consumers")
    scales_input.type.CopyFrom(
        onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, ["batch_size", len(SCALE_NAMES)])
    )
    axes = numpy_helper.from_array(np.array([2], np.int64), "scales_batched/axes")
    model.graph.initializer.append(axes)
    unsqueeze = onnx.helper.make_node("Unsqueeze", ["scales", axes.name], ["scales_batched/b31"],
                                      name="scales_batched/Unsqueeze")  # (B, 3, 1)
    replacements = [unsqueeze]
    for gather in gathers:
        column = _constant_index(model, gather.input[1])
        bounds = [numpy_helper.from_array(np.array([value], np.int64), f"scales_batched/{label}_{column}")
                  for label, value in (("start", column), ("end", column + 1), ("axis", 1))]
        model.graph.initializer.extend(bounds)
        replacements.append(onnx.helper.make_node(
            "Slice", ["scales_batched/b31", *(b.name for b in bounds)], [gather.output[0]],
            name=f"scales_batched/Slice_{column}",
        ))  # (B, 1, 1): broadcasts per row in the Mul that consumed the scalar
    position = min(list(model.graph.node).index(g) for g in gathers)
    for gather in gathers:
        model.graph.node.remove(gather)
    stale = [info for info in model.graph.value_info if info.name in {g.output[0] for g in gathers}]
    for info in stale:  # recorded as scalars; they are (B, 1, 1) now
        model.graph.value_info.remove(info)
    for offset, node in enumerate(replacements):
        model.graph.node.insert(position + offset, node)
    return model


def _with_named_durations(model: onnx.ModelProto) -> onnx.ModelProto:
    ceil_output = _duration_output_name(model)
    if ceil_output is None:
        raise ValueError("graph has no durations output: give a Piper graph made by prepare_graph")
    output = next(o for o in model.graph.output if o.name == ceil_output)
    model.graph.output.remove(output)
    model.graph.node.append(onnx.helper.make_node("Identity", [ceil_output], ["durations"], name="durations/Identity"))
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("durations", onnx.TensorProto.FLOAT, ["batch_size", 1, "phonemes"])
    )
    return model


def triton_graph(prepared: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``prepared`` with ``scales`` (B, 3) and a ``durations`` (B, 1, T_text) output."""
    model = onnx.ModelProto()
    model.CopyFrom(prepared)
    return _with_named_durations(_with_batched_scales(model))


def served_inputs(graph: onnx.ModelProto) -> tuple[ServedTensor, ...]:
    """The inputs of ``triton_graph``'s graph, batch dimension excluded; ``sid`` only for a
    multi-speaker voice."""
    inputs = (
        ServedTensor("input", "int64", (-1,)),  # (B, T_text) phoneme ids, right-padded
        ServedTensor("input_lengths", "int64", (), batch_only=True),  # (B,)
        ServedTensor("scales", "float32", (len(SCALE_NAMES),)),  # (B, 3): noise_scale, length_scale, noise_scale_w
        ServedTensor("duration_noise", "float32", (2, -1)),  # (B, 2, >= T_text)
        ServedTensor("prior_noise", "float32", (_latent_channels(graph), -1)),  # (B, C_latent, >= T_frames)
    )
    if "sid" in {graph_input.name for graph_input in graph.graph.input}:
        inputs += (ServedTensor("sid", "int64", (), batch_only=True),)  # (B,) speaker ids
    return inputs


def served_outputs(graph: onnx.ModelProto) -> tuple[ServedTensor, ...]:
    return (
        ServedTensor("output", "float32", (1, 1, -1)),  # (B, 1, 1, T_audio), right-padded
        ServedTensor("durations", "float32", (1, -1)),  # (B, 1, T_text) frames per phoneme id
    )


TRITON = TritonLayout(batchable_graph=triton_graph, inputs=served_inputs, outputs=served_outputs)
