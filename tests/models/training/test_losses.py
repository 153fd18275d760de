"""The spectral losses on cases whose answer is known.

    python -m pytest -q tests/models/training/test_losses.py
"""
from __future__ import annotations

import math

import pytest
import torch

from models.training.losses import (
    DistillationLoss,
    LossWeights,
    MelSpectrogramLoss,
    MultiResolutionSTFTLoss,
    mel_filterbank,
    relative_waveform_error,
)

SAMPLE_RATE_HZ = 22050
HOP_LENGTH = 256  # a Piper medium voice's samples per frame at 22.05 kHz


@pytest.fixture
def noise_audio() -> torch.Tensor:
    """Two 0.4 s white-noise waveforms at amplitude 0.1: every STFT bin sits far above the floors."""
    return 0.1 * torch.randn(2, 8820, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("loss", [MultiResolutionSTFTLoss(), MelSpectrogramLoss(SAMPLE_RATE_HZ, HOP_LENGTH)],
                         ids=["mr-stft", "mel"])
def test_identical_waveforms_cost_nothing(loss, noise_audio):
    assert loss(noise_audio, noise_audio.clone()).item() == pytest.approx(0.0, abs=1e-6)


def test_half_amplitude_golden_numbers(noise_audio):
    """Halving the amplitude halves every magnitude: convergence 0.5, log terms log 2."""
    parts = MultiResolutionSTFTLoss().components(0.5 * noise_audio, noise_audio)
    assert parts["spectral_convergence"].item() == pytest.approx(0.5, abs=1e-5)
    assert parts["log_magnitude"].item() == pytest.approx(math.log(2), abs=1e-4)
    assert MelSpectrogramLoss(SAMPLE_RATE_HZ, HOP_LENGTH)(0.5 * noise_audio, noise_audio).item() == pytest.approx(
        math.log(2), abs=1e-4)


@pytest.mark.parametrize("loss", [MultiResolutionSTFTLoss(), MelSpectrogramLoss(SAMPLE_RATE_HZ, HOP_LENGTH)],
                         ids=["mr-stft", "mel"])
def test_more_noise_costs_more(loss):
    time_s = torch.arange(8820) / SAMPLE_RATE_HZ
    tone = (0.3 * torch.sin(2 * math.pi * 220 * time_s) + 0.2 * torch.sin(2 * math.pi * 1230 * time_s))[None]
    hiss = torch.randn(tone.shape, generator=torch.Generator().manual_seed(1))
    costs = [loss(tone + level * hiss, tone).item() for level in (0.0, 0.001, 0.01, 0.1)]
    assert costs == sorted(costs) and costs[0] < 1e-6 < costs[1], costs


@pytest.mark.parametrize("loss", [MultiResolutionSTFTLoss(), MelSpectrogramLoss(SAMPLE_RATE_HZ, HOP_LENGTH)],
                         ids=["mr-stft", "mel"])
def test_gradients_reach_the_prediction(loss, noise_audio):
    predicted = (0.7 * noise_audio).requires_grad_(True)
    loss(predicted, noise_audio).backward()
    assert torch.isfinite(predicted.grad).all() and predicted.grad.abs().sum() > 0


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(1, 100\) and \(1, 99\)"):
        MultiResolutionSTFTLoss()(torch.zeros(1, 100), torch.zeros(1, 99))


def test_mel_filterbank_equals_librosa():
    librosa = pytest.importorskip("librosa")
    reference = librosa.filters.mel(sr=SAMPLE_RATE_HZ, n_fft=1024, n_mels=80)
    ours = mel_filterbank(SAMPLE_RATE_HZ, 1024, 80)
    assert ours.shape == reference.shape
    assert torch.allclose(ours, torch.from_numpy(reference).float(), atol=1e-6)


def test_relative_waveform_error_is_the_snr_in_amplitude(noise_audio):
    """Added noise at a known SNR: the error is 10 ** (-SNR / 20); identical waveforms cost nothing."""
    error = torch.randn(noise_audio.shape, generator=torch.Generator().manual_seed(2))
    error *= 10 ** (-7 / 20) * torch.linalg.norm(noise_audio) / torch.linalg.norm(error)  # 7 dB below the signal
    assert relative_waveform_error(noise_audio + error, noise_audio).item() == pytest.approx(10 ** (-7 / 20), rel=1e-5)
    assert relative_waveform_error(noise_audio, noise_audio.clone()).item() == 0.0


def test_only_the_waveform_term_sees_a_phase_shift(noise_audio):
    """White noise one sample late: every magnitude nearly as it was (a 512-sample window moves by
    one sample), yet sqrt(2) away as a waveform (neighbouring samples are uncorrelated). The
    reason a student that could follow the teacher's phase needs the waveform term."""
    late = torch.roll(noise_audio, 1, dims=1)
    loss = DistillationLoss(SAMPLE_RATE_HZ, HOP_LENGTH, LossWeights(waveform=1.0))
    parts = loss(late, noise_audio)
    assert parts["mel"].item() < 0.02 and parts["stft"].item() < 0.25, parts  # 0.008 and 0.20 here
    assert parts["waveform"].item() == pytest.approx(math.sqrt(2), rel=0.02)  # worse than silence (1.0)
    assert parts["loss"].item() == pytest.approx(sum(parts[k].item() for k in ("stft", "mel", "waveform")), rel=1e-6)


def test_waveform_term_is_off_by_default(noise_audio):
    assert "waveform" not in DistillationLoss(SAMPLE_RATE_HZ, HOP_LENGTH)(0.5 * noise_audio, noise_audio)


@pytest.mark.parametrize("weights", [dict(waveform=-1.0), dict(stft=0.0, mel=0.0, waveform=0.0)],
                         ids=["negative", "all-zero"])
def test_bad_loss_weights_are_refused(weights):
    with pytest.raises(ValueError, match="loss weights"):
        LossWeights(**weights)
