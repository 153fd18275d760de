"""The convolutional STFT against torch.stft / torch.istft at Kokoro's real size (n_fft 20, hop 5)."""
from __future__ import annotations

import math

import pytest
import torch

from models.kokoro.stft import ConvStft

N_FFT, HOP = 20, 5


def test_transform_equals_torch_stft():
    waveform = torch.randn(2, 24_000, generator=torch.Generator().manual_seed(0))
    magnitude, phase = ConvStft(N_FFT, HOP, "torch").transform(waveform)
    reference = torch.stft(waveform, N_FFT, HOP, N_FFT, window=torch.hann_window(N_FFT), return_complex=True)
    torch.testing.assert_close(magnitude, reference.abs(), atol=2e-5, rtol=1e-5)
    strong = reference.abs() > 1e-2  # phase is only defined where there is energy
    wrapped = torch.remainder(phase - reference.angle() + math.pi, 2 * math.pi) - math.pi
    assert float(wrapped[strong].abs().max()) < 1e-3


def test_inverse_equals_torch_istft():
    generator = torch.Generator().manual_seed(1)
    magnitude = torch.rand(2, N_FFT // 2 + 1, 300, generator=generator) + 0.1
    phase = (torch.rand(2, N_FFT // 2 + 1, 300, generator=generator) - 0.5) * 2 * math.pi
    reference = torch.istft(magnitude * torch.exp(1j * phase), N_FFT, HOP, N_FFT, window=torch.hann_window(N_FFT))
    ours = ConvStft(N_FFT, HOP, "torch").inverse(magnitude, phase)
    assert ours.shape == (2, 1, HOP * 299)
    torch.testing.assert_close(ours.squeeze(1), reference, atol=1e-5, rtol=1e-5)


def test_round_trip_reconstructs_the_signal():
    waveform = torch.randn(1, 6_000, generator=torch.Generator().manual_seed(2))
    stft = ConvStft(N_FFT, HOP, "torch")
    torch.testing.assert_close(stft.inverse(*stft.transform(waveform)).squeeze(1), waveform, atol=1e-4, rtol=1e-4)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="torch"):
        ConvStft(N_FFT, HOP, "complex")
