"""The pipeline's graph step: every scored variant gets an ONNX graph in its family's contract, its
op histogram, a TensorRT-readiness report and, for PyTorch variants, parity against PyTorch.

    metrics, tags, artifacts = variant_graph(variant, settings, calibration_sequences, work_dir)

* PyTorch variants are exported by export/variant_export.py (export, simplify, check, parity,
  onnxruntime session, TensorRT engine where installed);
* onnxruntime variants already are a graph: the original voice's is prepared by its family's
  reference runtime (``family.reference.prepare_graph``: explicit sampling inputs, say) so that
  every deployed graph takes the same inputs; quantized graphs are used as they are.

``artifacts["onnx"]`` is the graph that selection may deploy (compress/registration.py). A graph
that cannot be made (an exporter error, say) is reported as ``graph_status=failed: <why>`` and the
run goes on: one variant's export never costs the others their scores.
"""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from compress.registration import GRAPH_ARTIFACT
from compress.settings import RunSettings
from compress.variants import Variant
from export.graph_checks import check_graph
from export.tensorrt_support import readiness_report
from models.family import ReferenceRuntime
from models.interface import Utterance
from models.registry import family_of


def _readiness_metrics(report: dict | None) -> dict[str, float]:
    if report is None:
        return {}
    return {"trt_ready": float(report["ready"]), "trt_blockers": float(len(report["blockers"])),
            "trt_warnings": float(len(report["warnings"]))}


def _prepared_original(reference: ReferenceRuntime, original_graph: Path, work_dir: Path) -> Path:
    path = work_dir / "original_prepared.onnx"
    if not path.is_file():  # a finished file is reused (resume)
        tmp = path.with_name(path.name + ".tmp")
        onnx.save(reference.prepare_graph(original_graph), str(tmp))
        os.replace(tmp, path)
    return path


def variant_graph(variant: Variant, settings: RunSettings, calibration: list[Utterance],
                  work_dir: Path) -> tuple[dict[str, float], dict[str, str], dict[str, Path]]:
    """(metrics, tags, artifacts) of ``variant``'s graph; see the module docstring."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        if variant.engine == "onnxruntime":
            model = variant.model
            reference = family_of(model).reference
            original_graph = reference.graph_path(model.voice)
            graph = model.graph_path if model.graph_path != original_graph else _prepared_original(
                reference, original_graph, work_dir)
            checks = check_graph(graph)
            readiness = readiness_report(graph)
            metrics = {"graph_nodes": float(sum(checks["op_histogram"].values())), **_readiness_metrics(readiness)}
            return metrics, {"graph_status": "ok", "trt_ready": str(readiness["ready"])}, {GRAPH_ARTIFACT: graph}
        if not settings.export.enabled:
            return {}, {"graph_status": "skipped: export.enabled is false"}, {}
        from export.variant_export import export_variant  # torch.onnx and onnxsim load only when exporting

        report = export_variant(variant.name, variant.model, work_dir, calibration, settings.export, settings.engine)
    except Exception as error:  # reported, not fatal: see the module docstring
        return {}, {"graph_status": f"failed: {type(error).__name__}: {error}"[:500]}, {}
    parity = {f"parity_{k}": float(v) for k, v in report.parity.items()
              if isinstance(v, (int, float)) and v is not None and not isinstance(v, bool)}
    if report.parity.get("within_budget") is not None:
        parity["parity_within_budget"] = float(report.parity["within_budget"])
    metrics = {"graph_nodes": float(sum(report.op_histogram.values())), **parity,
               **_readiness_metrics(report.readiness)}
    tags = {"graph_status": "ok", "graph_precision": report.precision, "tensorrt_engine": report.engine_status,
            "trt_ready": str(report.readiness["ready"]) if report.readiness else "not checked"}
    if report.engine_reason:
        tags["tensorrt_engine_reason"] = report.engine_reason[:400]
    return metrics, tags, {GRAPH_ARTIFACT: report.simplified_path, "export_report": report.report_path}
