"""Build the variants a run scores, by name. Every variant exposes the TTSModel interface.

Issue #3 adds the compressed variants (fp16, int8, pruned, lite) here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from compress.settings import RunSettings
from evaluate.memory import file_size_mb, parameter_count, state_dict_size_mb
from models.piper.onnx_runtime import PiperOnnxRuntimeVoice
from models.interface import TTSModel
from models.piper.voice import PiperVoice


@dataclass
class Variant:
    name: str
    model: TTSModel
    engine: str  # "torch" or "onnxruntime"
    device: str  # where it computes: "cpu" or "cuda[:N]"
    params_m: float
    size_mb: float
    # What the stage that made this variant measured about itself (calibration time, layers
    # kept in higher precision, ...), logged beside the evaluation metrics.
    stage_metrics: dict[str, float] = field(default_factory=dict)
    stage_tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)  # files to log: ONNX, checkpoints, tables


@dataclass
class StageContext:
    """What every compression stage may use besides its own settings."""

    calibration_sequences: list  # list[Utterance] from the calibration set, never the eval set
    work_dir: Path  # the stage's artifacts; a finished artifact found here is reused (resume)
    cpu_threads: int
    cache_dir: Path
    voice: str = "bundled:joe"  # the run's voice (model.voice): its frontend and config, for graph variants


def build_variant(name: str, settings: RunSettings) -> Variant:
    model_settings = settings.model
    if name == "teacher":
        voice = PiperVoice.load(model_settings.voice, Path(settings.paths.cache_dir)).to(model_settings.device)
        return Variant(name, voice, "torch", model_settings.device,
                       parameter_count(voice) / 1e6, state_dict_size_mb(voice))
    if name == "original_onnx":
        voice = PiperOnnxRuntimeVoice(model_settings.voice, threads=settings.evaluate.cpu_threads)
        return Variant(name, voice, "onnxruntime", "cpu",
                       voice.num_parameters / 1e6, file_size_mb(voice.files.onnx_path))
    raise ValueError(f"unknown variant {name!r}")


def set_cpu_threads(threads: int) -> None:
    """One thread count for every engine of the run, so CPU figures compare."""
    torch.set_num_threads(threads)
