"""Where in frequency a waveform is louder or quieter than its reference (same text, same timing), in dB.

A student vocoder can score well on an overall measure and still be quieter than its teacher in
one region: Kokoro's Lite decoder, trained on 0.4 s segments, sits 4-5 dB under the teacher in
1-6 kHz on whole utterances and within 1 dB on the segments it was trained on. This measure names
such a band. For each band, frame by frame, the test's power over the reference's in dB; the
median over the reference's loud frames (within ``loudness_range_db`` of its loudest), so pauses
and onsets do not decide the figure. Both waveforms must be time-aligned (a vocoder and its
student on the same decoder input); no warping is done.

Usage::

    from evaluate.band_levels import band_level_difference_db

    band_level_difference_db(student_audio, teacher_audio, sample_rate_hz=24000)  # -> (bands,) dB
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Octave-ish bands up to 12 kHz: fine enough to tell a tilt from a notch, coarse enough to be stable.
DEFAULT_BAND_EDGES_HZ = (0, 250, 500, 1000, 2000, 3000, 4000, 6000, 8000, 12000)
WINDOW_SECONDS = 1024 / 24000  # 43 ms, 1024 samples at Kokoro's 24 kHz
HOP_FRACTION = 4  # four frames per window


def _band_power(audio: np.ndarray, sample_rate_hz: int, edges_hz: Sequence[float]) -> torch.Tensor:
    """(T,) -> (frames, bands) power summed over each band's STFT bins."""
    window_length = int(round(WINDOW_SECONDS * sample_rate_hz))
    waveform = torch.as_tensor(np.asarray(audio, dtype=np.float32))
    spectrum = torch.stft(waveform, window_length, window_length // HOP_FRACTION,
                          window=torch.hann_window(window_length), return_complex=True)  # (bins, frames)
    power = spectrum.abs().pow(2).T  # (frames, bins)
    frequencies = torch.fft.rfftfreq(window_length, 1 / sample_rate_hz)
    return torch.stack([power[:, (frequencies >= low) & (frequencies < high)].sum(1)
                        for low, high in zip(edges_hz[:-1], edges_hz[1:])], dim=1)


def band_level_difference_db(audio: np.ndarray, reference: np.ndarray, sample_rate_hz: int,
                             edges_hz: Sequence[float] = DEFAULT_BAND_EDGES_HZ,
                             loudness_range_db: float = 30.0) -> np.ndarray:
    """Median over the reference's loud frames of 10 log10(test band power / reference band power):
    (bands,) for the bands between consecutive ``edges_hz``. Negative: the test is quieter there."""
    edges_hz = tuple(float(edge) for edge in edges_hz)
    if len(edges_hz) < 2 or any(high <= low for low, high in zip(edges_hz[:-1], edges_hz[1:])):
        raise ValueError(f"edges_hz {edges_hz}: need at least two increasing frequencies")
    if edges_hz[-1] > sample_rate_hz / 2:
        raise ValueError(f"edges_hz ends at {edges_hz[-1]} Hz, above Nyquist ({sample_rate_hz / 2} Hz)")
    if len(audio) != len(reference):
        raise ValueError(f"audio has {len(audio)} samples and its reference {len(reference)}: "
                         "the measure compares time-aligned waveforms")
    test, ref = _band_power(audio, sample_rate_hz, edges_hz), _band_power(reference, sample_rate_hz, edges_hz)
    if (ref.sum(0) == 0).any():
        raise ValueError("the reference is silent in at least one band: no level to compare against")
    tiny = torch.finfo(torch.float32).tiny
    frame_level_db = 10 * torch.log10(ref.sum(1) + tiny)  # (frames,)
    loud = frame_level_db > frame_level_db.max() - loudness_range_db
    ratio_db = 10 * torch.log10(test[loud] + tiny) - 10 * torch.log10(ref[loud] + tiny)  # (loud frames, bands)
    return ratio_db.median(dim=0).values.numpy().astype(np.float64)
