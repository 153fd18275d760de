"""Which stage builds which variant, from which source variant, with which settings.

A variant listed in ``variants`` that is not a base variant (teacher, original_onnx) comes from
a stage here. Stage settings live under ``stages.<key>`` in the config (conf/stages/default.yaml)
and are checked at start, before any work.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial

from compress import (
    distil,
    half_precision,
    int8_dynamic,
    int8_modelopt,
    int8_onnxruntime,
    onnxruntime_variant,
    prune,
)
from core.config import ConfigError
from models.family import Family


def _any_family(family: Family) -> str | None:
    return None


def _needs_reference_runtime(family: Family) -> str | None:
    if family.reference is None:
        return "runs in the family's reference runtime, and the family ships no graph of its own"
    return None


def _needs_float_shipped_graph(family: Family) -> str | None:
    if family.reference is not None and family.reference.ships_int8:
        return "quantizes the graph the family ships, which is INT8 already (teacher_int8 quantizes our exported graph)"
    return None


def _needs_pruning(family: Family) -> str | None:
    return "needs pruning hooks (Family.prune is None)" if family.prune is None else None


def _needs_pytorch_int8(family: Family) -> str | None:
    if family.quantization is None or not family.quantization.quantizable_parts:
        return "needs parts that INT8 may quantize in PyTorch (Family.quantization.quantizable_parts)"
    return None


def _needs_student(family: Family) -> str | None:
    return "needs a small student (Family.distil is None)" if family.distil is None else None


@dataclass(frozen=True)
class StageSpec:
    source: str  # the variant the stage starts from
    settings_key: str | None  # its settings: stages.<settings_key>; None for a stage with no settings
    settings_class: type | None
    build: Callable
    timed_on_cpu: bool = True  # False for GPU-only precisions: CPU fp16 kernels are not what ships
    # Why a family cannot build this stage whatever its settings (None: it can), read from what the
    # family registers; a setting the family cannot honour is the settings class's check_family's.
    requires: Callable[[Family], str | None] = _any_family


STAGES = {
    "fp16": StageSpec("teacher", "fp16", half_precision.HalfPrecisionSettings, half_precision.build, False),
    "bf16": StageSpec("teacher", "bf16", half_precision.HalfPrecisionSettings, half_precision.build, False),
    "int8_ort": StageSpec("original_onnx", "int8_ort", int8_onnxruntime.Int8OrtSettings, int8_onnxruntime.build,
                          requires=_needs_float_shipped_graph),
    # The teacher's exported graph in the family's reference runtime, then that graph in INT8 (same
    # settings as int8_ort): a family whose shipped graph is already int8 quantizes its own graph.
    "teacher_ort": StageSpec("teacher", None, None, partial(onnxruntime_variant.build, variant_name="teacher_ort"),
                             requires=_needs_reference_runtime),
    "teacher_int8": StageSpec("teacher_ort", "int8_ort", int8_onnxruntime.Int8OrtSettings,
                              partial(int8_onnxruntime.build, variant_name="teacher_int8")),
    "pruned": StageSpec("teacher", "prune", prune.PruneSettings, prune.build, requires=_needs_pruning),
    "lite": StageSpec("teacher", "distil", distil.DistilSettings, distil.build, requires=_needs_student),
    # The Lite student's exported graph in onnxruntime, then that graph in INT8 (same settings as int8_ort).
    "lite_ort": StageSpec("lite", None, None, onnxruntime_variant.build, requires=_needs_reference_runtime),
    "lite_int8": StageSpec("lite_ort", "int8_ort", int8_onnxruntime.Int8OrtSettings,
                           partial(int8_onnxruntime.build, variant_name="lite_int8")),
    # The same, after the upsampling ConvTransposes become polyphase Convs (exact), so that they too
    # are blocks the sensitivity pass may put in INT8 (ORT has no INT8 ConvTranspose kernel).
    "lite_poly_int8": StageSpec("lite_ort", "int8_ort", int8_onnxruntime.Int8OrtSettings,
                                partial(int8_onnxruntime.build, variant_name="lite_poly_int8",
                                        polyphase_conv_transpose=True)),
    # The Lite student with the teacher's text encoder slimmed: its feed-forward layers pruned and
    # fine-tuned against the teacher's encoder (stages.prune_lite); the encoder is a quarter of the
    # student's CPU time, and nearly all of its arithmetic is in those layers.
    "lite_slim": StageSpec("lite", "prune_lite", prune.PruneSettings,
                           partial(prune.build, variant_name="lite_slim"), requires=_needs_pruning),
    "lite_slim_ort": StageSpec("lite_slim", None, None,
                               partial(onnxruntime_variant.build, variant_name="lite_slim_ort"),
                               requires=_needs_reference_runtime),
    "lite_slim_int8": StageSpec("lite_slim_ort", "int8_ort", int8_onnxruntime.Int8OrtSettings,
                                partial(int8_onnxruntime.build, variant_name="lite_slim_int8")),
    # Fake quantization in PyTorch: CPU timing would measure quantize-dequantize overhead, not INT8
    # (its speed is TensorRT's, from the Q/DQ graph); quality only, like fp16.
    "int8_modelopt": StageSpec("teacher", "int8_modelopt", int8_modelopt.Int8ModeloptSettings, int8_modelopt.build,
                               False, requires=_needs_pytorch_int8),
    # Dynamic INT8 Linear layers in PyTorch on CPU kernels: real INT8 speed, timed like the teacher.
    "int8_dynamic": StageSpec("teacher", "int8_dynamic", int8_dynamic.Int8DynamicSettings, int8_dynamic.build),
}


def unbuildable_reason(variant: str, family: Family, settled: Collection[str] | None = None) -> str | None:
    """Why ``family`` cannot build ``variant``, following the stage's source (``int8_ort`` starts
    from the family's shipped graph); None when it can.

    ``settled``: the ``stages.<key>`` present in the run's config. Given, a stage with no settings
    there is unbuildable too: a stage whose settings are all the family's own (``int8_dynamic``'s
    parts) has them only in the stage defaults of the families it pays for.
    """
    if variant == "original_onnx":
        return _needs_reference_runtime(family)
    spec = STAGES.get(variant)
    if spec is None:
        return None
    own = spec.requires(family)
    if own is None and settled is not None and spec.settings_key is not None and spec.settings_key not in settled:
        own = (f"needs settings under stages.{spec.settings_key}, which the family's stage defaults "
               f"(conf/stages/family/) do not give")
    if own is not None:
        return own
    behind = unbuildable_reason(spec.source, family, settled)
    return None if behind is None else f"is built from {spec.source!r}, which {behind}"


def built_with(variant: str, typed_stages: dict[str, object]) -> object | None:
    """The typed settings of the stage that builds ``variant`` (``RunSettings.stages``' entry); None for a
    base variant or a stage without settings."""
    spec = STAGES.get(variant)
    return None if spec is None or spec.settings_key is None else typed_stages.get(spec.settings_key)


def stage_settings(variants: tuple[str, ...], raw: dict, family: Family) -> dict[str, object]:
    """Typed settings for every stage the listed variants need; errors name the key at fault.

    Settings that name parts of the model (``check_family``) are checked against ``family``'s part roles.
    """
    typed = {}
    for name in variants:
        spec = STAGES.get(name)
        if spec is None:
            continue
        if spec.source not in variants:
            raise ConfigError(f"variant {name!r} is built from {spec.source!r}: list {spec.source!r} in variants too")
        if spec.settings_key is None:
            continue
        values = raw.get(spec.settings_key)
        if not isinstance(values, dict):
            raise ConfigError(f"variant {name!r} needs settings under stages.{spec.settings_key}")
        # A settings class names its fields as its usual key does ("prune.ratio"); the prefix names
        # the key this variant reads, as two stages share PruneSettings (stages.prune, stages.prune_lite).
        try:
            typed[spec.settings_key] = spec.settings_class(**values)
            check_family = getattr(typed[spec.settings_key], "check_family", None)
            if check_family is not None:
                check_family(family)
        except (TypeError, ConfigError) as error:
            raise ConfigError(f"stages.{spec.settings_key} (variant {name!r}): {error}") from error
    return typed


def stage_settings_chain(variant: str, resolved_config: dict) -> dict:
    """``stages.<key>`` of every stage behind ``variant``, following each stage's source: what its
    audio depends on besides the settings every variant shares."""
    stages = resolved_config.get("stages") or {}
    chain = {}
    while variant in STAGES:
        spec = STAGES[variant]
        if spec.settings_key is not None:
            chain[spec.settings_key] = stages.get(spec.settings_key)
        variant = spec.source
    return chain
