"""Typed run settings: the resolved Hydra config becomes these dataclasses, checked at start.

Code below the entry point reads only these objects, never the raw config. A key a dataclass
does not declare, a missing key or a bad value stops the run before any work, naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from compress.selection import SelectionSettings
from core.config import ConfigError
from evaluate.settings import EvaluateSettings, is_english
from export.settings import EngineSettings, ExportSettings
from models.registry import FAMILIES
from texts import set_language

BASE_VARIANTS = ("original_onnx", "teacher")
STAGE_VARIANTS = ("fp16", "bf16", "int8_ort", "teacher_ort", "teacher_int8", "pruned", "int8_modelopt", "lite",
                  "lite_ort", "lite_int8", "lite_poly_int8", "lite_slim", "lite_slim_ort", "lite_slim_int8",
                  "int8_dynamic")  # compress/stages.py builds these
KNOWN_VARIANTS = BASE_VARIANTS + STAGE_VARIANTS
# run by family.reference (load, load_graph)
REFERENCE_RUNTIME_VARIANTS = ("original_onnx", "teacher_ort", "teacher_int8", "lite_ort", "lite_slim_ort")
# Held-out sets: a variant tuned on them would flatter itself
NEVER_CALIBRATE_ON = ("eval", "eval_ja", "eval_zh", "harvard")


@dataclass(frozen=True)
class ModelSettings:
    family: str  # a name in models/registry.py
    voice: str
    device: str = "cpu"
    language: str = "en"  # what the voice speaks (BCP 47): picks the recognizer's language and WER or CER
    # The family's own sampling options (a VITS family's noise scales, an autoregressive one's
    # top-k ...); seed and pace are the evaluation's (evaluate.sampling). Checked by family.sampling.
    sampling: dict = field(default_factory=dict)

    def __post_init__(self):
        family = FAMILIES.get(self.family)
        if family is None:
            raise ConfigError(f"model.family={self.family!r}: not a registered family; registered: {sorted(FAMILIES)}")
        options = family.sampling_type.option_names()
        unknown = sorted(set(self.sampling) - set(options))
        if unknown:
            raise ConfigError(f"model.sampling: unknown {unknown} for family {self.family!r}; it takes {list(options)}")
        try:
            family.sampling(**self.sampling)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"model.sampling={self.sampling}: {error}") from error
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
class TrackingSettings:
    tracking_uri: str
    experiment_name: str


@dataclass(frozen=True)
class PathSettings:
    root: str
    output_dir: str
    run_dir: str
    cache_dir: str


def scored_language(eval_set: str, voice_language: str) -> str:
    """The language a run's audio is transcribed in: the evaluation set's own where it is a named set
    (a Mandarin voice reading the English set speaks English), else the voice's (``model.language``)."""
    return set_language(eval_set) or voice_language


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

    def __post_init__(self):
        unknown = sorted(set(self.variants) - set(KNOWN_VARIANTS))
        if unknown or not self.variants:
            raise ConfigError(f"variants: unknown {unknown} or empty; known: {list(KNOWN_VARIANTS)}")
        if self.evaluate.reference_variant not in self.variants:
            raise ConfigError(
                f"evaluate.reference_variant={self.evaluate.reference_variant!r} is not among variants {list(self.variants)}"
            )
        family = FAMILIES[self.model.family]
        needs_reference = sorted(set(self.variants) & set(REFERENCE_RUNTIME_VARIANTS))
        if needs_reference and family.reference is None:
            raise ConfigError(f"variants {needs_reference} run graphs in the family's reference runtime, and family "
                              f"{family.name!r} has none (models/registry.py); drop them from variants")
        if "wer" in self.evaluate.metrics:
            self._check_recognizer()
        if self.export.graph_variant is not None and self.export.graph_variant not in family.graph_variants:
            raise ConfigError(f"export.graph_variant={self.export.graph_variant!r}: family {family.name!r} exports "
                              + (f"one of {list(family.graph_variants)}" if family.graph_variants
                                 else "one form of its graphs; leave it null"))
        if "lite_ort" in self.variants and not self.export.enabled:
            raise ConfigError("variant 'lite_ort' runs the Lite student's exported graph: set export.enabled=true")
        if "teacher_ort" in self.variants and not self.export.enabled:
            raise ConfigError("variant 'teacher_ort' runs the teacher's exported graph: set export.enabled=true")

    @property
    def scored_language(self) -> str:
        return scored_language(self.data.eval_set, self.model.language)

    def _check_recognizer(self) -> None:
        """The recognizer can transcribe the language the run is scored in (before any work)."""
        recognizer, language = self.evaluate.recognizer, self.scored_language
        if recognizer.kind == "whisper":
            recognizer.whisper_model(language)  # an English-only model for another language fails here
        elif not is_english(language):
            raise ConfigError(f"evaluate.recognizer.kind={recognizer.kind!r} recognizes English only; this run is "
                              f"scored in {language!r} (data.eval_set={self.data.eval_set!r}): use whisper")
