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
from compress.run_config import settings_from_config


def resolve(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.initialized():
        OmegaConf.set_struct(cfg, False)
    resolved = resolve(cfg)
    settings = settings_from_config(resolved)  # fails here, before any work, on a bad config
    run(settings, resolved)


if __name__ == "__main__":
    main()
