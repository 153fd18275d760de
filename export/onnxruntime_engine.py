"""onnxruntime sessions for exported graphs: CPU with set threads and optimization level, CUDA where installed.

    from export.onnxruntime_engine import OrtEngineSettings, build_session
    built = build_session("teacher.onnx", OrtEngineSettings(intra_op_threads=2), optimized_path="teacher.ort.onnx")
    built.session.run(None, feeds); built.providers; built.fallback_reason

``device="cuda"`` asks for the CUDA provider; where onnxruntime-gpu is missing or cannot load CUDA
(a CPU machine: missing libcublasLt, ENV_NOTES) the session falls back to the CPU and says why in
``fallback_reason`` (also logged). The optimized model ORT writes is provider specific: a CPU one
holds com.microsoft fused ops that only onnxruntime runs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from export.settings import OPTIMIZATION_LEVELS, OrtEngineSettings

log = logging.getLogger(__name__)

@dataclass
class OrtSession:
    session: ort.InferenceSession
    providers: list[str]  # what the session runs on, in priority order
    optimized_path: Path | None
    fallback_reason: str | None  # why a requested CUDA provider is not among ``providers``


def build_session(graph_path: str | Path, settings: OrtEngineSettings, device: str = "cpu",
                  optimized_path: str | Path | None = None) -> OrtSession:
    """An InferenceSession for ``graph_path`` on ``device`` ("cpu" or "cuda[:N]")."""
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device={device!r}: use 'cpu' or 'cuda[:N]'")
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = OPTIMIZATION_LEVELS[settings.graph_optimization_level]
    if settings.save_optimized and optimized_path is not None:
        Path(optimized_path).parent.mkdir(parents=True, exist_ok=True)
        options.optimized_model_filepath = str(optimized_path)
    providers: list = ["CPUExecutionProvider"]
    fallback_reason = None
    if device.startswith("cuda"):
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" in available:
            device_id = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
        else:
            fallback_reason = f"onnxruntime-gpu is not installed (providers: {available}); running on CPU"
    session = ort.InferenceSession(str(graph_path), options, providers=providers)
    if device.startswith("cuda") and fallback_reason is None and "CUDAExecutionProvider" not in session.get_providers():
        fallback_reason = "the CUDA provider did not load (CUDA libraries missing?); running on CPU"
    if fallback_reason:
        log.warning("%s: %s", graph_path, fallback_reason)
    saved = Path(optimized_path) if settings.save_optimized and optimized_path is not None else None
    return OrtSession(session, session.get_providers(), saved, fallback_reason)
