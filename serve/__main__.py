"""Serve the champion variant (or a named one) over an OpenAI-compatible HTTP API on 127.0.0.1.

    python -m serve                                   # the champion's manifest, else original_onnx
    python -m serve serve.source=teacher serve.streaming=decoder_chunks serve.port=8001
    python -m serve serve.source=teacher serve.device=cuda serve.torch_engine=compile serve.workers=3 \
        serve.batches_in_flight=2 serve.max_batch_size=32 serve.max_wait_ms=0   # the H200 load test's setup
    TTS_SERVE_API_KEY=... python -m serve             # require `Authorization: Bearer ...` on /v1/*

The root config (conf/config.yaml) composes as for `python -m compress`; the `serve` group
(conf/serve/default.yaml) holds every knob. The model loads (and a broken manifest fails)
before the port opens; /readyz answers 200 once warm-up has run every shape bucket (serve/app.py).
SIGTERM or Ctrl-C stops taking connections and lets in-flight requests finish.

With ``serve.workers`` > 1, uvicorn starts that many processes on the one port (the kernel spreads
connections); each loads the model and warms up on its own before it accepts any (serve/worker.py). Why: one Python
process tops out on parsing, phonemizing and encoding long before a GPU engine does. Each worker
keeps its own batcher, queue and /metrics; share uploaded voices through ``serve.redis_url``.
``serve.gpu_sharing=mps`` starts a CUDA MPS daemon before the workers, so their kernels share the GPU
at once rather than in time slices (serve/gpu_sharing.py); its log goes to $CUDA_MPS_LOG_DIRECTORY
when set, else to mps_log/ in the run's folder.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
import uvicorn
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from serve.app import create_app, uvicorn_options
from serve.engines import load_served_model
from serve.gpu_sharing import LOG_ENV, shared_gpu
from serve.settings import serve_settings_from_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.initialized():
        OmegaConf.set_struct(cfg, False)
    settings = serve_settings_from_config(OmegaConf.to_container(cfg, resolve=True))  # fails on a bad key
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = uvicorn_options(settings)
    if settings.workers > 1:
        from serve.worker import SETTINGS_ENV

        os.environ[SETTINGS_ENV] = settings.to_json()  # the workers' only input: spawned processes inherit it
        run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
        with shared_gpu(settings.gpu_sharing, Path(os.environ.get(LOG_ENV) or run_dir / "mps_log")):
            uvicorn.run("serve.worker:create_worker_app", factory=True, workers=settings.workers, **options)
        return
    served = load_served_model(settings)
    uvicorn.Server(uvicorn.Config(create_app(settings, served), **options)).run()


if __name__ == "__main__":
    main()
