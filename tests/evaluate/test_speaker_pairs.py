"""Speaker similarity over pairs where one side holds no speech: a silent reference is left out
(random weights' audio), a silenced test scores 0, and neither stops a run at its last metric."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from evaluate.runner import VariantEvaluation, _quality_metrics
from evaluate.speaker import SpeakerSimilarity, speech_at_16k

RATE_HZ = 16_000


def voiced(seconds: float = 3.0, pitch_hz: float = 140.0) -> torch.Tensor:
    """A harmonic series under a 4 Hz syllable envelope: speech to resemblyzer's voice-activity detector."""
    t = torch.arange(int(RATE_HZ * seconds)) / RATE_HZ  # (T,) seconds
    harmonics = sum(torch.sin(2 * math.pi * pitch_hz * k * t) / k for k in range(1, 8))
    return 0.2 * harmonics * 0.5 * (1 - torch.cos(2 * math.pi * 4 * t))


def silent(seconds: float = 3.0) -> torch.Tensor:
    return 1e-4 * torch.randn(int(RATE_HZ * seconds), generator=torch.Generator().manual_seed(0))


def test_the_signals_are_what_the_detector_calls_them():
    assert speech_at_16k(voiced(), RATE_HZ).size > 0
    assert speech_at_16k(silent(), RATE_HZ).size == 0


def test_silent_references_are_left_out_and_silenced_tests_score_zero():
    similarity = SpeakerSimilarity()
    similarity.update(voiced(), voiced(), RATE_HZ)  # the same clip: 1
    similarity.update(silent(), voiced(), RATE_HZ)  # the variant lost the voice: 0
    similarity.update(voiced(), silent(), RATE_HZ)  # nothing to compare with: left out
    assert (similarity.scored_pairs, similarity.silenced_pairs, similarity.unscored_pairs) == (2, 1, 1)
    assert float(similarity.compute()) == pytest.approx(0.5, abs=1e-5)


def test_no_voiced_reference_leaves_nothing_to_compute():
    similarity = SpeakerSimilarity()
    similarity.update(voiced(), silent(), RATE_HZ)
    with pytest.raises(RuntimeError, match="no pair to score"):
        similarity.compute()


def test_a_run_whose_reference_never_speaks_gets_no_spk_sim_and_the_counts():
    reference = VariantEvaluation(metrics={}, waveforms=[silent(), silent()], sample_rate_hz=RATE_HZ)
    metrics = _quality_metrics([voiced(), silent()], RATE_HZ, ["a", "b"], SimpleNamespace(metrics=("spk_sim",)),
                               reference, recognizer=None)
    assert "spk_sim" not in metrics
    assert metrics["spk_sim_unscored_utterances"] == 2 and metrics["spk_sim_silenced_utterances"] == 0
