"""Mel-cepstral distortion (MCD, dB) of a test waveform against the teacher's waveform of the same text.

Each waveform becomes mel-cepstra: an 80-band mel power spectrogram, floored at -80 dBFS (below
hearing at any sane level, and it keeps digital silence finite), taken to natural-log amplitude
and through a DCT to c0..c24. The scale is the one under which
``log|H(w)| = c0 + 2 * sum_m c_m cos(m w)``, so ``MCD = (10 / ln 10) * sqrt(2 * sum_m (dc_m)^2)`` is
in dB. c0 (loudness) is left out. Waveforms with the same number of frames are compared frame
by frame; otherwise the frames are aligned by dynamic time warping first. The result is the
mean over compared frame pairs.

Reference points, joe voice, mean over Harvard sentences: identical audio 0; the same text
with another noise seed 1.2 dB; another sentence (DTW-aligned) 4.3 dB; white noise at 20/10/0 dB
SNR 5.2/6.3/7.1 dB; 4 kHz low-pass 5.7 dB; 6-bit requantisation 5.1 dB. The last three are
high because the floor keeps near-silent bands: noise or a missing band there counts in full.

Usage::

    from evaluate.mcd import MelCepstralDistortion, mel_cepstral_distortion

    mel_cepstral_distortion(test_waveform, teacher_waveform, sample_rate_hz=22050)   # -> float, dB

    mcd = MelCepstralDistortion()
    for test_waveform, teacher_waveform in pairs:                  # each (T,) float, same text
        mcd.update(test_waveform, teacher_waveform, sample_rate_hz=22050)
    mcd.compute()                                                   # -> tensor, mean dB over utterances
"""
from __future__ import annotations

import math

import librosa
import numpy as np
import scipy.fft
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from evaluate.audio_input import mono_float32

NUM_MEL_BANDS = 80
NUM_CEPSTRA = 24  # c1..c24, the usual MCD order
FRAME_LENGTH_S = 1024 / 22050  # 46 ms: Piper's STFT window at 22.05 kHz, scaled for other rates
HOP_LENGTH_S = 256 / 22050  # 11.6 ms: Piper's hop, one acoustic frame of the voice
POWER_FLOOR = 1e-8  # -80 dBFS in power
_DB_PER_NEPER = 10.0 / math.log(10.0)


def _as_waveform(waveform: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    """Check a mono waveform and return it as float32 numpy (T,)."""
    return mono_float32(waveform, name)


def mel_cepstra(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> np.ndarray:
    """Mel-cepstra c1..c24 of one waveform, (T_frames, 24), natural-log amplitude scale."""
    if sample_rate_hz <= 0:
        raise ValueError(f"sample_rate_hz must be a positive number of samples per second, got {sample_rate_hz}")
    audio = _as_waveform(waveform, "waveform")
    mel_power = librosa.feature.melspectrogram(
        y=audio,
        sr=sample_rate_hz,
        n_fft=round(FRAME_LENGTH_S * sample_rate_hz),
        hop_length=round(HOP_LENGTH_S * sample_rate_hz),
        n_mels=NUM_MEL_BANDS,
    )  # (80, T_frames)
    log_amplitude = 0.5 * np.log(np.maximum(mel_power, POWER_FLOOR))  # (80, T_frames)
    # scipy's unnormalised DCT-II is 2 * sum_n x_n cos(...); dividing by 2N gives the c_m above.
    cepstra = scipy.fft.dct(log_amplitude, type=2, axis=0) / (2 * NUM_MEL_BANDS)  # (80, T_frames)
    return cepstra[1: NUM_CEPSTRA + 1].T


def mel_cepstral_distortion(
    test: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, sample_rate_hz: int
) -> float:
    """MCD in dB of ``test`` (T_test,) against ``reference`` (T_ref,), both at ``sample_rate_hz``."""
    test_cepstra = mel_cepstra(_as_waveform(test, "test"), sample_rate_hz)  # (F_test, 24)
    reference_cepstra = mel_cepstra(_as_waveform(reference, "reference"), sample_rate_hz)  # (F_ref, 24)
    if len(test_cepstra) != len(reference_cepstra):
        _, path = librosa.sequence.dtw(X=test_cepstra.T, Y=reference_cepstra.T, metric="euclidean")  # (P, 2)
        test_cepstra, reference_cepstra = test_cepstra[path[:, 0]], reference_cepstra[path[:, 1]]
    frame_distances = np.sqrt(2.0 * np.sum((test_cepstra - reference_cepstra) ** 2, axis=1))  # (F,)
    return float(_DB_PER_NEPER * frame_distances.mean())


class MelCepstralDistortion(Metric):
    """Mean MCD (dB) over the utterance pairs given to ``update``; lower is closer to the teacher."""

    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("distortions_db", default=[], dist_reduce_fx="cat")

    def update(
        self, test: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, sample_rate_hz: int
    ) -> None:
        distortion_db = mel_cepstral_distortion(test, reference, sample_rate_hz)
        self.distortions_db.append(torch.tensor([distortion_db], dtype=torch.float64))

    def compute(self) -> torch.Tensor:
        if not self.distortions_db:
            raise RuntimeError("MelCepstralDistortion.compute() called before any update(): add one pair first")
        return dim_zero_cat(self.distortions_db).mean()
