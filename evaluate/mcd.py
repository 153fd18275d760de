"""Mel-cepstral distortion (MCD, dB) of a test waveform against the teacher's waveform of the same text.

Each waveform becomes mel-cepstra: an 80-band mel power spectrogram, floored at -80 dBFS (below
hearing at any sane level, and it keeps digital silence finite), taken to natural-log amplitude
and through a DCT to c0..c24. The scale is the one under which
``log|H(w)| = c0 + 2 * sum_m c_m cos(m w)``, so ``MCD = (10 / ln 10) * sqrt(2 * sum_m (dc_m)^2)`` is
in dB. c0 (loudness) is left out. Waveforms with the same number of frames are compared frame
by frame; otherwise the frames are aligned by dynamic time warping first. The result is the
mean over compared frame pairs.

The analysis frame (STFT hop and window) comes from the caller: ``hop_length`` in samples, the
model's own hop where it has one, so that MCD frames are the model's acoustic frames; the window
is four hops. Without one, the frame of the usual 22.05 kHz TTS recipes (hop 256, window 1024)
is kept as a duration, 11.6 ms hops and 46 ms windows at any rate, so MCDs of models with
different hops stay comparable.

On the scale: identical audio is 0 dB; the same text with another noise seed sits near 1 dB,
another sentence (DTW-aligned) near 4 dB. White noise, a low-pass or requantisation score high
(5-7 dB) because the floor keeps near-silent bands: noise or a missing band there counts in full.

Usage::

    from evaluate.mcd import MelCepstralDistortion, mel_cepstral_distortion

    mel_cepstral_distortion(test_waveform, teacher_waveform, sample_rate_hz=model.sample_rate_hz)  # -> float, dB

    mcd = MelCepstralDistortion(hop_length=hop)                     # hop: the model's, in samples; or None
    for test_waveform, teacher_waveform in pairs:                  # each (T,) float, same text
        mcd.update(test_waveform, teacher_waveform, sample_rate_hz=model.sample_rate_hz)
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
# The hop when the caller gives none: 256 samples at 22.05 kHz (LJSpeech-style recipes: Tacotron 2,
# HiFi-GAN, VITS), 11.6 ms, as a duration so that every sample rate gets the same frames in time.
DEFAULT_HOP_S = 256 / 22050
WINDOW_HOPS = 4  # STFT window = 4 hops (1024 samples at hop 256), librosa's own window-to-hop ratio
POWER_FLOOR = 1e-8  # -80 dBFS in power
_DB_PER_NEPER = 10.0 / math.log(10.0)


def _as_waveform(waveform: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    """Check a mono waveform and return it as float32 numpy (T,)."""
    return mono_float32(waveform, name)


def analysis_frame(sample_rate_hz: int, hop_length: int | None = None) -> tuple[int, int]:
    """(STFT window, hop) in samples: ``hop_length`` and four of it, or the default frame at this rate."""
    if sample_rate_hz <= 0:
        raise ValueError(f"sample_rate_hz must be a positive number of samples per second, got {sample_rate_hz}")
    if hop_length is None:
        return round(WINDOW_HOPS * DEFAULT_HOP_S * sample_rate_hz), round(DEFAULT_HOP_S * sample_rate_hz)
    if isinstance(hop_length, bool) or not isinstance(hop_length, int) or hop_length < 1:
        raise ValueError(f"hop_length must be a positive number of samples (the model's hop) or None, got {hop_length!r}")
    return WINDOW_HOPS * hop_length, hop_length


def mel_cepstra(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, hop_length: int | None = None) -> np.ndarray:
    """Mel-cepstra c1..c24 of one waveform, (T_frames, 24), natural-log amplitude scale."""
    window_length, hop = analysis_frame(sample_rate_hz, hop_length)
    audio = _as_waveform(waveform, "waveform")
    mel_power = librosa.feature.melspectrogram(
        y=audio,
        sr=sample_rate_hz,
        n_fft=window_length,
        hop_length=hop,
        n_mels=NUM_MEL_BANDS,
    )  # (80, T_frames)
    log_amplitude = 0.5 * np.log(np.maximum(mel_power, POWER_FLOOR))  # (80, T_frames)
    # scipy's unnormalised DCT-II is 2 * sum_n x_n cos(...); dividing by 2N gives the c_m above.
    cepstra = scipy.fft.dct(log_amplitude, type=2, axis=0) / (2 * NUM_MEL_BANDS)  # (80, T_frames)
    return cepstra[1: NUM_CEPSTRA + 1].T


def mel_cepstral_distortion(
    test: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, sample_rate_hz: int,
    hop_length: int | None = None,
) -> float:
    """MCD in dB of ``test`` (T_test,) against ``reference`` (T_ref,), both at ``sample_rate_hz``,
    on frames of ``hop_length`` samples (None: the default frame, module docstring)."""
    test_cepstra = mel_cepstra(_as_waveform(test, "test"), sample_rate_hz, hop_length)  # (F_test, 24)
    reference_cepstra = mel_cepstra(_as_waveform(reference, "reference"), sample_rate_hz, hop_length)  # (F_ref, 24)
    if len(test_cepstra) != len(reference_cepstra):
        _, path = librosa.sequence.dtw(X=test_cepstra.T, Y=reference_cepstra.T, metric="euclidean")  # (P, 2)
        test_cepstra, reference_cepstra = test_cepstra[path[:, 0]], reference_cepstra[path[:, 1]]
    frame_distances = np.sqrt(2.0 * np.sum((test_cepstra - reference_cepstra) ** 2, axis=1))  # (F,)
    return float(_DB_PER_NEPER * frame_distances.mean())


class MelCepstralDistortion(Metric):
    """Mean MCD (dB) over the utterance pairs given to ``update``; lower is closer to the teacher.

    ``hop_length``: the model's hop in samples, or None for the default frame (module docstring).
    """

    higher_is_better = False
    full_state_update = False

    def __init__(self, hop_length: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.hop_length = hop_length
        self.add_state("distortions_db", default=[], dist_reduce_fx="cat")

    def update(
        self, test: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray, sample_rate_hz: int
    ) -> None:
        distortion_db = mel_cepstral_distortion(test, reference, sample_rate_hz, self.hop_length)
        self.distortions_db.append(torch.tensor([distortion_db], dtype=torch.float64))

    def compute(self) -> torch.Tensor:
        if not self.distortions_db:
            raise RuntimeError("MelCepstralDistortion.compute() called before any update(): add one pair first")
        return dim_zero_cat(self.distortions_db).mean()
