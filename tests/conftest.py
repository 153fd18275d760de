"""Shared fixtures: the real Hydra config, composed the way the CLI composes it, and exported graphs
that several test files read."""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

import pytest
import torch
from filelock import FileLock, Timeout
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent

# scripts/test.sh runs two pytest-xdist workers on two cores: each gets this many torch intra-op
# threads (TTS_TEST_TORCH_THREADS; unset or 0 keeps torch's default).
if int(os.environ.get("TTS_TEST_TORCH_THREADS") or 0) > 0 and os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["TTS_TEST_TORCH_THREADS"]))


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


def _contract_digest(contract) -> str:
    """What decides an exported graph: the module's classes, settings, weights and buffers, the example
    inputs, the names, axes, rewrites and fix-up. Two contracts with one digest export the same graph."""
    digest = hashlib.sha256()
    for module in contract.module.modules():  # classes and plain settings (a statistics dtype, a cache length)
        settings = {key: value for key, value in vars(module).items() if not key.startswith("_")
                    and isinstance(value, (bool, int, float, str, tuple, torch.dtype, type(None)))}
        digest.update(f"{type(module).__qualname__}{sorted(settings.items(), key=str)}".encode())
    # Parameters and every buffer (non-persistent ones too: bases, position tables), tensors kept as
    # plain attributes, and the example inputs.
    tensors = [*contract.module.named_parameters(), *contract.module.named_buffers()]
    for module_name, module in contract.module.named_modules():
        tensors += [(f"{module_name}.{key}", value) for key, value in vars(module).items()
                    if isinstance(value, torch.Tensor) and not key.startswith("_")]
    for name, tensor in [*tensors, *contract.example_inputs.items()]:
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    digest.update(repr((contract.input_names, contract.output_names, contract.input_axes, contract.output_axes,
                        contract.rewrites, contract.dynamo,
                        getattr(contract.postprocess, "__qualname__", None))).encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def exported_once(tmp_path_factory):
    """``exported_once(contract)``: the path of ``contract`` exported by export_graph, once per test
    run where it can be. A tiny model's graph takes 30-120 s to export on a CI core, and several files
    check the same graph (Kokoro's tiny synthesizer: four tests in three files), so the first test to
    ask exports it and later ones, on either xdist worker, read that file. A worker that asks while
    the other is exporting it exports its own copy rather than wait: waiting would leave its core
    idle. Files are named by the contract's digest alone, so the same graph asked for from two files
    is found, and a contract whose module, weights or inputs differ never gets another's graph.
    Tests only read them."""
    from export.onnx_export import export_graph  # torch.onnx loads only in the tests that export

    own = tmp_path_factory.getbasetemp() / "exported_once"
    # Under xdist each worker's base is <run>/popen-gw<N>: the run's folder is shared by both.
    shared = own.parent.parent / "exported_once" if os.environ.get("PYTEST_XDIST_WORKER") else own
    own.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)

    def written(contract, path: Path) -> Path:
        # Beside it first, then renamed: another worker may be looking for ``path`` now, and
        # export_graph rewrites its file once more when the contract has a fix-up.
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.onnx")
        export_graph(contract, partial)
        os.replace(partial, path)
        return path

    def export(contract) -> Path:
        name = f"{_contract_digest(contract)}.onnx"
        for path in (shared / name, own / name):
            if path.is_file():
                return path
        try:
            with FileLock(str(shared / name) + ".lock", timeout=0):
                return shared / name if (shared / name).is_file() else written(contract, shared / name)
        except Timeout:  # the other worker is exporting it
            return written(contract, own / name)
    return export
