"""Typed settings of the export and engine config groups (conf/export, conf/engine), checked at start.

compress/settings.py builds ``RunSettings.export`` / ``RunSettings.engine`` from these; nested
groups (engine.onnxruntime, engine.tensorrt) are built here with the same rule: an unknown key
or a bad value is a ConfigError naming it, before any work.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import onnxruntime as ort

from core.config import ConfigError


def _nested(cls, values, where: str):
    """``cls(**values)`` for a nested group given as a mapping; unknown keys name the group."""
    if isinstance(values, cls):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {values!r}")
    accepted = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - accepted)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; accepted: {sorted(accepted)}")
    return cls(**values)


OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class OrtEngineSettings:
    intra_op_threads: int = 2  # the project's CPU figures use 2 threads
    inter_op_threads: int = 1  # one graph, run sequentially
    graph_optimization_level: str = "all"  # disable | basic | extended | all
    save_optimized: bool = True  # write the optimized model beside the graph (what ORT actually ran)

    def __post_init__(self):
        if self.graph_optimization_level not in OPTIMIZATION_LEVELS:
            raise ConfigError(f"engine.onnxruntime.graph_optimization_level={self.graph_optimization_level!r}: "
                               f"use one of {sorted(OPTIMIZATION_LEVELS)}")
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ConfigError("engine.onnxruntime: thread counts must be >= 0 (0 lets onnxruntime choose)")


@dataclass(frozen=True)
class TensorRTSettings:
    workspace_mib: int = 32768  # the activations at axis_ranges' largest shapes: Piper's decoder needs 25 GiB
    # Dim name (as the exporter names them: batch_size, phonemes, frames) -> [min, opt, max].
    axis_ranges: dict = field(default_factory=lambda: {
        "batch_size": [1, 4, 16],
        "phonemes": [2, 64, 400],  # ids per sentence; the calibration set's longest is under 300
        "frames": [2, 1024, 6400],  # phonemes x VitsSampling.max_frames_per_phoneme_id (16)
    })
    timing_cache: str | None = None  # path; created on first build
    builder_optimization_level: int = 3  # TensorRT's default; 5 searches longest

    def __post_init__(self):
        if self.workspace_mib < 1:
            raise ConfigError(f"engine.tensorrt.workspace_mib={self.workspace_mib}: must be >= 1")
        if not 0 <= self.builder_optimization_level <= 5:
            raise ConfigError(f"engine.tensorrt.builder_optimization_level={self.builder_optimization_level}: use 0-5")
        for name, values in self.axis_ranges.items():
            values = list(values)
            if len(values) != 3 or any(not isinstance(v, int) or isinstance(v, bool) for v in values):
                raise ConfigError(f"engine.tensorrt.axis_ranges.{name}={values}: give [min, opt, max] integers")
            if not 1 <= values[0] <= values[1] <= values[2]:
                raise ConfigError(f"engine.tensorrt.axis_ranges.{name}={values}: need 1 <= min <= opt <= max")


PARITY_PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class ExportSettings:
    """conf/export/default.yaml: what export_variant does for each torch variant."""

    enabled: bool = True  # false: torch variants get no graph (the debug preset: export costs 20-35 s each)
    opset: int = 18  # torch 2.13's dynamo exporter emits 18 whatever is asked
    simplify: bool = True  # try onnxsim and onnxslim, keep the smallest graph that still matches
    simplify_tolerance_of_peak: float = 1e-5  # a simplified graph may move outputs this much, relative to peak
    parity_sentences: int = 2  # calibration sentences compared onnxruntime vs torch, batch 1 each
    check_tensorrt_readiness: bool = True
    graph_variant: str | None = None  # one of the family's Family.graph_variants; None: its default (checked in RunSettings)

    def __post_init__(self):
        if self.opset < 18:
            raise ConfigError(f"export.opset={self.opset}: the dynamo exporter emits opset 18 or later")
        if self.parity_sentences < 1:
            raise ConfigError(f"export.parity_sentences={self.parity_sentences}: must be >= 1")
        if not self.simplify_tolerance_of_peak > 0:
            raise ConfigError(f"export.simplify_tolerance_of_peak={self.simplify_tolerance_of_peak}: must be > 0")


@dataclass(frozen=True)
class EngineSettings:
    """conf/engine/default.yaml: the engines built from each exported graph."""

    onnxruntime: OrtEngineSettings = field(default_factory=OrtEngineSettings)
    tensorrt: TensorRTSettings = field(default_factory=TensorRTSettings)
    build_tensorrt: bool = True  # try; where TensorRT is missing the report says engine_status=unavailable

    def __post_init__(self):
        object.__setattr__(self, "onnxruntime", _nested(OrtEngineSettings, self.onnxruntime, "engine.onnxruntime"))
        object.__setattr__(self, "tensorrt", _nested(TensorRTSettings, self.tensorrt, "engine.tensorrt"))
