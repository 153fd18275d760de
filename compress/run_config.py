"""The run's resolved config -> typed RunSettings, stage settings included, checked at start.

    settings = settings_from_config(OmegaConf.to_container(cfg, resolve=True))

Kept apart from compress/settings.py because typing the stage settings needs the stage modules,
which themselves read RunSettings.
"""
from __future__ import annotations

import dataclasses
import logging

from compress.settings import REFERENCE_RUNTIME_VARIANTS, RunSettings
from compress.stages import stage_settings
from core.config import ConfigError, build_dataclass
from models.registry import FAMILIES, get_family
from texts import load_sentences

log = logging.getLogger(__name__)


def settings_from_config(resolved: dict) -> RunSettings:
    """``resolved``: the run's config as a plain dict (``OmegaConf.to_container(cfg, resolve=True)``)."""
    # The serve group is the server's own: `python -m serve` checks it (serve/settings.py).
    resolved = {k: v for k, v in resolved.items() if k not in ("hydra", "serve")}
    resolved["model"] = _without_voice_fields(resolved.get("model"))
    resolved = _without_reference_variants(resolved)
    settings = build_dataclass(RunSettings, resolved, "")
    typed = stage_settings(settings.variants, settings.stages, get_family(settings.model.family))
    if typed:
        _check_calibration_set(settings.data.calibration_set)
    return dataclasses.replace(settings, stages=typed)


def _without_voice_fields(model):
    """The model group without the keys its family folds into ``model.voice`` (Family.voice_fields);
    every other unknown key still fails in ModelSettings."""
    if not isinstance(model, dict) or model.get("family") not in FAMILIES:
        return model
    folded = FAMILIES[model["family"]].voice_fields
    return {key: value for key, value in model.items() if key not in folded}


def _without_reference_variants(resolved: dict) -> dict:
    """An experiment's variant list is written for every family; a family that ships no graph of its
    own (no reference runtime) cannot have ``original_onnx`` or ``lite_ort``: they are dropped, and
    the log says so (the saved config shows the variants that ran)."""
    model, variants = resolved.get("model"), resolved.get("variants")
    if not isinstance(model, dict) or model.get("family") not in FAMILIES or not isinstance(variants, list):
        return resolved
    if FAMILIES[model["family"]].reference is not None:
        return resolved
    dropped = [v for v in variants if v in REFERENCE_RUNTIME_VARIANTS]
    if not dropped:
        return resolved
    log.warning("family %s ships no graph of its own (no reference runtime): variants %s dropped",
                model["family"], dropped)
    kept = [v for v in variants if v not in dropped]
    evaluate = dict(resolved.get("evaluate") or {})
    if evaluate.get("reference_variant") in dropped:
        evaluate["reference_variant"] = "teacher"
    return {**resolved, "variants": kept, "evaluate": evaluate}


def _check_calibration_set(name: str) -> None:
    try:
        load_sentences(name)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"data.calibration_set={name!r}: {error}") from error
