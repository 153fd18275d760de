"""MLflow logging: one parent run per `python -m compress` call, one nested run per variant.

Params are the flattened resolved config; metrics use the project's stable names; artifacts
are the resolved config, a metrics JSON, and a few WAVs with spectrogram PNGs per variant.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402

from core.revision import git_revision, provenance, save_diff  # noqa: E402

MLFLOW_PARAM_MAX_CHARS = 6000  # mlflow rejects longer param values


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = str(value)[:MLFLOW_PARAM_MAX_CHARS]
    return flat


def start_parent_run(tracking_uri: str, experiment_name: str, run_name: str, resolved: dict, config_path: Path,
                     root: str):
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment_name)
    run = mlflow.start_run(run_name=run_name)
    mlflow.log_params(flatten({k: v for k, v in resolved.items() if k != "hydra"}))
    mlflow.set_tag("git_revision", git_revision(root))
    origin = provenance(root)
    mlflow.set_tags({"git_diff_sha256": origin["diff_sha256"] or "clean", "machine_cpu": origin["machine"]["cpu"],
                     "command": origin["command"]})
    mlflow.log_artifact(str(config_path))
    diff_path = save_diff(root, config_path)  # uncommitted code that ran, beside the resolved config
    if diff_path is not None:
        mlflow.log_artifact(str(diff_path))
    return run


SPECTROGRAM_N_FFT = 1024


def spectrogram_png(waveform: torch.Tensor, sample_rate_hz: int, hop_length: int, title: str, path: Path) -> None:
    """``hop_length``: the model's samples per frame, so one image column is one decoder frame."""
    window = torch.hann_window(SPECTROGRAM_N_FFT)
    spec = torch.stft(waveform.float(), SPECTROGRAM_N_FFT, hop_length=hop_length, window=window, return_complex=True)
    db = 20 * torch.log10(spec.abs().clamp_min(1e-5))  # (F, T)
    fig, ax = plt.subplots(figsize=(8, 3))
    extent = (0, waveform.shape[0] / sample_rate_hz, 0, sample_rate_hz / 2000)
    ax.imshow(db.numpy(), origin="lower", aspect="auto", extent=extent, vmin=-80, vmax=20, cmap="magma")
    ax.set(xlabel="time (s)", ylabel="frequency (kHz)", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_variant_run(name: str, metrics: dict[str, float], tags: dict[str, str], waveforms: list[torch.Tensor],
                    texts: list[str], sample_rate_hz: int, hop_length: int, audio_samples: int,
                    artifacts: dict[str, Path] | None = None) -> None:
    with mlflow.start_run(run_name=name, nested=True):
        mlflow.set_tags({"variant": name, **{k: str(v)[:MLFLOW_PARAM_MAX_CHARS] for k, v in tags.items()}})
        for path in (artifacts or {}).values():
            if Path(path).is_file():
                mlflow.log_artifact(str(path), "stage")
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(v)})
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "metrics.json").write_text(json.dumps({"variant": name, **tags, **metrics}, indent=2))
            mlflow.log_artifact(str(folder / "metrics.json"))
            for i, (wave, text) in enumerate(list(zip(waveforms, texts))[:audio_samples]):
                sf.write(folder / f"sample_{i:02d}.wav", wave.numpy(), sample_rate_hz, subtype="PCM_16")
                spectrogram_png(wave, sample_rate_hz, hop_length, f"{name}: {text[:60]}", folder / f"sample_{i:02d}.png")
                mlflow.log_artifact(str(folder / f"sample_{i:02d}.wav"), "audio")
                mlflow.log_artifact(str(folder / f"sample_{i:02d}.png"), "spectrograms")
