"""The tiny Kokoro voice behind the TTSModel interface: seeded noise, padded batching that changes
no sentence, style rows by phoneme count, refused conditioning."""
from __future__ import annotations

import pytest
import torch

from models.interface import SynthesisRequest, TTSModel, VoiceCondition
from models.kokoro.family import FAMILY, load_teacher
from models.kokoro.sampling import KokoroSampling
from models.kokoro.tiny import tiny_voice

TEXT = "The quick brown fox jumps. Where did Kenji leave his lantern?"


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


def test_interface_and_family(voice):
    assert isinstance(voice, TTSModel)
    assert tuple(voice.parts()) == FAMILY.part_roles
    assert voice.hop_length == 24 and voice.sample_rate_hz == 24000


def test_audio_length_is_frames_times_hop(voice):
    utterances = voice.text_to_utterances(TEXT)
    result = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(seed=1)))
    for row, utterance in enumerate(utterances):
        frames = int(result.durations[row, : len(utterance.phoneme_ids)].sum())
        assert int(result.audio_lengths[row]) == frames * voice.hop_length
    assert torch.isfinite(result.audio).all()


@pytest.mark.parametrize("sampling", [KokoroSampling(seed=5), KokoroSampling.deterministic()], ids=["noise", "quiet"])
def test_seed_decides_the_noise_and_batching_changes_nothing(voice, sampling):
    """One padded batch: every sentence equals itself alone, to float32 rounding, over its whole
    length (masked AdaIN statistics, LSTMs by length, per-item STFT padding and phase interpolation)."""
    utterances = voice.text_to_utterances(TEXT)
    batch = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=sampling))
    for row, utterance in enumerate(utterances):
        alone = voice.synthesize(SynthesisRequest.from_utterances([utterance], sampling=sampling))
        torch.testing.assert_close(batch.waveforms()[row], alone.waveforms()[0], atol=2e-6, rtol=0)
        assert torch.equal(batch.durations[row, : len(utterance.phoneme_ids)], alone.durations[0])
        assert not batch.audio[row, int(batch.audio_lengths[row]):].any()  # zero past its end


def test_another_seed_draws_other_noise(voice):
    utterances = voice.text_to_utterances(TEXT)[1:]
    alone = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(seed=5)))
    other = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(seed=6)))
    assert not torch.equal(other.waveforms()[0], alone.waveforms()[0])


def test_noise_off_is_deterministic_and_differs_from_noise_on(voice):
    utterances = voice.text_to_utterances(TEXT)[:1]
    quiet = [voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling.deterministic(seed=seed)))
             for seed in (1, 2)]
    assert torch.equal(quiet[0].audio, quiet[1].audio)
    noisy = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(seed=1)))
    assert not torch.equal(noisy.audio, quiet[0].audio)


def test_slower_speech_has_more_frames(voice):
    utterances = voice.text_to_utterances(TEXT)[:1]
    normal = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(length_scale=1.0)))
    slow = voice.synthesize(SynthesisRequest.from_utterances(utterances, sampling=KokoroSampling(length_scale=2.0)))
    assert int(slow.audio_lengths[0]) > int(normal.audio_lengths[0])


def test_style_row_follows_phoneme_count(voice):
    assert torch.equal(voice.style_row(1), voice.style_pack[:1])
    assert torch.equal(voice.style_row(10_000), voice.style_pack[-1:])


def test_conditioning_is_refused(voice):
    utterances = voice.text_to_utterances("Hello.")
    request = SynthesisRequest.from_utterances(utterances, voice=VoiceCondition(speaker_id=torch.zeros(1, dtype=torch.long)))
    with pytest.raises(ValueError, match="speaker_id"):
        voice.synthesize(request)


def test_unknown_voice_name_is_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="jf_alpha"):
        load_teacher("af_heart", tmp_path)
