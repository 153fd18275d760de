"""Typed run settings: the resolved Hydra config becomes these dataclasses, checked at start.

Code below the entry point reads only these objects, never the raw config. A key a dataclass
does not declare, a missing key or a bad value stops the run before any work, naming the key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from compress.selection import SelectionSettings
from export.settings import EngineSettings, ExportSettings
from serve.settings import ServeSettings

BASE_VARIANTS = ("original_onnx", "teacher")
STAGE_VARIANTS = ("fp16", "bf16", "int8_ort", "pruned", "int8_modelopt", "lite", "lite_ort", "lite_int8")  # compress/stages.py builds these
KNOWN_VARIANTS = BASE_VARIANTS + STAGE_VARIANTS
NEVER_CALIBRATE_ON = ("eval", "harvard")  # held-out sets: a variant tuned on them would flatter itself
KNOWN_METRICS = ("dnsmos", "wer", "mcd", "spk_sim")


class ConfigError(ValueError):
    """A config value the run cannot use; raised before any work starts."""


@dataclass(frozen=True)
class ModelSettings:
    family: str
    voice: str
    device: str = "cpu"

    def __post_init__(self):
        if self.family != "piper":
            raise ConfigError(f"model.family={self.family!r}: only 'piper' is implemented so far")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(f"model.device={self.device!r}: use 'cpu' or 'cuda[:N]'")


@dataclass(frozen=True)
class DataSettings:
    eval_set: str
    calibration_set: str
    max_eval_sentences: int | None = None

    def __post_init__(self):
        if self.max_eval_sentences is not None and self.max_eval_sentences < 1:
            raise ConfigError(f"data.max_eval_sentences={self.max_eval_sentences}: must be >= 1 or null")
        if self.calibration_set in NEVER_CALIBRATE_ON or self.calibration_set == self.eval_set:
            raise ConfigError(
                f"data.calibration_set={self.calibration_set!r}: never calibrate on an evaluation set "
                f"({list(NEVER_CALIBRATE_ON)} or data.eval_set); use 'calibration' or your own file"
            )


@dataclass(frozen=True)
class NoiseSettings:
    noise_scale: float
    length_scale: float
    noise_scale_w: float
    seed: int

    def __post_init__(self):
        if min(self.noise_scale, self.noise_scale_w) < 0 or self.length_scale <= 0:
            raise ConfigError(f"evaluate.noise={self}: scales must be >= 0 and length_scale > 0")


@dataclass(frozen=True)
class EvaluateSettings:
    cpu_threads: int
    warm_runs: int
    warmup_runs: int
    cpu_batch_size: int
    reference_variant: str
    noise: NoiseSettings
    metrics: tuple[str, ...]
    audio_samples: int
    gpu_results: str | None = None

    def __post_init__(self):
        if self.cpu_threads < 1 or self.warm_runs < 1 or self.warmup_runs < 0 or self.cpu_batch_size < 1:
            raise ConfigError(
                "evaluate: cpu_threads, warm_runs and cpu_batch_size must be >= 1, warmup_runs >= 0 "
                f"(got {self.cpu_threads}, {self.warm_runs}, {self.cpu_batch_size}, {self.warmup_runs})"
            )
        unknown = sorted(set(self.metrics) - set(KNOWN_METRICS))
        if unknown:
            raise ConfigError(f"evaluate.metrics: unknown {unknown}; known: {list(KNOWN_METRICS)}")


@dataclass(frozen=True)
class TrackingSettings:
    tracking_uri: str
    experiment_name: str


@dataclass(frozen=True)
class PathSettings:
    root: str
    output_dir: str
    run_dir: str
    cache_dir: str


@dataclass(frozen=True)
class RunSettings:
    model: ModelSettings
    data: DataSettings
    evaluate: EvaluateSettings
    tracking: TrackingSettings
    paths: PathSettings
    variants: tuple[str, ...] = field(default=BASE_VARIANTS)
    stages: dict = field(default_factory=dict)  # typed per stage by compress.stages.stage_settings
    export: ExportSettings = field(default_factory=ExportSettings)  # export/settings.py
    engine: EngineSettings = field(default_factory=EngineSettings)  # export/settings.py
    selection: SelectionSettings = field(default_factory=SelectionSettings)  # compress/selection.py
    serve: ServeSettings = field(default_factory=ServeSettings)  # serve/settings.py

    def __post_init__(self):
        unknown = sorted(set(self.variants) - set(KNOWN_VARIANTS))
        if unknown or not self.variants:
            raise ConfigError(f"variants: unknown {unknown} or empty; known: {list(KNOWN_VARIANTS)}")
        if self.evaluate.reference_variant not in self.variants:
            raise ConfigError(
                f"evaluate.reference_variant={self.evaluate.reference_variant!r} is not among variants {list(self.variants)}"
            )
        if "lite_ort" in self.variants and not self.export.enabled:
            raise ConfigError("variant 'lite_ort' runs the Lite student's exported graph: set export.enabled=true")


def _build(cls, values: Any, where: str):
    """Construct dataclass ``cls`` from a mapping, recursing into nested dataclass fields."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; accepted: {sorted(fields)}")
    kwargs = {}
    for name, value in values.items():
        field_type = fields[name].type
        nested = globals().get(field_type) if isinstance(field_type, str) else None
        if nested is not None and dataclasses.is_dataclass(nested):
            value = _build(nested, value, f"{where}.{name}" if where else name)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where or 'config'}: {error}") from error


def settings_from_config(resolved: dict) -> RunSettings:
    """``resolved``: the run's config as a plain dict (``OmegaConf.to_container(cfg, resolve=True)``)."""
    resolved = {k: v for k, v in resolved.items() if k != "hydra"}
    settings = _build(RunSettings, resolved, "")
    if not set(settings.variants) - set(BASE_VARIANTS):  # no stage runs: nothing to type (python -m serve)
        return dataclasses.replace(settings, stages={})
    # Imported here: the stage modules import this module for ConfigError, and they import the whole
    # pipeline (librosa, mlflow, ...), which a serving machine does not carry.
    from compress.stages import stage_settings

    typed = stage_settings(settings.variants, settings.stages)
    if typed:
        _check_calibration_set(settings.data.calibration_set)
    return dataclasses.replace(settings, stages=typed)


def _check_calibration_set(name: str) -> None:
    from texts import load_sentences

    try:
        load_sentences(name)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"data.calibration_set={name!r}: {error}") from error
