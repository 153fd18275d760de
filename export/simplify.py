"""Simplify an exported graph with onnxsim and onnxslim; keep the smallest one that still computes the same.

    from export.simplify import simplify_graph
    simplify_graph("teacher.onnx", "teacher.simplified.onnx", feeds=[{...graph inputs...}])
    # {"chosen": "onnxslim", "nodes": {"exported": 1172, "onnxsim": 1172, "onnxslim": 1172}, "rejected": {}, ...}

"The same" is checked in onnxruntime on the caller's feeds (real sentences; onnxsim's own check
feeds random ids, which can ask for more frames than the noise covers): every output within
``tolerance_of_peak`` of the exported graph's, relative to that output's peak. On a tie the
exported graph is kept unchanged. The dynamo exporter already folds constants, so on the bundled
teacher neither tool removes a node (1172 -> 1172 both); on TorchScript-exported graphs they cut
about 60% (ENV_NOTES).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxsim
import onnxslim

from core.atomic_io import atomic_write

log = logging.getLogger(__name__)
DEFAULT_TOLERANCE_OF_PEAK = 1e-5


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]


def _max_diff_of_peak(candidate: list[list[np.ndarray]], reference: list[list[np.ndarray]]) -> float:
    worst = 0.0
    for outputs, reference_outputs in zip(candidate, reference):
        for ours, theirs in zip(outputs, reference_outputs):
            if ours.shape != theirs.shape:
                return float("inf")
            peak = float(np.abs(theirs).max()) or 1.0
            worst = max(worst, float(np.abs(ours.astype(np.float64) - theirs).max()) / peak)
    return worst


def simplify_graph(source: str | Path, target: str | Path, feeds: list[dict[str, np.ndarray]],
                   tolerance_of_peak: float = DEFAULT_TOLERANCE_OF_PEAK) -> dict:
    """Write the smallest matching graph of {exported, onnxsim, onnxslim} to ``target`` (atomically); JSON-able summary."""
    if not feeds:
        raise ValueError("simplify_graph needs at least one feed dict to check the simplified graphs against")
    exported = onnx.load(str(source))
    reference = _run(exported, feeds)
    candidates = {"exported": exported}
    rejected: dict[str, str] = {}
    try:
        simplified, checked = onnxsim.simplify(exported, check_n=0)
        candidates["onnxsim"] = simplified
    except Exception as error:  # onnxsim raises plain RuntimeError/ValueError from its C++ core
        rejected["onnxsim"] = f"failed: {error}"
    try:
        candidates["onnxslim"] = onnxslim.slim(exported)
    except Exception as error:  # idem for onnxslim's passes
        rejected["onnxslim"] = f"failed: {error}"
    nodes = {name: len(model.graph.node) for name, model in candidates.items()}
    diffs = {"exported": 0.0}
    for name in ("onnxsim", "onnxslim"):
        if name in candidates:
            diffs[name] = _max_diff_of_peak(_run(candidates[name], feeds), reference)
            if diffs[name] > tolerance_of_peak:
                rejected[name] = f"outputs moved {diffs[name]:.2e} of peak (> {tolerance_of_peak:.0e})"
    matching = [name for name in candidates if name not in rejected]
    chosen = min(matching, key=lambda name: (nodes[name], name != "exported"))
    atomic_write(Path(target), lambda tmp: onnx.save(candidates[chosen], tmp))
    log.info("simplify %s: nodes %s, kept %s", source, nodes, chosen)
    return {"chosen": chosen, "path": str(target), "nodes": nodes, "max_diff_of_peak": diffs, "rejected": rejected}
