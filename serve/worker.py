"""The app of one worker process when `python -m serve serve.workers=N` runs several (serve/__main__.py).

uvicorn imports ``create_worker_app`` in each spawned process; the validated settings arrive in
the environment variable ``SETTINGS_ENV``, written by the parent from its own Hydra config.
"""
from __future__ import annotations

import logging
import os

from fastapi import FastAPI

from serve.app import create_app
from serve.engines import load_served_model
from serve.settings import ServeSettings

SETTINGS_ENV = "TTS_SERVE_SETTINGS_JSON"


def create_worker_app() -> FastAPI:
    text = os.environ.get(SETTINGS_ENV)
    if not text:
        raise RuntimeError(f"{SETTINGS_ENV} is not set: start workers with `python -m serve serve.workers=N`")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    settings = ServeSettings.from_json(text)
    # Warm before accepting: the kernel hands connections on the shared port only to workers that accept.
    return create_app(settings, load_served_model(settings), warm_up_before_serving=True)
