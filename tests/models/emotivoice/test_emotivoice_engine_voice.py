"""The EmotiVoice voice on its bucketed engine (models/emotivoice/engine_voice.py), as the server
runs it: same requests, same outputs as the voice itself, row for row, at any pace. Eager buckets
on the CPU; the CUDA-graph replay of the same stages is tested in test_emotivoice_engines.py."""
from __future__ import annotations

import pytest
import torch

from models.emotivoice.engine_voice import EngineVoice, ServedEngineOptions, bucketed_engine
from models.emotivoice.engines import TEXT_BUCKETS, BucketedEngine
from models.emotivoice.family import FAMILY
from models.emotivoice.tiny import tiny_voice
from models.interface import SynthesisRequest, TTSModel, VoiceCondition


@pytest.fixture(scope="module")
def voice():
    return tiny_voice(0)


@pytest.fixture(scope="module")
def engine_voice(voice):
    return EngineVoice(voice, BucketedEngine(voice.generator, graphs=False, frame_dtype=torch.float32,
                                             batch_buckets=(4,), frame_bucket=32))


@pytest.mark.parametrize("length_scale", [1.0, 1.4])
def test_engine_voice_speaks_as_the_voice(voice, engine_voice, length_scale):
    utterances = voice.text_to_utterances("Hello there. The train leaves at nine.")
    assert len(utterances) == 2
    request = SynthesisRequest.from_utterances(utterances, voice=VoiceCondition(emotion="开心"),
                                               sampling=FAMILY.sampling(length_scale=length_scale))
    expected, out = voice.synthesize(request), engine_voice.synthesize(request)
    assert torch.equal(out.durations, expected.durations)  # paced durations, the frames each phoneme gets
    assert torch.equal(out.audio_lengths, expected.audio_lengths)
    for row, samples in enumerate(out.audio_lengths.tolist()):
        torch.testing.assert_close(out.audio[row, :samples], expected.audio[row, :samples], rtol=1e-4, atol=1e-5)


def test_the_pace_is_an_input_of_the_text_stage(voice, engine_voice):
    request = SynthesisRequest.from_utterances(voice.text_to_utterances("Hello there."))
    slow = SynthesisRequest.from_utterances(voice.text_to_utterances("Hello there."),
                                            sampling=FAMILY.sampling(length_scale=2.0))
    normal, slowed = engine_voice.synthesize(request), engine_voice.synthesize(slow)
    assert slowed.audio_lengths[0] == 2 * normal.audio_lengths[0]


def test_the_family_hook_builds_it_and_refuses_what_it_cannot_run(voice):
    served, replays_graphs, text_buckets = FAMILY.torch_engine(voice, "eager", False, None, ())
    assert isinstance(served, TTSModel) and isinstance(served, EngineVoice)
    assert (replays_graphs, text_buckets) == (False, TEXT_BUCKETS)
    assert served.speakers == voice.speakers and served.sample_rate_hz == voice.sample_rate_hz
    with pytest.raises(ValueError, match="no AOTInductor"):
        bucketed_engine(voice, "aoti", False, "/tmp/packages", ())
    with pytest.raises(ValueError, match="fixed when the engine is built"):
        served.replace_part("vocoder", voice.generator.generator)


@pytest.mark.parametrize("frame_bucket", [32, 8])
def test_the_served_engine_cuts_large_batches_into_length_groups_row_for_row(voice, frame_bucket):
    """The server's engine runs batches of 64 in four length groups, 32 in two, 256 in eight of 32
    rows, smaller ones in one run; 32 mixed-length rows (two groups here, eager buckets) come out as
    the one-run engine's, whatever multiple of frames the groups pad to."""
    served, _, _ = bucketed_engine(voice, "eager", False, None, (),
                                   options=ServedEngineOptions(frame_bucket=frame_bucket))
    assert [served.engine._groups(rows) for rows in (1, 16, 31, 32, 64, 128, 256)] == [1, 1, 1, 2, 4, 8, 8]
    one_run = EngineVoice(voice, BucketedEngine(voice.generator, graphs=False))
    texts = ["Hello there.", "The train leaves at nine tonight.", "Yes.", "A much longer sentence than the rest."]
    utterances = [utterance for text in texts for utterance in voice.text_to_utterances(text)]
    request = SynthesisRequest.from_utterances(utterances * 8)  # 32 rows of four lengths
    expected, out = one_run.synthesize(request), served.synthesize(request)
    assert len(set(out.audio_lengths.tolist())) == 4
    assert torch.equal(out.audio_lengths, expected.audio_lengths)
    for row, samples in enumerate(out.audio_lengths.tolist()):
        torch.testing.assert_close(out.audio[row, :samples], expected.audio[row, :samples], rtol=1e-4, atol=1e-5)


def test_served_engine_options_set_the_length_groups(voice):
    """serve.engine_options reaches the engine: 32 groups of at least 32 rows cut batch 1,024 into 32 and
    batch 512 into 16, where the defaults stop at 8."""
    served, _, _ = bucketed_engine(voice, "eager", False, None, (),
                                   options=ServedEngineOptions(frame_groups=32, min_group_rows=32))
    assert [served.engine._groups(rows) for rows in (31, 32, 64, 512, 1024)] == [1, 1, 2, 16, 32]
    default, _, _ = bucketed_engine(voice, "eager", False, None, ())
    assert default.engine._groups(1024) == 8
    assert (served.length_groups, default.length_groups) == (32, 8)  # what the server's warm-up reads
    finer, _, _ = bucketed_engine(voice, "eager", False, None, (), options=ServedEngineOptions(frame_bucket=8))
    assert (finer.engine.frame_bucket, default.engine.frame_bucket) == (8, 32)
    with pytest.raises(ValueError, match="frame_bucket=0"):
        ServedEngineOptions(frame_bucket=0)
    with pytest.raises(ValueError, match="frame_groups=0"):
        ServedEngineOptions(frame_groups=0)
    with pytest.raises(ValueError, match="needs serve.torch_engine=compile"):
        bucketed_engine(voice, "eager", False, None, (), options=ServedEngineOptions(compile_dynamic=True))


def test_served_engine_options_choose_the_vocoder_kernels(voice):
    """serve.engine_options.vocoder_kernels=cudnn puts the epilogue vocoder in the engine (on this CPU its
    operator runs the same formula in PyTorch: the audio is the module's, to FP16 rounding); other names are
    refused."""
    options = ServedEngineOptions(vocoder_kernels="cudnn")
    served, _, _ = bucketed_engine(voice, "eager", False, None, (), options=options)
    assert type(served.engine.frame_model.generator).__name__ == "EpilogueHifigan"
    plain = EngineVoice(voice, BucketedEngine(voice.generator, graphs=False))
    request = SynthesisRequest.from_utterances(voice.text_to_utterances("The train leaves at nine tonight."))
    expected, out = plain.synthesize(request), served.synthesize(request)
    assert torch.equal(out.audio_lengths, expected.audio_lengths)
    # The engine's frame stage is FP16: the operator rounds once per convolution, the module once per op
    torch.testing.assert_close(out.audio, expected.audio, rtol=0, atol=1e-3)
    for name in ("triton", "cuda"):
        with pytest.raises(ValueError, match="vocoder_kernels"):
            ServedEngineOptions(vocoder_kernels=name)
