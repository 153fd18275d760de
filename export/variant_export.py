"""One entry for the pipeline: export a PyTorch variant, simplify, check, report TensorRT readiness, measure parity.

    from export.variant_export import export_variant
    report = export_variant("fp16", fp16_voice, work_dir, calibration_sequences, settings.export, settings.engine)
    report.to_dict()          # JSON-able; also written to work_dir / "fp16.export.json"

Steps, each recorded in the report:
1. export_piper -> ``<name>.onnx`` (Piper contract, dynamic batch and lengths);
2. simplify_graph -> ``<name>.simplified.onnx`` (the smallest of exported/onnxsim/onnxslim that matches);
3. check_graph (checker, shape inference, op histogram) and readiness_report (TensorRT 10);
4. onnx_torch_parity on ``export.parity_sentences`` sentences (fp32 1e-4, fp16 1e-2 of peak; SNR otherwise);
5. an onnxruntime session with engine.onnxruntime settings, saving ``<name>.ort.onnx``;
6. a TensorRT engine ``<name>.plan`` where TensorRT is installed; ``engine_status`` says built / unavailable / failed.

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
from export.onnx_export import export_piper, piper_vits_of
from export.onnxruntime_engine import build_session
from export.parity import onnx_torch_parity
from export.settings import EngineSettings, ExportSettings
from export.simplify import simplify_graph
from export.tensorrt_engine import build_engine
from export.tensorrt_support import readiness_report
from models.interface import SynthesisRequest, Utterance
from models.sampling import VitsSampling
from models.precision import PrecisionIsland

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

    def to_dict(self) -> dict:
        return {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(self).items()}


def variant_precision(model) -> str:
    """fp16/bf16 when any part is a PrecisionIsland of that dtype, else fp32."""
    for part in piper_vits_of(model).parts().values():
        if isinstance(part, PrecisionIsland):
            return _ISLAND_PRECISIONS[str(part.dtype)]
    return "fp32"


def _feeds(model, sequences: list[Utterance]) -> list[dict[str, np.ndarray]]:
    """Graph inputs for each sentence alone, Piper's noise scales, seed i."""
    vits = piper_vits_of(model)
    feeds = []
    for index, sequence in enumerate(sequences):
        noise = VitsSampling(seed=index)
        request = SynthesisRequest.from_utterances([sequence], sampling=noise)
        duration_noise, prior_noise = noise.draw(1, len(sequence.phoneme_ids), vits.hp.latent_channels)
        feed = {"input": request.phoneme_ids.numpy(), "input_lengths": request.phoneme_lengths.numpy(),
                "scales": np.array([noise.noise_scale, noise.length_scale, noise.noise_scale_w], np.float32),
                "duration_noise": duration_noise.numpy(), "prior_noise": prior_noise.numpy()}
        if vits.hp.num_speakers > 1:
            feed["sid"] = np.zeros(1, np.int64)
        feeds.append(feed)
    return feeds


def export_variant(name: str, model, work_dir: str | Path, sequences: list[Utterance],
                   settings: ExportSettings, engine: EngineSettings | None = None,
                   precision: str | None = None) -> ExportReport:
    """Export variant ``name`` (a PiperVoice, any parts) under ``work_dir``; see the module docstring."""
    engine = engine or EngineSettings()
    sequences = list(sequences)[: settings.parity_sentences]
    if len(sequences) < settings.parity_sentences:
        raise ValueError(f"export.parity_sentences={settings.parity_sentences} but only {len(sequences)} sequences given")
    precision = precision or variant_precision(model)
    work_dir = Path(work_dir)
    onnx_path = export_piper(model, work_dir / f"{name}.onnx", opset=settings.opset)
    simplified_path = work_dir / f"{name}.simplified.onnx"
    if settings.simplify:
        simplify = simplify_graph(onnx_path, simplified_path, _feeds(model, sequences), settings.simplify_tolerance_of_peak)
    else:
        simplified_path.write_bytes(onnx_path.read_bytes())
        simplify = {"chosen": "exported", "nodes": {}, "rejected": {}}
    checks = check_graph(simplified_path)
    readiness = readiness_report(simplified_path) if settings.check_tensorrt_readiness else None
    parity = onnx_torch_parity(model, simplified_path, sequences, precision=precision)
    session = build_session(simplified_path, engine.onnxruntime, optimized_path=work_dir / f"{name}.ort.onnx")
    if engine.build_tensorrt:
        built = build_engine(simplified_path, work_dir / f"{name}.plan", engine.tensorrt)
        engine_status, engine_reason, engine_path = built.status, built.reason, built.engine_path
    else:
        engine_status, engine_reason, engine_path = "skipped", "engine.build_tensorrt is false", None
    report = ExportReport(
        name=name, precision=precision, onnx_path=onnx_path, simplified_path=simplified_path,
        node_counts=simplify["nodes"], simplify=simplify, graph_checks=checks, op_histogram=checks["op_histogram"],
        readiness=readiness, parity=parity, ort_optimized_path=session.optimized_path,
        engine_status=engine_status, engine_reason=engine_reason, engine_path=engine_path,
        report_path=work_dir / f"{name}.export.json",
    )
    write_text_atomic(report.report_path, json.dumps(report.to_dict(), indent=2))
    return report
