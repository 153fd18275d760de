"""Checks every exported graph passes: the ONNX checker, shape inference, and an op histogram.

    from export.graph_checks import check_graph
    check_graph("outputs/export/teacher.onnx")
    # {"checker": "ok", "shape_inference": "ok", "nodes": 1203, "opset": 18, "op_histogram": {"Mul": 198, ...}, ...}
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import onnx


def load(model_or_path: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    return model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load(str(model_or_path))


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, including those inside If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from all_nodes(subgraph)


def op_histogram(model_or_path: onnx.ModelProto | str | Path) -> dict[str, int]:
    """{op type (domain-qualified unless standard): count}, most frequent first."""
    model = load(model_or_path)
    counts = Counter(f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
                     for node in all_nodes(model.graph))
    return dict(counts.most_common())


def default_opset(model: onnx.ModelProto) -> int:
    return next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))


def _dims(value_info: onnx.ValueInfoProto) -> list:
    return [dim.dim_param or dim.dim_value for dim in value_info.type.tensor_type.shape.dim]


def check_graph(model_or_path: onnx.ModelProto | str | Path) -> dict:
    """JSON-able: checker and shape-inference verdicts ("ok" or the error), node count, opset, histogram, I/O shapes."""
    model = load(model_or_path)
    try:
        onnx.checker.check_model(model)
        checker = "ok"
    except onnx.checker.ValidationError as error:
        checker = f"failed: {error}"
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        shape_inference = "ok"
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as error:
        shape_inference = f"failed: {error}"
    return {
        "checker": checker,
        "shape_inference": shape_inference,
        "nodes": sum(1 for _ in all_nodes(model.graph)),
        "opset": default_opset(model),
        "op_histogram": op_histogram(model),
        "inputs": {value.name: _dims(value) for value in model.graph.input},
        "outputs": {value.name: _dims(value) for value in model.graph.output},
    }
