"""Spectral losses for teaching a student decoder to sound like the teacher (torch only).

    loss = MultiResolutionSTFTLoss()(student_audio, teacher_audio)  # both (B, T) waveforms
    loss = MelSpectrogramLoss(sample_rate_hz=22050, hop_length=256)(student_audio, teacher_audio)
    parts = DistillationLoss(sample_rate_hz, hop_length)(student_audio, teacher_audio)  # both, weighted

They compare magnitudes, not samples: a decoder may shift phase slightly and still sound the
same, which a waveform L1 would punish. Where the student shares the teacher's deterministic
excitation (a sliced teacher, noise off), its phase can follow the teacher's, and
``relative_waveform_error`` (weight ``waveform``, off by default) asks it to, since magnitude terms
alone leave the phase free. On Kokoro's Lite student it lowered DNSMOS and speaker similarity
(docs/benchmarks.md has the run). The mel filterbank is built here (Slaney scale and area
normalisation, as librosa and HiFi-GAN use) so the losses run where librosa is not installed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

MAGNITUDE_FLOOR = 1e-7  # keeps sqrt and log finite (and their gradients) on silent bins
LOG_MEL_FLOOR = 1e-5  # HiFi-GAN's clamp before the log of a mel spectrogram


def stft_magnitude(audio: torch.Tensor, n_fft: int, hop: int, win_length: int) -> torch.Tensor:
    """(B, T) waveform -> (B, n_fft // 2 + 1, frames) linear magnitude, Hann window, centred frames."""
    window = torch.hann_window(win_length, device=audio.device, dtype=torch.float32)
    spectrum = torch.stft(audio.float(), n_fft, hop, win_length, window, center=True, return_complex=True)
    power = torch.view_as_real(spectrum).pow(2).sum(-1)  # (B, F, frames)
    return torch.sqrt(power.clamp_min(MAGNITUDE_FLOOR))


def _check_waveforms(predicted: torch.Tensor, target: torch.Tensor) -> None:
    if predicted.dim() != 2 or predicted.shape != target.shape:
        raise ValueError(
            f"expected two (B, T) waveforms of the same shape, got {tuple(predicted.shape)} and {tuple(target.shape)}"
        )


class MultiResolutionSTFTLoss(nn.Module):
    """Spectral convergence + log-magnitude L1 at several STFT resolutions, averaged.

    The default resolutions are Parallel WaveGAN's (n_fft, hop, window): short windows see
    transients, long ones see pitch harmonics.
    """

    def __init__(self, resolutions: tuple[tuple[int, int, int], ...] = ((512, 128, 512), (1024, 256, 1024),
                                                                         (2048, 512, 2048))):
        super().__init__()
        for n_fft, hop, win_length in resolutions:
            if not (0 < hop <= win_length <= n_fft):
                raise ValueError(f"resolution (n_fft={n_fft}, hop={hop}, win={win_length}): need 0 < hop <= win <= n_fft")
        self.resolutions = tuple(tuple(r) for r in resolutions)

    def components(self, predicted: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Spectral convergence and log-magnitude L1, each the mean over resolutions."""
        _check_waveforms(predicted, target)
        convergence, log_magnitude = [], []
        for n_fft, hop, win_length in self.resolutions:
            predicted_mag = stft_magnitude(predicted, n_fft, hop, win_length)
            target_mag = stft_magnitude(target, n_fft, hop, win_length)
            convergence.append(torch.linalg.norm(target_mag - predicted_mag) / torch.linalg.norm(target_mag))
            log_magnitude.append(F.l1_loss(torch.log(predicted_mag), torch.log(target_mag)))
        return {"spectral_convergence": torch.stack(convergence).mean(),
                "log_magnitude": torch.stack(log_magnitude).mean()}

    def forward(self, predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        parts = self.components(predicted, target)
        return parts["spectral_convergence"] + parts["log_magnitude"]


def _hz_to_mel(frequency_hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    frequency_hz = np.asarray(frequency_hz, dtype=np.float64)
    linear_step_hz = 200.0 / 3
    mel = frequency_hz / linear_step_hz
    break_hz, log_step = 1000.0, math.log(6.4) / 27.0
    above = frequency_hz >= break_hz
    mel[above] = break_hz / linear_step_hz + np.log(frequency_hz[above] / break_hz) / log_step
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear_step_hz = 200.0 / 3
    frequency_hz = mel * linear_step_hz
    break_hz, log_step = 1000.0, math.log(6.4) / 27.0
    break_mel = break_hz / linear_step_hz
    above = mel >= break_mel
    frequency_hz[above] = break_hz * np.exp(log_step * (mel[above] - break_mel))
    return frequency_hz


def mel_filterbank(sample_rate_hz: int, n_fft: int, n_mels: int, fmin_hz: float = 0.0,
                   fmax_hz: float | None = None) -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) triangular filters, Slaney-normalised; equals librosa.filters.mel."""
    fmax_hz = sample_rate_hz / 2 if fmax_hz is None else fmax_hz
    fft_hz = np.linspace(0, sample_rate_hz / 2, n_fft // 2 + 1)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array([fmin_hz]))[0], _hz_to_mel(np.array([fmax_hz]))[0],
                                      n_mels + 2))
    widths_hz = np.diff(edges_hz)
    ramps = edges_hz[:, None] - fft_hz[None, :]  # (n_mels + 2, F)
    rising = -ramps[:-2] / widths_hz[:-1, None]
    falling = ramps[2:] / widths_hz[1:, None]
    weights = np.maximum(0, np.minimum(rising, falling))  # (n_mels, F)
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]  # equal area per filter
    return torch.from_numpy(weights).float()


class MelSpectrogramLoss(nn.Module):
    """L1 between log-mel spectrograms: HiFi-GAN's reconstruction loss (its weight there: 45)."""

    def __init__(self, sample_rate_hz: int, hop_length: int, n_fft: int = 1024, n_mels: int = 80):
        """``hop_length``: the model's samples per frame, so one mel frame is one decoder frame."""
        super().__init__()
        self.n_fft, self.hop = n_fft, hop_length
        self.register_buffer("filterbank", mel_filterbank(sample_rate_hz, n_fft, n_mels), persistent=False)

    def log_mel(self, audio: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, n_mels, frames) natural-log mel magnitudes."""
        magnitude = stft_magnitude(audio, self.n_fft, self.hop, self.n_fft)  # (B, F, frames)
        mel = torch.matmul(self.filterbank.to(magnitude.device), magnitude)
        return torch.log(mel.clamp_min(LOG_MEL_FLOOR))

    def forward(self, predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_waveforms(predicted, target)
        return F.l1_loss(self.log_mel(predicted), self.log_mel(target))


def relative_waveform_error(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||predicted - target|| / ||target|| over the batch: 10 ** (-SNR / 20), so 0.45 is 7 dB."""
    _check_waveforms(predicted, target)
    return torch.linalg.norm(predicted - target) / torch.linalg.norm(target).clamp_min(MAGNITUDE_FLOOR)


@dataclass(frozen=True)
class LossWeights:
    stft: float = 1.0  # multi-resolution STFT: spectral convergence + log magnitude
    mel: float = 1.0  # log-mel L1 (HiFi-GAN's reconstruction term); same order as the STFT term here
    waveform: float = 0.0  # relative waveform error: phase-aware, for students that can follow the teacher's phase

    def __post_init__(self):
        weights = (self.stft, self.mel, self.waveform)
        if min(weights) < 0 or sum(weights) == 0:
            raise ValueError(f"loss weights {self}: need all >= 0 and at least one > 0")


class DistillationLoss(nn.Module):
    """A student's audio against its teacher's: MR-STFT + log-mel L1 (+ relative waveform error), weighted."""

    def __init__(self, sample_rate_hz: int, hop_length: int, weights: LossWeights = LossWeights()):
        super().__init__()
        self.weights = weights
        self.stft = MultiResolutionSTFTLoss()
        self.mel = MelSpectrogramLoss(sample_rate_hz, hop_length)

    def forward(self, predicted: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """(B, T) waveforms -> {"loss", "stft", "mel"[, "waveform"]}; "loss" is the weighted sum to minimise."""
        parts = {"stft": self.stft(predicted, target), "mel": self.mel(predicted, target)}
        parts["loss"] = self.weights.stft * parts["stft"] + self.weights.mel * parts["mel"]
        if self.weights.waveform:
            parts["waveform"] = relative_waveform_error(predicted, target)
            parts["loss"] = parts["loss"] + self.weights.waveform * parts["waveform"]
        return parts
