"""The pipeline's graph step: every scored variant gets an ONNX graph in its family's contract, its
op histogram, a TensorRT engine built from every graph it has and, for PyTorch variants, parity
against PyTorch.

    metrics, tags, artifacts = variant_graph(variant, settings, calibration_sequences, work_dir)

* PyTorch variants are exported by export/variant_export.py (export, simplify, check, parity,
  onnxruntime session, TensorRT engine where installed);
* onnxruntime variants already are a graph: the original voice's is prepared by its family's
  reference runtime (``family.reference.prepare_graph``: explicit sampling inputs, say) so that
  every deployed graph takes the same inputs; quantized graphs are used as they are.

``artifacts["onnx"]`` is the graph that selection may deploy (compress/registration.py). A graph
that cannot be made (an exporter error, say) is reported as ``graph_status=failed: <why>`` and the
run goes on: one variant's export never costs the others their scores.

TensorRT: every graph of the variant (the deployable one, the family's other graphs, and graphs a
stage made, such as int8_modelopt's Q/DQ decoder ``qdq_decoder_onnx``) goes through the real
builder (export/tensorrt_support.py ``engine_readiness``; TensorRT-RTX builds without a GPU). The
variant's run gets, for the deployable graph, ``trt_ready`` (the builder's verdict),
``trt_build_s``, ``trt_plan_mib`` and ``trt_layers_<precision>``, and the tags ``tensorrt_engine``
(built / failed / unavailable), ``tensorrt_backend`` and ``tensorrt_engine_reason`` (the parser's
or builder's error verbatim); another graph's names carry its name (``trt_qdq_decoder_ready``,
``tensorrt_engine.qdq_decoder``). ``tensorrt_report.json`` holds every graph's full report
(layers, the op table's hint) and is logged with the run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import onnx

from compress.registration import GRAPH_ARTIFACT
from compress.settings import RunSettings
from compress.variants import Variant
from core.atomic_io import write_text_atomic
from export.graph_checks import check_graph
from export.settings import EngineSettings
from export.tensorrt_support import engine_readiness, readiness_report
from models.family import ReferenceRuntime
from models.interface import Utterance
from models.registry import family_of


MAIN_GRAPH = "main"  # the tensorrt_report.json key of the graph selection may deploy
REPORT_NAME = "tensorrt_report.json"
TAG_REASON_CHARS = 480  # an error's head; the full text is in tensorrt_report.json


def _graph_readiness(graph: Path, plan: Path, engine: EngineSettings) -> dict:
    """The builder's report for ``graph`` (engine.build_tensorrt), else the op table's alone. A graph
    the builder cannot be set up for (a dynamic axis without a range, say) is reported, not fatal."""
    hint = readiness_report(graph)
    if engine.build_tensorrt:
        try:
            return engine_readiness(graph, plan, engine.tensorrt)
        except Exception as error:  # noqa: BLE001 (reported: see the module docstring)
            return {"ready": False, "verdict_source": "not built: the engine could not be set up",
                    "engine": {"status": "failed", "reason": f"{type(error).__name__}: {error}"},
                    "op_table_hint": {"ready": hint["ready"], "blockers": hint["blockers"],
                                      "warnings": hint["warnings"]}}
    return {"ready": hint["ready"], "verdict_source": "op table only: engine.build_tensorrt is false",
            "engine": {"status": "skipped", "reason": "engine.build_tensorrt is false"},
            "op_table_hint": {"ready": hint["ready"], "blockers": hint["blockers"], "warnings": hint["warnings"]}}


def _stage_graphs(variant: Variant) -> dict[str, Path]:
    """Graphs a stage made besides the deployable one: artifact ``<name>_onnx`` -> ``<name>``."""
    return {key.removesuffix("_onnx"): Path(path) for key, path in variant.artifacts.items()
            if key != GRAPH_ARTIFACT and Path(path).suffix == ".onnx" and Path(path).is_file()}


def _engine_logs(graphs: dict[str, tuple[Path, Path]], engine: EngineSettings,
                 work_dir: Path) -> tuple[dict[str, float], dict[str, str], Path]:
    """Build every graph (name -> (graph, plan)); metrics and tags for MLflow, and the written report."""
    reports = {name: _graph_readiness(graph, plan, engine) for name, (graph, plan) in graphs.items()}
    metrics, tags = {}, {}
    for name, report in reports.items():
        prefix, suffix = ("trt_", "") if name == MAIN_GRAPH else (f"trt_{name}_", f".{name}")
        built = report["engine"]
        hint = report["op_table_hint"]
        metrics.update({f"{prefix}ready": float(report["ready"]),
                        f"{prefix}blockers": float(len(hint["blockers"])),
                        f"{prefix}warnings": float(len(hint["warnings"]))})
        if built["status"] == "built":
            metrics.update({f"{prefix}build_s": built["build_time_s"], f"{prefix}plan_mib": built["plan_bytes"] / 2**20,
                            **{f"{prefix}layers_{precision}": float(count)
                               for precision, count in built["precision_counts"].items()}})
        tags[f"tensorrt_engine{suffix}"] = built["status"]
        tags[f"trt_verdict_source{suffix}"] = report["verdict_source"]
        if built.get("backend"):
            tags["tensorrt_backend"] = f"{built['backend']} {built['backend_version']}"
        if built.get("reason"):
            tags[f"tensorrt_engine_reason{suffix}"] = built["reason"][:TAG_REASON_CHARS]
    report_path = work_dir / REPORT_NAME
    write_text_atomic(report_path, json.dumps(reports, indent=1))
    return metrics, tags, report_path


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
            graphs = {MAIN_GRAPH: (graph, work_dir / f"{variant.name}.plan"),
                      **{name: (path, work_dir / f"{variant.name}.{name}.plan")
                         for name, path in _stage_graphs(variant).items()}}
            engine_metrics, engine_tags, report_path = _engine_logs(graphs, settings.engine, work_dir)
            metrics = {"graph_nodes": float(sum(checks["op_histogram"].values())), **engine_metrics}
            return (metrics, {"graph_status": "ok", **engine_tags},
                    {GRAPH_ARTIFACT: graph, "tensorrt_report": report_path})
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
    # The exporter built the main graph's plan already (<name>.plan): the same graph and settings reuse it.
    main_graph = next(name for name, path in report.graphs.items() if Path(path) == Path(report.simplified_path))
    graphs = {MAIN_GRAPH: (report.simplified_path, work_dir / f"{variant.name}.plan"),
              **{name: (Path(path), work_dir / f"{variant.name}.{name}.plan")
                 for name, path in report.graphs.items() if name != main_graph},
              **{name: (path, work_dir / f"{variant.name}.{name}.plan") for name, path in _stage_graphs(variant).items()}}
    engine_metrics, engine_tags, report_path = _engine_logs(graphs, settings.engine, work_dir)
    metrics = {"graph_nodes": float(sum(report.op_histogram.values())), **parity, **engine_metrics}
    tags = {"graph_status": "ok", "graph_precision": report.precision, **engine_tags}
    return metrics, tags, {GRAPH_ARTIFACT: report.simplified_path, "export_report": report.report_path,
                           "tensorrt_report": report_path}
