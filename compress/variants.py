"""Build the variants a run scores, by name. Every variant exposes the TTSModel interface.

The run's family (``model.family``, models/registry.py) loads both base variants: ``teacher`` is
its PyTorch model, ``original_onnx`` the graph it ships, run as it ships (its reference runtime).
Compressed variants come from the stages (compress/stages.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from compress.settings import RunSettings
from core.config import ConfigError
from evaluate.memory import file_size_mb, parameter_count, state_dict_size_mb
from models.family import Family
from models.interface import TTSModel
from models.registry import get_family
from models.sampling import Sampling


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
    # Weights files the variant was trained into beyond the voice (a distilled student's): figures
    # measured elsewhere (an H200 call) describe this variant only if they ran these same files.
    # Set where GPU figures are merged by name (``lite``); the CPU graphs built from it carry none.
    trained_weights: tuple[Path, ...] = ()


@dataclass
class StageContext:
    """What every compression stage may use besides its own settings."""

    calibration_sequences: list  # list[Utterance] from the calibration set, never the eval set
    work_dir: Path  # the stage's artifacts; a finished artifact found here is reused (resume)
    cpu_threads: int
    cache_dir: Path
    family: Family  # the run's family (model.family): its part roles, reference runtime, hooks
    voice: str  # the run's voice (model.voice): its frontend and config, for graph variants
    # The run's sampling (the family's options from conf/model, e.g. an autoregressive family's
    # max_tokens); a stage that synthesizes draws sentence i from it with seed i. None: the family's defaults.
    sampling: Sampling | None = None


def reference_runtime(family: Family, variant_name: str):
    """``family.reference``; a ConfigError when the family ships no graph to run as it ships."""
    if family.reference is None:
        raise ConfigError(f"variant {variant_name!r} runs the graph a family ships, and family {family.name!r} "
                          "ships none (no reference runtime in its registry entry); drop it from variants")
    return family.reference


def build_variant(name: str, settings: RunSettings) -> Variant:
    model_settings = settings.model
    family = get_family(model_settings.family)
    if name == "teacher":
        model = family.load_teacher(model_settings.voice, Path(settings.paths.cache_dir)).to(model_settings.device)
        return Variant(name, model, "torch", model_settings.device,
                       parameter_count(model) / 1e6, state_dict_size_mb(model))
    if name == "original_onnx":
        reference = reference_runtime(family, name)
        model = reference.load(model_settings.voice, settings.evaluate.cpu_threads)
        return Variant(name, model, "onnxruntime", "cpu",
                       model.num_parameters / 1e6, file_size_mb(reference.graph_path(model_settings.voice)))
    raise ValueError(f"unknown variant {name!r}")


def set_cpu_threads(threads: int) -> None:
    """One thread count for every engine of the run, so CPU figures compare."""
    torch.set_num_threads(threads)


def check_part_roles(where: str, roles, family: Family) -> None:
    """A ConfigError naming ``where`` when ``roles`` are not all part roles of ``family``."""
    unknown = sorted(set(roles) - set(family.part_roles))
    if unknown:
        raise ConfigError(f"{where}={list(roles)}: family {family.name!r} has no part {unknown}; "
                          f"its parts are {list(family.part_roles)}")


def require_parts(stage: str, variant: Variant, family: Family, roles) -> None:
    """Stop ``stage`` with a clear error unless ``variant`` is a PyTorch model of ``family`` whose
    ``parts()`` hold ``roles``: what a stage that swaps or retypes parts needs."""
    model_family = getattr(variant.model, "family", None)
    if variant.engine != "torch" or model_family != family.name:
        raise ValueError(f"{stage} needs a PyTorch model of family {family.name!r}; {variant.name!r} is "
                         f"{type(variant.model).__name__} of family {model_family!r} on engine {variant.engine!r}")
    missing = sorted(set(roles) - set(variant.model.parts()))
    if missing:
        raise ValueError(f"{stage}: {variant.name!r} (family {family.name!r}) has no parts {missing}; "
                         f"its parts() give {list(variant.model.parts())}")
