"""The linear magnitude spectrogram SoVITS's reference encoder reads (the official ``get_spepc``):

    spectrogram = reference_spectrogram(waveform_32k, config)   # (B, filter_length // 2 + 1, frames)

At 32 kHz with filter 2048, hop 640 and window 2048, a clip of n samples gives
(n + 2 * 704 - 2048) // 640 + 1 frames.
"""
from __future__ import annotations

import torch

from models.gpt_sovits.sovits import SovitsConfig

MAGNITUDE_FLOOR = 1e-8  # added under the square root, so silent bins stay differentiable
PEAK_LIMIT = 2.0  # the web UI divides a clip peaking above 1 by min(2, peak)


def normalize_peak(waveform: torch.Tensor) -> torch.Tensor:
    """The web UI's level rule for a reference clip: a clip whose peak exceeds 1 is divided by
    min(2, peak); quieter clips are left alone. waveform (B, n)."""
    peak = waveform.abs().max()
    return waveform / min(PEAK_LIMIT, float(peak)) if peak > 1 else waveform


def linear_spectrogram(
    waveform: torch.Tensor, filter_length: int, hop_length: int, win_length: int
) -> torch.Tensor:
    """waveform (B, n) in [-1, 1] -> magnitudes (B, filter_length // 2 + 1, frames).

    Reflect-pads (filter_length - hop_length) / 2 samples on each side, then an uncentred STFT with
    a periodic Hann window; magnitude sqrt(re^2 + im^2 + 1e-8)."""
    if waveform.dim() != 2:
        raise ValueError(f"waveform must be (batch, samples), got shape {tuple(waveform.shape)}")
    pad = (filter_length - hop_length) // 2
    if waveform.shape[-1] <= pad:
        raise ValueError(f"waveform of {waveform.shape[-1]} samples is too short: reflect padding needs > {pad}")
    padded = torch.nn.functional.pad(waveform.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)  # (B, n + 2 pad)
    window = torch.hann_window(win_length, dtype=waveform.dtype, device=waveform.device)
    spectrum = torch.stft(
        padded, filter_length, hop_length=hop_length, win_length=win_length, window=window,
        center=False, normalized=False, onesided=True, return_complex=True,
    )  # (B, F, frames)
    return torch.sqrt(spectrum.real.pow(2) + spectrum.imag.pow(2) + MAGNITUDE_FLOOR)


def reference_spectrogram(waveform: torch.Tensor, config: SovitsConfig) -> torch.Tensor:
    """A reference clip at ``config.sample_rate_hz`` (B, n) -> the spectrogram ``ref_enc`` reads,
    after the web UI's peak rule."""
    return linear_spectrogram(normalize_peak(waveform), config.filter_length, config.hop_length, config.win_length)
