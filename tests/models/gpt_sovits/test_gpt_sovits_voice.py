"""The GPT-SoVITS v2 voice behind the family interface, on tiny random weights: prompts are computed
once per clip, bad clips are refused, the server's token-step decoder gives the eager decode's
tokens and audio, and the voice string names the user's files or random weights."""
from __future__ import annotations

import copy

import pytest
import torch

from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.tiny import tiny_voice
from models.gpt_sovits.voice import MIN_CAPPED_TOKENS
from models.gpt_sovits.voice_files import GptSovitsFiles, synthetic_reference
from models.interface import ReferenceClip, SynthesisRequest, VoiceCondition


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


def test_a_prompt_is_computed_once_per_clip(voice):
    clip = synthetic_reference(16_000)
    first = voice.prompt_of(clip)
    assert voice.prompt_of(ReferenceClip(clip.waveform.clone(), 16_000, clip.transcript)) is first
    other = voice.prompt_of(ReferenceClip(clip.waveform * 0.5, 16_000, clip.transcript))
    assert other is not first
    assert first.tokens.dtype == torch.long and first.tokens.numel() > 0
    assert first.bert_features.shape == (1024, first.phoneme_ids.numel())


@pytest.mark.parametrize("seconds, transcript, message", [(1.0, "Hi.", "3 to 10 s"), (4.0, " ", "transcript")])
def test_clips_the_official_code_refuses_are_refused(voice, seconds, transcript, message):
    clip = ReferenceClip(torch.zeros(int(16_000 * seconds)), 16_000, transcript)
    with pytest.raises(ValueError, match=message):
        voice.prompt_of(clip)


def test_the_token_step_decoder_gives_the_eager_tokens_and_audio(voice):
    sampling = GptSovitsSampling.deterministic(max_tokens=40)
    utterances = voice.text_to_utterances("Where did Kenji leave his lantern?") + voice.text_to_utterances("你好。")
    clip = synthetic_reference(24_000, seconds=3.5)
    decoder = voice.step_decoder(max_rows=2)
    for key, utterance in enumerate(utterances):
        decoder.join(key, SynthesisRequest.from_utterances([utterance], sampling=sampling,
                                                           voice=VoiceCondition(reference=clip)))
    finished = {}
    while decoder.active:
        finished.update(decoder.step())
    assert sorted(finished) == [0, 1]
    for key, utterance in enumerate(utterances):
        eager = voice.synthesize(SynthesisRequest.from_utterances([utterance], sampling=sampling,
                                                                  voice=VoiceCondition(reference=clip)))
        assert torch.equal(finished[key].tokens, eager.tokens)
        torch.testing.assert_close(finished[key].audio, eager.audio, atol=1e-5, rtol=0)


def test_weights_that_never_stop_decode_a_speakers_length_of_tokens(voice):
    """Random weights seldom choose EOS: their sentences stop after ``tokens_per_phone`` tokens a
    phone, in the eager path and the server's step decoder alike, as an explicit max_tokens would."""
    never_stopping = copy.deepcopy(voice)
    never_stopping.tokens_per_phone = 1.0
    utterance = voice.text_to_utterances("Where did Kenji leave his lantern?")[0]
    phones = len(utterance.phoneme_ids)
    cap = never_stopping.token_cap(phones)
    assert cap == max(MIN_CAPPED_TOKENS, phones) and voice.token_cap(phones) == voice.max_tokens
    long = GptSovitsSampling.deterministic(max_tokens=300)
    uncapped = voice.synthesize(SynthesisRequest.from_utterances([utterance], sampling=long))
    assert uncapped.tokens.shape[1] > cap  # the cap binds: these weights speak past it
    capped = never_stopping.synthesize(SynthesisRequest.from_utterances([utterance], sampling=long))
    explicit = voice.synthesize(SynthesisRequest.from_utterances(
        [utterance], sampling=GptSovitsSampling.deterministic(max_tokens=cap)))
    assert torch.equal(capped.tokens, explicit.tokens)
    decoder = never_stopping.step_decoder(max_rows=1)
    decoder.join("row", SynthesisRequest.from_utterances([utterance], sampling=long))
    finished = {}
    while decoder.active:
        finished.update(decoder.step())
    assert torch.equal(finished["row"].tokens, explicit.tokens)


def test_the_voice_string_names_every_file_or_none():
    assert GptSovitsFiles.parse("random").is_random
    unset = GptSovitsFiles.parse("gpt=None;sovits=None;hubert=None;bert=None;reference_audio=None;reference_text=None")
    assert unset.is_random
    files = GptSovitsFiles.parse("gpt=a.ckpt;sovits=b.pth;hubert=h;bert=r;reference_audio=me.wav;reference_text=Hi; there")
    assert files.reference_text == "Hi; there" and str(files.gpt) == "a.ckpt"
    with pytest.raises(ValueError, match="needs all of"):
        GptSovitsFiles.parse("gpt=a.ckpt;sovits=None")
    with pytest.raises(ValueError, match="not KEY=PATH"):
        GptSovitsFiles.parse("weights=a.ckpt")
