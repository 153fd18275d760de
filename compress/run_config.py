"""The run's resolved config -> typed RunSettings, stage settings included, checked at start.

    settings = settings_from_config(OmegaConf.to_container(cfg, resolve=True))

Kept apart from compress/settings.py because typing the stage settings needs the stage modules,
which themselves read RunSettings.
"""
from __future__ import annotations

import dataclasses
import logging

from compress.settings import RunSettings
from compress.stages import STAGES, stage_settings, unbuildable_reason
from core.config import ConfigError, build_dataclass
from models.registry import FAMILIES, get_family
from texts import load_sentences

log = logging.getLogger(__name__)


def settings_from_config(resolved: dict) -> RunSettings:
    """``resolved``: the run's config as a plain dict (``OmegaConf.to_container(cfg, resolve=True)``)."""
    # The serve group is the server's own: `python -m serve` checks it (serve/settings.py).
    resolved = {k: v for k, v in resolved.items() if k not in ("hydra", "serve")}
    resolved["model"] = _without_voice_fields(resolved.get("model"))
    resolved = fit_variants_to_family(resolved)
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


def fit_variants_to_family(resolved: dict, strict: bool = False) -> dict:
    """``resolved`` with the variants its family cannot build (``compress.stages.unbuildable_reason``)
    taken out, each named in the log: an experiment's variant list is written for every family
    (``int8`` lists ``int8_ort``, which quantizes the graph a family ships, and ``int8_dynamic``,
    whose parts only the stage defaults of the families it pays for name). The pipeline saves
    the fitted config, so the saved config lists the variants that ran.

    ``strict``: the variants were typed on the command line, so one the family cannot build is an
    error rather than dropped. A list left with none of its stage variants is an error too: the run
    would score the teacher alone.
    """
    model, variants = resolved.get("model"), resolved.get("variants")
    if not isinstance(model, dict) or model.get("family") not in FAMILIES or not isinstance(variants, list):
        return resolved  # RunSettings names what is wrong
    family = FAMILIES[model["family"]]
    if not all(isinstance(v, str) for v in variants):
        return resolved  # RunSettings names the entry that is not a variant name
    settled = resolved.get("stages") if isinstance(resolved.get("stages"), dict) else {}
    # Typed variants keep stage_settings' own error for missing settings, which names the key.
    reasons = {v: why for v in variants if (why := unbuildable_reason(v, family, None if strict else settled))}
    if not reasons:
        return resolved
    described = "; ".join(f"{variant!r} {why}" for variant, why in reasons.items())
    if strict:
        raise ConfigError(f"variants: family {family.name!r} cannot build them all: {described}")
    kept = [v for v in variants if v not in reasons]
    if any(v in reasons for v in variants if v in STAGES) and not any(v in STAGES for v in kept):
        buildable = [name for name in STAGES if unbuildable_reason(name, family, settled) is None]
        raise ConfigError(f"variants: family {family.name!r} builds none of this run's stage variants ({described}); "
                          f"the stage variants it can build with this run's stages settings: {buildable}")
    for variant, why in reasons.items():
        log.warning("family %s cannot build variant %s: it %s; dropped", family.name, variant, why)
    evaluate = dict(resolved.get("evaluate") or {})
    if evaluate.get("reference_variant") in reasons:
        log.warning("evaluate.reference_variant=%s dropped: the variants are scored against the teacher",
                    evaluate["reference_variant"])
        evaluate["reference_variant"] = "teacher"
    return {**resolved, "variants": kept, "evaluate": evaluate}


def _check_calibration_set(name: str) -> None:
    try:
        load_sentences(name)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"data.calibration_set={name!r}: {error}") from error
