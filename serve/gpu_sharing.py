"""How several server workers share one GPU: in time slices (CUDA's default), or through a CUDA MPS
(Multi-Process Service) daemon of the server's own, under which their kernels run at once.

Without MPS the GPU runs one process's kernels at a time and switches between them in slices, so
while one worker's kernels leave SMs idle, the other's wait. Under MPS both workers' kernels go
through one daemon's context and can run side by side: two workers
serving EmotiVoice on an H100 made 1.07x and 1.14x the sentences a second with it, in two pairs of runs
on one machine (docs/benchmarks.md, session 44).

The daemon's pipe directory is private to this server, so only the workers it spawns join it; another
program's CUDA processes on the machine keep their own contexts. The workers must start after the
daemon (they inherit its directory through the environment) and the parent must not have made a CUDA
context of its own first: ``python -m serve`` loads the model only inside the workers.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from serve.settings import ServeConfigError

log = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
CONTROL_TIMEOUT_S = 30


@contextlib.contextmanager
def mps_daemon(log_dir: Path) -> Iterator[Path]:
    """An MPS control daemon with a private pipe directory, stopped on exit. Inside, this process's
    environment names that directory, so every CUDA process it starts joins the daemon; the
    environment is restored after. Yields the pipe directory. The daemon's log goes to ``log_dir``.

    Raises ServeConfigError when the control program is not on PATH, and CalledProcessError when it
    cannot start a daemon."""
    control = shutil.which(MPS_CONTROL)
    if control is None:
        raise ServeConfigError(f"serve.gpu_sharing='mps' needs {MPS_CONTROL} on PATH (it ships with the NVIDIA "
                               "driver); use serve.gpu_sharing=time_slices without it")
    pipe_dir = Path(tempfile.mkdtemp(prefix="tts-serve-mps-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    daemon_env = {**os.environ, PIPE_ENV: str(pipe_dir), LOG_ENV: str(log_dir)}
    saved = {key: os.environ.get(key) for key in (PIPE_ENV, LOG_ENV)}
    try:
        subprocess.run([control, "-d"], env=daemon_env, check=True, timeout=CONTROL_TIMEOUT_S)
        log.info("CUDA MPS: control daemon started (pipe %s, log %s); the workers' kernels share the GPU", pipe_dir,
                 log_dir)
        os.environ.update({PIPE_ENV: str(pipe_dir), LOG_ENV: str(log_dir)})
        try:
            yield pipe_dir
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            # "quit" lets the daemon and its server exit once their clients (the workers, stopped by now) are gone.
            stopped = subprocess.run([control], input="quit\n", env=daemon_env, text=True, capture_output=True,
                                     timeout=CONTROL_TIMEOUT_S)
            if stopped.returncode != 0:
                log.warning("CUDA MPS: the control daemon did not take 'quit' (exit %d): %s", stopped.returncode,
                            stopped.stderr.strip())
    finally:
        shutil.rmtree(pipe_dir, ignore_errors=True)


def shared_gpu(mode: str, log_dir: Path) -> contextlib.AbstractContextManager:
    """The context the workers run in for ``mode`` (serve.settings.GPU_SHARING_MODES, checked there)."""
    return mps_daemon(log_dir) if mode == "mps" else contextlib.nullcontext()
