"""Shared fixtures: the real Hydra config, composed the way the CLI composes it."""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent


def compose_config(tmp_path: Path, overrides: list[str]) -> dict:
    """The resolved config of `python -m compress <overrides>`, writing under ``tmp_path``."""
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"paths.root={REPO_ROOT}",
            f"paths.output_dir={tmp_path / 'outputs'}",
            f"paths.run_dir={tmp_path / 'run'}",
            *overrides,
        ])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def debug_config(tmp_path):
    return lambda *overrides: compose_config(tmp_path, ["+experiment=debug", *overrides])


@pytest.fixture
def server_log(caplog):
    """Every record of the app and of uvicorn (whose loggers do not propagate to the root)."""
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    yield caplog
    uvicorn_logger.removeHandler(caplog.handler)


def run_git(root: Path, *args: str) -> None:
    """git in a temporary checkout, with an identity of its own (tests of what a dirty tree refuses)."""
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=root, check=True,
                   capture_output=True)
