"""GPT-SoVITS v2 audio streamed while its tokens decode (models/gpt_sovits/streaming.py): chunks come
when due, join to one decode's length, and differ from one decode of the same tokens only a little
at the seams; the step decoder hands out the first chunk before its sentence finishes.

    python -m pytest -q tests/models/gpt_sovits/test_gpt_sovits_streaming.py            # tiny weights
    python -m pytest -q -m slow tests/models/gpt_sovits/test_gpt_sovits_streaming.py    # full-size random
"""
from __future__ import annotations

import io
import time

import pytest
import soundfile
import torch
from conftest import compose_config
from fastapi.testclient import TestClient

from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.streaming import (
    ChunkSettings,
    TokenAudioStream,
    crossfade,
    seam_error,
)
from models.gpt_sovits.tiny import tiny_voice
from models.gpt_sovits.voice_files import (
    GptSovitsFiles,
    load_voice,
    synthetic_reference,
)
from models.interface import StreamingTokenStepDecoder, SynthesisRequest, VoiceCondition
from models.registry import get_family
from serve.app import create_app
from serve.engines import served_as_is
from serve.settings import serve_settings_from_config

SENTENCE = "Where did Kenji leave his lantern last night?"


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


def _streamed(stream: TokenAudioStream, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Feed ``tokens`` one at a time, as a decoder makes them; the chunks then the final flush."""
    chunks = []
    for count in range(1, tokens.numel() + 1):
        chunks += stream.push(tokens[:count])
    return chunks + [stream.finish(tokens)]


@pytest.mark.parametrize("settings, message", [
    ({"first_chunk_tokens": 0}, "first_chunk_tokens=0"),
    ({"chunk_tokens": -1}, "chunk_tokens=-1"),
    ({"left_context_tokens": -2}, "left_context_tokens=-2"),
    ({"chunk_tokens": 4, "holdback_tokens": 4}, "holdback_tokens=4.*fewer than its 4 tokens"),
    ({"holdback_tokens": 2, "crossfade_tokens": 3}, "crossfade_tokens=3.*at most holdback_tokens=2"),
])
def test_settings_that_cannot_stream_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ChunkSettings(**settings)


def test_chunks_come_when_due_and_a_local_decoder_streams_exactly():
    """A decoder whose samples depend on their own token only: the chunks join to the whole decode
    exactly, the first after ``first_chunk_tokens`` and then every ``chunk_tokens``; each chunk holds
    its last ``holdback_tokens`` back for the next window to speak."""
    samples_per_token = 8

    def decode_window(tokens: torch.Tensor, first_token: int) -> torch.Tensor:
        return (tokens.float() / 100).repeat_interleave(samples_per_token)

    tokens = torch.arange(1, 48)
    stream = TokenAudioStream(decode_window, samples_per_token, ChunkSettings(10, 15, left_context_tokens=3, holdback_tokens=2, crossfade_tokens=1))
    made_at = []
    chunks = []
    for count in range(1, tokens.numel() + 1):
        new = stream.push(tokens[:count])
        made_at += [count] * len(new)
        chunks += new
    chunks.append(stream.finish(tokens))
    assert made_at == [10, 25, 40]
    assert [c.numel() for c in chunks] == [8 * 8, 15 * 8, 15 * 8, (7 + 2) * 8]
    torch.testing.assert_close(torch.cat(chunks), decode_window(tokens, 0), atol=1e-6, rtol=0)


def test_at_another_speed_the_chunks_keep_the_scaled_length():
    """length_scale 1.25: a window of n tokens gives int(n x 8 x 1.25) samples; the chunks join to
    within a few samples of one decode's length."""
    def decode_window(tokens: torch.Tensor, first_token: int) -> torch.Tensor:
        return torch.ones(int(tokens.numel() * 8 * 1.25))

    tokens = torch.arange(60)
    chunks = _streamed(TokenAudioStream(decode_window, 8, ChunkSettings(10, 10, 4, 2, 1)), tokens)
    assert len(chunks) == 7  # a chunk at every 10 tokens, then the flush of the last one's held-back audio
    assert abs(sum(c.numel() for c in chunks) - decode_window(tokens, 0).numel()) <= 6


def test_a_sentence_shorter_than_the_first_chunk_is_one_decode(voice):
    utterance = voice.text_to_utterances(SENTENCE)[0]
    prompt = voice.prompt_of(voice.default_reference)
    sampling = GptSovitsSampling(seed=3)
    tokens = torch.randint(0, 1024, (12,), generator=torch.Generator().manual_seed(0))
    chunks = _streamed(voice.audio_stream(utterance.phoneme_ids, prompt, sampling), tokens)
    whole = voice.tokens_to_audio(tokens, utterance.phoneme_ids, prompt, sampling).clamp(-1, 1)
    assert len(chunks) == 1 and torch.equal(chunks[0], whole)


def test_finishing_with_fewer_tokens_than_were_spoken_is_refused():
    stream = TokenAudioStream(lambda tokens, first: tokens.float().repeat_interleave(4), 4, ChunkSettings(5, 5, 2, 1, 1))
    assert len(stream.push(torch.arange(6))) == 1
    with pytest.raises(ValueError, match="finish got 3 tokens but 5 were already decoded"):
        stream.finish(torch.arange(3))


def test_the_crossfade_keeps_a_constant_signal_constant():
    faded = crossfade(torch.full((64,), 0.3), torch.full((64,), 0.3))
    torch.testing.assert_close(faded, torch.full((64,), 0.3))
    ramp = crossfade(torch.zeros(64), torch.ones(64))
    assert ramp[0] < 0.01 and ramp[-1] > 0.99 and bool((ramp[1:] >= ramp[:-1]).all())


def _seam_error(voice, settings: ChunkSettings, token_count: int = 110, noise_scale: float = 0.5):
    utterance = voice.text_to_utterances(SENTENCE)[0]
    prompt = voice.prompt_of(voice.default_reference)
    sampling = GptSovitsSampling(seed=3, noise_scale=noise_scale)
    tokens = torch.randint(0, voice.sovits.config.codebook_size, (token_count,),
                           generator=torch.Generator().manual_seed(1))
    chunks = _streamed(voice.audio_stream(utterance.phoneme_ids, prompt, sampling, settings), tokens)
    whole = voice.tokens_to_audio(tokens, utterance.phoneme_ids, prompt, sampling).clamp(-1, 1)
    return seam_error(chunks, whole, seam_radius_samples=voice.hop_length)


def test_streamed_audio_matches_one_decode_but_at_the_seams_on_tiny_weights(voice):
    """Tiny weights, 110 tokens (4.4 s) in 5 chunks, prior noise at 0.5 (peak 0.10): with the default
    context, hold-back and cross-fade the streamed audio is within 2.3e-4 of one decode, SNR 56.5 dB;
    without them each seam is a jump of 0.093 and the SNR 29.6 dB."""
    default = _seam_error(voice, ChunkSettings())
    bare = _seam_error(voice, ChunkSettings(left_context_tokens=0, holdback_tokens=0, crossfade_tokens=0))
    assert default.chunks == bare.chunks == 5 and default.samples == 110 * voice.hop_length
    assert default.snr_db > 50, default
    assert default.max_abs_error_near_seams < 1e-3, default
    assert bare.snr_db < 35 and bare.max_abs_error_near_seams > 0.05, bare


def test_the_step_decoder_hands_out_the_first_chunk_before_its_sentence_finishes(voice):
    sampling = GptSovitsSampling.deterministic(max_tokens=50)
    utterance = voice.text_to_utterances(SENTENCE)[0]
    clip = synthetic_reference(24_000, seconds=3.5)
    settings = ChunkSettings(first_chunk_tokens=20, chunk_tokens=20)
    decoder = voice.step_decoder(max_rows=2, chunking=settings)
    assert isinstance(decoder, StreamingTokenStepDecoder)
    decoder.join("a", SynthesisRequest.from_utterances([utterance], sampling=sampling,
                                                       voice=VoiceCondition(reference=clip)))
    made = []  # (tokens chosen so far, chunk, last)
    while decoder.active:
        chunks = decoder.step_chunks()
        made += [(int(decoder.engine.step[0]), chunk, last) for key, chunk, last in chunks]
    assert [last for _, _, last in made] == [False, False, True]
    assert made[0][0] == 20  # the first chunk leaves with token 20 (the prefill's and 19 steps')
    assert made[0][0] < made[-1][0]
    # the eager decode's tokens, every generated one (a stream speaks the first even after a max_tokens stop)
    prompt = voice.prompt_of(clip)
    text_ids, bert = voice.decode_input(utterance.phoneme_ids, prompt)
    from models.gpt_sovits.t2s_decode import decode

    tokens = decode(voice.t2s, text_ids, bert, prompt.tokens, sampling).tokens
    whole = voice.tokens_to_audio(tokens, utterance.phoneme_ids, prompt, sampling).clamp(-1, 1)
    error = seam_error([chunk for _, chunk, _ in made], whole, voice.hop_length)
    assert error.samples == tokens.numel() * voice.hop_length
    assert error.snr_db > 40, error


def test_the_server_streams_the_tiny_voice_by_token_chunks(voice, tmp_path):
    """``serve.streaming=decoder_chunks`` on an autoregressive family: the scheduler drives
    ``step_chunks``; the response is the sentence's every token spoken (1280 samples each)."""
    family = get_family(voice.family)
    settings = serve_settings_from_config(compose_config(tmp_path, [
        "serve.source=teacher", "serve.warmup=false", "serve.streaming=decoder_chunks"]))
    served = served_as_is(voice, family, "teacher", family.default_voice)
    with TestClient(create_app(settings, served)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.app.state.serve.batcher.streams_chunks
        response = client.post("/v1/audio/speech", json={"model": "teacher", "voice": served.voice_name,
                                                         "input": "Hello there.", "response_format": "wav"})
    assert response.status_code == 200, response.text
    audio, sample_rate_hz = soundfile.read(io.BytesIO(response.content))
    assert sample_rate_hz == voice.sample_rate_hz and audio.size > 0 and audio.size % voice.hop_length == 0


@pytest.mark.slow
def test_streamed_audio_matches_one_decode_but_at_the_seams_on_full_size_weights():
    """Full-size random weights (the official manifests), 110 tokens in 5 chunks, default settings
    (peak 0.018): SNR 44.3 dB, 1.4e-4 at most near the seams as elsewhere (13.5 dB and 0.012 bare)."""
    torch.set_num_threads(1)
    voice = load_voice(GptSovitsFiles.parse("random"))
    error = _seam_error(voice, ChunkSettings())
    assert error.samples == 110 * voice.hop_length
    assert error.snr_db > 40, error
    assert error.max_abs_error_near_seams < 5e-4, error
