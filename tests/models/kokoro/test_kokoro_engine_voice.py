"""The Kokoro voice on its bucketed engine (models/kokoro/engine_voice.py), as the server runs it:
sentences of different lengths in one batch, with and without SineGen noise, give what the voice
itself gives, row for row. Eager buckets on the CPU; the last test replays CUDA graphs (``gpu``),
and test_kokoro_engines.py checks the stages' replay alone."""
from __future__ import annotations

import pytest
import torch

from models.interface import SynthesisRequest, TTSModel, Utterance
from models.kokoro.engine_voice import EngineVoice, bucketed_engine
from models.kokoro.engines import TOKEN_BUCKET, BucketedEngine, Float32Island
from models.kokoro.family import FAMILY
from models.kokoro.layers import AdaIN1d
from models.kokoro.sampling import KokoroSampling
from models.kokoro.tiny import tiny_voice

TEXT = "The quick brown fox jumps. Where did Kenji leave his lantern? Yes."
# Relative waveform error of the FP16 frame stage on the tiny voice: measured 0.0050-0.0055 on this
# text (BF16: 0.37-0.45, so the bound also tells the two apart).
HALF_FRAME_STAGE_MAX_ERROR = 0.02


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


@pytest.mark.parametrize("sampling", [KokoroSampling(seed=5), KokoroSampling.deterministic(),
                                      KokoroSampling(seed=2, length_scale=1.5)], ids=["noise", "quiet", "slower"])
@pytest.mark.parametrize("batch_buckets", [None, (4,)], ids=["exact-batch", "padded-batch"])
def test_engine_voice_speaks_as_the_voice(voice, sampling, batch_buckets):
    utterances = voice.text_to_utterances(TEXT)
    lengths = {len(u.phoneme_ids) for u in utterances}
    assert len(utterances) == 3 and len(lengths) == 3  # three lengths: three text-stage shapes, one frame stage
    request = SynthesisRequest.from_utterances(utterances, sampling=sampling)
    engine = BucketedEngine(voice.model, graphs=False, frame_bucket=16)
    expected, out = voice.synthesize(request), EngineVoice(voice, engine, batch_buckets).synthesize(request)
    assert torch.equal(out.audio_lengths, expected.audio_lengths)
    assert torch.equal(out.durations, expected.durations)  # zeros past each sentence, as the voice's
    for row, samples in enumerate(out.audio_lengths.tolist()):
        torch.testing.assert_close(out.audio[row, :samples], expected.audio[row, :samples], atol=2e-5, rtol=1e-4)
    # One frame-stage shape for the whole batch, its token axis padded to the bucket.
    assert list(engine.frame_stages) == [-(-int(out.audio_lengths.max()) // voice.hop_length // 16) * 16]


def test_rows_must_match_their_styles_and_fit_the_batch_buckets(voice):
    engine = BucketedEngine(voice.model, graphs=False)
    row = torch.tensor(voice.text_to_utterances("Yes.")[0].phoneme_ids)
    style = voice.style_rows(torch.tensor([len(row)]))
    with pytest.raises(ValueError, match="one style per row"):
        engine.synthesize_rows([row, row], style)
    with pytest.raises(ValueError, match="largest batch bucket 1"):
        engine.synthesize_rows([row, row], torch.cat([style, style]), batch_buckets=(1,))


def test_the_family_hook_builds_it_and_refuses_what_it_cannot_run(voice):
    served, replays_graphs, text_buckets = FAMILY.torch_engine(voice, "eager", False, None, (1, 4))
    assert isinstance(served, TTSModel) and isinstance(served, EngineVoice)
    assert replays_graphs is False and served.batch_buckets == (1, 4)
    assert text_buckets[0] == TOKEN_BUCKET and all(b % TOKEN_BUCKET == 0 for b in text_buckets)
    assert served.sample_rate_hz == voice.sample_rate_hz and served.hop_length == voice.hop_length
    for backend in ("compile", "aoti"):
        with pytest.raises(ValueError, match="each a compile under load"):
            bucketed_engine(voice, backend, False, None, ())
    with pytest.raises(ValueError, match="fixed when the engine is built"):
        served.replace_part("decoder", voice.model.decoder)


def test_the_hook_builds_a_half_frame_stage_and_keeps_the_text_stage_and_voice_float32(voice):
    """The server's fp16 source on this engine (Family.engine_precision): the frame stage in float16
    but its float32 islands, the text stage and the voice's own model in float32, so durations and
    lengths are the voice's."""
    served, _, _ = FAMILY.torch_engine(voice, "eager", False, None, None, precision=torch.float16)
    engine = served.engine
    island = engine.frame_model.decoder.generator.conv_post
    assert isinstance(island, Float32Island) and {p.dtype for p in island.parameters()} == {torch.float32}
    half = {name for name, p in engine.frame_model.decoder.named_parameters() if p.dtype == torch.float16}
    assert half and any("resblocks" in name for name in half)
    assert {p.dtype for p in voice.model.parameters()} == {torch.float32}  # the voice is not converted
    norms = [m for m in engine.frame_model.modules() if isinstance(m, AdaIN1d)]
    assert norms and {m.statistics_dtype for m in norms} == {torch.float32}  # half precision: float32 statistics
    request = SynthesisRequest.from_utterances(voice.text_to_utterances(TEXT), sampling=KokoroSampling.deterministic())
    expected, out = voice.synthesize(request), served.synthesize(request)
    assert torch.equal(out.audio_lengths, expected.audio_lengths) and torch.equal(out.durations, expected.durations)
    assert out.audio.dtype == torch.float32 and torch.isfinite(out.audio).all()
    for row, samples in enumerate(out.audio_lengths.tolist()):  # half precision: close, not equal
        error = out.audio[row, :samples] - expected.audio[row, :samples]
        assert error.norm() <= HALF_FRAME_STAGE_MAX_ERROR * expected.audio[row, :samples].norm()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_of_mixed_lengths_equals_the_voice():
    """Two sentences of one length replay that length's text-stage graph twice in a batch: each
    row is copied out of the graph's buffers before the next replay overwrites them."""
    voice = tiny_voice(0).cuda()
    # Ids without the front end (the GPU machine has no espeak-ng): lengths 31, 37, 7, 7 with the 0 pads.
    rng = torch.Generator().manual_seed(0)
    utterances = []
    for length in (31, 37, 7, 7):
        ids = (0, *torch.randint(1, voice.model.config.n_token, (length - 2,), generator=rng).tolist(), 0)
        utterances.append(Utterance(text="", phonemes=("?",) * length, phoneme_ids=ids))
    served, replays_graphs, _ = bucketed_engine(voice, "eager", True, None, (4, 8))
    assert replays_graphs
    for sampling in (KokoroSampling(seed=3), KokoroSampling.deterministic()):
        request = SynthesisRequest.from_utterances(utterances, sampling=sampling)
        expected = voice.synthesize(request)
        for _ in range(2):  # capture, then replay
            out = served.synthesize(request)
            assert torch.equal(out.audio_lengths, expected.audio_lengths)
            for row, samples in enumerate(out.audio_lengths.tolist()):
                torch.testing.assert_close(out.audio[row, :samples], expected.audio[row, :samples],
                                           atol=1e-4, rtol=1e-3)
