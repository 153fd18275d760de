"""Folders every layer agrees on: the checkout's root and the cache of converted weights.

    from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT

``DEFAULT_CACHE_DIR`` is ``$TTS_COMPRESS_CACHE`` or ``~/.cache/tts-compress`` (what conf/paths'
``cache_dir`` holds for a Hydra run); command-line tools outside Hydra start from it.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout: git provenance of results is read here
DEFAULT_CACHE_DIR = Path(os.environ.get("TTS_COMPRESS_CACHE", Path.home() / ".cache" / "tts-compress"))
