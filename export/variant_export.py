"""One entry for the pipeline: export a PyTorch variant, simplify, check, report TensorRT readiness, measure parity.

    from export.variant_export import export_variant
    report = export_variant("fp16", fp16_voice, work_dir, calibration_sequences, settings.export, settings.engine)
    report.to_dict()          # JSON-able; also written to work_dir / "fp16.export.json"

The graphs come from the model's family (``family_of(model).graph_contracts(model)``). The
family's end-to-end graph (``synthesizer``; else its first) is the variant's main graph and goes
through every step:
1. export_graph -> ``<name>.onnx`` (the family's contract, dynamic batch and lengths);
2. simplify_graph -> ``<name>.simplified.onnx`` (the smallest of exported/onnxsim/onnxslim that matches);
3. check_graph (checker, shape inference, op histogram) and readiness_report (TensorRT 10);
4. onnx_torch_parity on ``export.parity_sentences`` sentences (fp32 1e-4, fp16 1e-2 of peak; SNR otherwise);
5. an onnxruntime session with engine.onnxruntime settings, saving ``<name>.ort.onnx``;
6. a TensorRT engine ``<name>.plan`` where TensorRT is installed; ``engine_status`` says built / unavailable / failed.
Any further graph (an autoregressive family's decode step, say) is exported to
``<name>.<graph>.onnx`` and checked; ``ExportReport.graphs`` lists every graph by name.

``sequences`` must come from the calibration set (never the eval set): they feed the simplify
check and parity.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.atomic_io import write_text_atomic
from export.graph_checks import check_graph
from export.onnx_export import export_graph
from export.onnxruntime_engine import build_session
from export.parity import check_requests, onnx_torch_parity
from export.settings import EngineSettings, ExportSettings
from export.simplify import simplify_graph
from export.tensorrt_engine import build_engine
from export.tensorrt_support import readiness_report
from models.graph_contract import SYNTHESIZER, GraphContract
from models.interface import Utterance
from models.precision import PrecisionIsland
from models.registry import family_of

_ISLAND_PRECISIONS = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


@dataclass
class ExportReport:
    name: str
    precision: str  # fp32 | fp16 | bf16 | int8: which parity budget applies
    onnx_path: Path
    simplified_path: Path
    node_counts: dict[str, int]  # exported / onnxsim / onnxslim
    simplify: dict
    graph_checks: dict
    op_histogram: dict[str, int]
    readiness: dict | None
    parity: dict
    ort_optimized_path: Path | None
    engine_status: str  # built | unavailable | failed | skipped
    engine_reason: str | None = None
    engine_path: Path | None = None
    report_path: Path | None = field(default=None)
    # Every exported graph by the family's graph name (the main one as simplified), and the checks
    # of those besides the main one; a manifest lists the same names.
    graphs: dict[str, str] = field(default_factory=dict)
    other_graph_checks: dict[str, dict] = field(default_factory=dict)
    rewrites: list[str] = field(default_factory=list)  # export rewrites the main graph's module carries

    def to_dict(self) -> dict:
        return {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(self).items()}


def variant_precision(model) -> str:
    """fp16/bf16 when any part is a PrecisionIsland of that dtype, else fp32."""
    for part in model.parts().values():
        if isinstance(part, PrecisionIsland):
            return _ISLAND_PRECISIONS[str(part.dtype)]
    return "fp32"


def graph_file_name(variant: str, graph: str, main_graph: str) -> str:
    """``<variant>.onnx`` for the main graph (the name the pipeline and registration use), else
    ``<variant>.<graph>.onnx``."""
    return f"{variant}.onnx" if graph == main_graph else f"{variant}.{graph}.onnx"


def _feeds(model, contract: GraphContract, sequences: list[Utterance]) -> list[dict[str, np.ndarray]]:
    """Graph inputs for each sentence alone, the family's default sampling, seed i."""
    return [contract.feeds(request) for request in check_requests(model, contract, sequences)]


def export_variant(name: str, model, work_dir: str | Path, sequences: list[Utterance],
                   settings: ExportSettings, engine: EngineSettings | None = None,
                   precision: str | None = None) -> ExportReport:
    """Export variant ``name`` (a model of a registered family, any parts) under ``work_dir``; see the module docstring."""
    engine = engine or EngineSettings()
    sequences = list(sequences)[: settings.parity_sentences]
    if len(sequences) < settings.parity_sentences:
        raise ValueError(f"export.parity_sentences={settings.parity_sentences} but only {len(sequences)} sequences given")
    precision = precision or variant_precision(model)
    work_dir = Path(work_dir)
    family = family_of(model)
    if family.graph_contracts is None:
        raise ValueError(f"family {family.name} exports no ONNX graph (Family.graph_contracts is None)")
    contracts = (family.graph_contracts(model) if settings.graph_variant is None
                 else family.graph_contracts(model, settings.graph_variant))
    main_graph = SYNTHESIZER if SYNTHESIZER in contracts else next(iter(contracts))
    contract = contracts[main_graph]
    # Simplify's check and parity run the graph on requests; a graph fed otherwise (a decode step)
    # is exported and checked as it is.
    fed_from_requests = contract.feeds is not None and contract.audio_output is not None
    exported = {graph: export_graph(each, work_dir / graph_file_name(name, graph, main_graph), opset=settings.opset)
                for graph, each in contracts.items()}
    onnx_path = exported[main_graph]
    simplified_path = work_dir / f"{name}.simplified.onnx"
    if settings.simplify and fed_from_requests:
        simplify = simplify_graph(onnx_path, simplified_path, _feeds(model, contract, sequences),
                                  settings.simplify_tolerance_of_peak)
    else:
        simplified_path.write_bytes(onnx_path.read_bytes())
        simplify = {"chosen": "exported", "nodes": {}, "rejected": {}}
    checks = check_graph(simplified_path)
    graphs = {graph: str(simplified_path if graph == main_graph else path) for graph, path in exported.items()}
    graph_checks = {graph: check_graph(path) for graph, path in exported.items() if graph != main_graph}
    readiness = readiness_report(simplified_path) if settings.check_tensorrt_readiness else None
    if fed_from_requests:
        parity = onnx_torch_parity(model, simplified_path, sequences, precision=precision, contract=contract)
    else:
        parity = {"sentences": 0, "precision": precision, "skipped": f"graph {main_graph!r} is not fed from a request"}
    session = build_session(simplified_path, engine.onnxruntime, optimized_path=work_dir / f"{name}.ort.onnx")
    if engine.build_tensorrt:
        built = build_engine(simplified_path, work_dir / f"{name}.plan", engine.tensorrt)
        engine_status, engine_reason, engine_path = built.status, built.reason, built.engine_path
    else:
        engine_status, engine_reason, engine_path = "skipped", "engine.build_tensorrt is false", None
    report = ExportReport(
        name=name, precision=precision, onnx_path=onnx_path, simplified_path=simplified_path,
        node_counts=simplify["nodes"], simplify=simplify, graph_checks=checks, op_histogram=checks["op_histogram"],
        graphs=graphs, other_graph_checks=graph_checks, rewrites=list(contract.rewrites),
        readiness=readiness, parity=parity, ort_optimized_path=session.optimized_path,
        engine_status=engine_status, engine_reason=engine_reason, engine_path=engine_path,
        report_path=work_dir / f"{name}.export.json",
    )
    write_text_atomic(report.report_path, json.dumps(report.to_dict(), indent=2))
    return report
