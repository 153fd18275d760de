"""Serve the champion variant (or a named one) over an OpenAI-compatible HTTP API on 127.0.0.1.

    python -m serve                                   # the champion's manifest, else original_onnx
    python -m serve serve.source=teacher serve.streaming=decoder_chunks serve.port=8001
    TTS_SERVE_API_KEY=... python -m serve             # require `Authorization: Bearer ...` on /v1/*

The root config (conf/config.yaml) composes as for `python -m compress`; the `serve` group
(conf/serve/default.yaml) holds every knob. The model loads (and a broken manifest fails)
before the port opens; /readyz answers 200 once every length bucket has run once.
SIGTERM or Ctrl-C stops taking connections and lets in-flight requests finish.
"""
from __future__ import annotations

import logging

import hydra
import uvicorn
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from compress.settings import settings_from_config
from serve.app import create_app
from serve.engines import load_served_model


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.initialized():
        OmegaConf.set_struct(cfg, False)
    settings = settings_from_config(OmegaConf.to_container(cfg, resolve=True)).serve  # fails on a bad key
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    served = load_served_model(settings)
    app = create_app(settings, served)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                            access_log=settings.access_log,
                            timeout_graceful_shutdown=int(settings.shutdown_grace_s))
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
