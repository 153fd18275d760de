"""Controlled degradations of a waveform, for checking that quality metrics move the right way.

Each takes a mono float waveform (T,) in [-1, 1] and returns a new float32 tensor (T,); the
input is never changed. Results are clipped to [-1, 1], as any real audio path would clip them.

Usage::

    from evaluate.degradations import add_white_noise, low_pass, requantize

    noisy = add_white_noise(waveform, snr_db=10.0, seed=0)     # white Gaussian noise at 10 dB SNR
    muffled = low_pass(waveform, sample_rate_hz=16000, cutoff_hz=4000.0)
    coarse = requantize(waveform, bits=6)                       # 64 levels, as 6-bit PCM stores it
"""
from __future__ import annotations

import numpy as np
import scipy.signal
import torch

LOW_PASS_ORDER = 8  # Butterworth order: ~48 dB/octave, a clear band limit without ringing artefacts


def _as_waveform(waveform: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Check a mono waveform and return it as a float32 CPU tensor (T,)."""
    wave = torch.as_tensor(waveform).detach().cpu()
    if wave.ndim != 1:
        raise ValueError(f"waveform must be mono with shape (T,), got shape {tuple(wave.shape)}")
    if wave.numel() == 0:
        raise ValueError("waveform is empty: give at least one sample to degrade")
    return wave.to(torch.float32)


def add_white_noise(waveform: torch.Tensor | np.ndarray, snr_db: float, seed: int = 0) -> torch.Tensor:
    """Add white Gaussian noise whose power is ``snr_db`` below the waveform's mean power."""
    wave = _as_waveform(waveform)  # (T,)
    signal_power = float(wave.pow(2).mean())
    if signal_power == 0.0:
        raise ValueError("waveform is all zeros: a signal-to-noise ratio needs a signal with power")
    noise_power = signal_power / 10.0 ** (snr_db / 10.0)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(wave.shape, generator=generator) * noise_power**0.5  # (T,)
    return (wave + noise).clamp(-1.0, 1.0)


def low_pass(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, cutoff_hz: float) -> torch.Tensor:
    """Remove content above ``cutoff_hz`` with a zero-phase Butterworth filter (no time shift)."""
    if sample_rate_hz <= 0:
        raise ValueError(f"sample_rate_hz must be positive, got {sample_rate_hz}")
    if not 0 < cutoff_hz < sample_rate_hz / 2:
        raise ValueError(
            f"cutoff_hz must lie between 0 and the Nyquist frequency {sample_rate_hz / 2} Hz, got {cutoff_hz}"
        )
    wave = _as_waveform(waveform)  # (T,)
    sections = scipy.signal.butter(LOW_PASS_ORDER, cutoff_hz, btype="low", fs=sample_rate_hz, output="sos")
    filtered = scipy.signal.sosfiltfilt(sections, wave.numpy().astype(np.float64))  # (T,)
    return torch.from_numpy(filtered.astype(np.float32)).clamp(-1.0, 1.0)


def requantize(waveform: torch.Tensor | np.ndarray, bits: int) -> torch.Tensor:
    """Round to ``bits``-bit signed integer levels over [-1, 1], as a low-bit-depth file would store it."""
    if not isinstance(bits, int) or not 1 < bits <= 24:
        raise ValueError(f"bits must be an integer from 2 to 24, got {bits!r}")
    wave = _as_waveform(waveform)  # (T,)
    levels = 2 ** (bits - 1)  # signed PCM: codes -levels .. levels - 1
    return torch.round(wave * levels).clamp(-levels, levels - 1) / levels


# The controlled degradations every quality metric must rank correctly (tests/evaluate/test_metric_validity.py,
# python -m evaluate.metric_validity): condition -> f(waveform (T,), sample_rate_hz, seed).
STANDARD_DEGRADATIONS = {
    "clean": lambda wave, sample_rate_hz, seed: _as_waveform(wave),
    "snr_20db": lambda wave, sample_rate_hz, seed: add_white_noise(wave, snr_db=20.0, seed=seed),
    "snr_10db": lambda wave, sample_rate_hz, seed: add_white_noise(wave, snr_db=10.0, seed=seed),
    "snr_0db": lambda wave, sample_rate_hz, seed: add_white_noise(wave, snr_db=0.0, seed=seed),
    "low_pass_4khz": lambda wave, sample_rate_hz, seed: low_pass(wave, sample_rate_hz, cutoff_hz=4000.0),
    "requantized_6bit": lambda wave, sample_rate_hz, seed: requantize(wave, bits=6),
}
