"""The run's resolved config -> typed RunSettings, stage settings included, checked at start.

    settings = settings_from_config(OmegaConf.to_container(cfg, resolve=True))

Kept apart from compress/settings.py because typing the stage settings needs the stage modules,
which themselves read RunSettings.
"""
from __future__ import annotations

import dataclasses

from compress.settings import RunSettings
from compress.stages import stage_settings
from core.config import ConfigError, build_dataclass
from models.registry import get_family
from texts import load_sentences


def settings_from_config(resolved: dict) -> RunSettings:
    """``resolved``: the run's config as a plain dict (``OmegaConf.to_container(cfg, resolve=True)``)."""
    # The serve group is the server's own: `python -m serve` checks it (serve/settings.py).
    resolved = {k: v for k, v in resolved.items() if k not in ("hydra", "serve")}
    settings = build_dataclass(RunSettings, resolved, "")
    typed = stage_settings(settings.variants, settings.stages, get_family(settings.model.family))
    if typed:
        _check_calibration_set(settings.data.calibration_set)
    return dataclasses.replace(settings, stages=typed)


def _check_calibration_set(name: str) -> None:
    try:
        load_sentences(name)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"data.calibration_set={name!r}: {error}") from error
