"""Compress and score a TTS voice, every variant logged to MLflow.

    python -m compress +experiment=baseline               # teacher vs the graph the voice ships
    python -m compress +experiment=baseline data=harvard  # on the Harvard lists
    python -m compress +experiment=debug                  # seconds, for a smoke test
"""
from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from compress.pipeline import run
from compress.run_config import fit_variants_to_family, settings_from_config
from core.termination import exit_on_termination


def resolve(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def variants_typed(overrides: list[str]) -> bool:
    """Whether the command line set ``variants`` (``variants=[...]``, ``+variants=``, ``++variants=``):
    then every listed variant must be one the family can build; an experiment's list is fitted to it."""
    return any(override.lstrip("+").split("=", 1)[0] == "variants" for override in overrides)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.initialized():
        OmegaConf.set_struct(cfg, False)
    typed = variants_typed(list(HydraConfig.get().overrides.task)) if HydraConfig.initialized() else False
    # Fitted before saving, so the run's saved config lists the variants that ran.
    resolved = fit_variants_to_family(resolve(cfg), strict=typed)
    settings = settings_from_config(resolved)  # fails here, before any work, on a bad config
    exit_on_termination()
    run(settings, resolved)


if __name__ == "__main__":
    main()
