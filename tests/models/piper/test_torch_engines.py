"""models/piper/engines.py: the bucketed engine computes what the model's own forward computes.

CUDA graphs need a GPU (evaluate/gpu_engines.py measures them on the H200); here the same
stages run without graphs, with per-request scales and batch padding, and as AOTInductor packages.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from models.piper.engines import BucketedEngine, EagerEngine, EngineVoice, StageBackend, text_bucket
from models.interface import SynthesisRequest, Utterance
from models.sampling import VitsSampling
from models.piper.vits import PiperVits, VitsHyperParams
from models.piper.voice import PiperVoice
from serve.settings import ServeConfigError, ServeSettings

pytestmark = pytest.mark.slow  # loads the real voice

SENTENCES = ("The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
             "It's easy to tell the depth of a well.")


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return PiperVoice.load("bundled:joe")


@pytest.fixture(scope="module")
def sequences(voice) -> list[Utterance]:
    return [voice.text_to_utterances(text)[0] for text in SENTENCES]


def _max_error(reference, candidate) -> float:
    errors = []
    for row in range(reference.audio.shape[0]):
        n = int(reference.audio_lengths[row])
        errors.append(float((reference.audio[row, :n] - candidate.audio[row, :n]).abs().max()))
    return max(errors)


def test_bucketed_engine_matches_eager_forward(voice, sequences):
    eager = EagerEngine(voice.model, voice.sample_rate_hz)
    bucketed = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False)
    for seed, sequence in enumerate(sequences):
        request = SynthesisRequest.from_utterances([sequence], sampling=VitsSampling(seed=seed))
        reference, candidate = eager.synthesize(request), bucketed.synthesize(request)
        assert torch.equal(reference.durations, candidate.durations)
        assert torch.equal(reference.audio_lengths, candidate.audio_lengths)
        # Only the decoder's receptive field past the last real frame differs (bucket padding).
        assert _max_error(reference, candidate) < 2e-3


def test_scales_are_per_request_inputs(voice, sequences):
    eager = EagerEngine(voice.model, voice.sample_rate_hz)
    bucketed = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False)
    slow = VitsSampling(length_scale=1.5, noise_scale=0.3, noise_scale_w=0.5, seed=3)
    request = SynthesisRequest.from_utterances(sequences[:1], sampling=slow)
    reference, candidate = eager.synthesize(request), bucketed.synthesize(request)
    assert torch.equal(reference.durations, candidate.durations)
    assert _max_error(reference, candidate) < 2e-3
    default = bucketed.synthesize(SynthesisRequest.from_utterances(sequences[:1], sampling=VitsSampling(seed=3)))
    assert int(candidate.audio_lengths[0]) > 1.3 * int(default.audio_lengths[0])


def test_batch_buckets_pad_rows_without_changing_outputs(voice, sequences):
    exact = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False)
    padded = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False, batch_buckets=(1, 4))
    request = SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(seed=7))  # 3 rows -> bucket 4
    reference, candidate = exact.synthesize(request), padded.synthesize(request)
    assert candidate.audio.shape[0] == 3
    assert torch.equal(reference.durations, candidate.durations)
    assert _max_error(reference, candidate) < 1e-4
    too_many = SynthesisRequest.from_utterances(sequences * 2, sampling=VitsSampling(seed=7))
    with pytest.raises(ValueError, match="largest batch bucket 4"):
        padded.synthesize(too_many)


def test_concurrent_callers_get_what_sequential_calls_get(voice, sequences):
    """Two threads share one engine (serve.batches_in_flight=2): preparation overlaps, the device
    section (static buffers, graph replays) does not, and no call sees another's rows."""
    engine = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False, batch_buckets=(1, 2, 4))
    requests = [SynthesisRequest.from_utterances(sequences[i:i + 2], sampling=VitsSampling(seed=i)) for i in range(2)]
    sequential = [engine.synthesize(request) for request in requests]
    with ThreadPoolExecutor(2) as pool:
        concurrent = list(pool.map(engine.synthesize, requests * 2))
    for index, result in enumerate(concurrent):
        reference = sequential[index % 2]
        assert torch.equal(reference.durations, result.durations)
        assert torch.equal(reference.audio, result.audio)


def test_engine_voice_serves_the_voice_frontend(voice, sequences):
    served = EngineVoice(voice, BucketedEngine(voice.model, voice.sample_rate_hz, graphs=False))
    assert served.text_to_utterances(SENTENCES[0])[0].phoneme_ids == sequences[0].phoneme_ids
    result = served.synthesize(SynthesisRequest.from_utterances(sequences[:1], sampling=VitsSampling(seed=0)))
    assert result.sample_rate_hz == voice.sample_rate_hz == 22050
    assert result.audio.abs().max() > 0.05  # speech, not silence


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="largest text bucket"):
        text_bucket(10_000)
    with pytest.raises(ValueError, match="unknown stage backend 'tensorrt'"):
        StageBackend("tensorrt")
    with pytest.raises(ValueError, match="package_dir"):
        StageBackend("aoti")
    with pytest.raises(ServeConfigError, match="cuda_graphs needs serve.device=cuda"):
        ServeSettings(source="teacher", torch_engine="cuda_graphs", device="cpu")
    with pytest.raises(ServeConfigError, match="torch_engine"):
        ServeSettings(source="teacher", torch_engine="tensorrt")


def _small_vits() -> PiperVits:
    """A randomly initialised VITS a few layers deep: the engines' mechanics, in seconds."""
    torch.manual_seed(0)
    hp = VitsHyperParams(num_symbols=30, hidden_channels=16, filter_channels=32, n_layers=1, latent_channels=8,
                         flow_layers=1, flow_wn_layers=1, dp_filter_channels=16, upsample_initial_channel=16,
                         upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4), resblock_kernel_sizes=(3,),
                         resblock_dilations=((1, 2),))
    return PiperVits(hp).eval()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU: run `pytest -m gpu` on a CUDA machine")
def test_graph_replays_match_uncaptured_runs_across_later_captures():
    """Every captured graph allocates from one shared pool. Replays of a graph captured early, after
    other shapes were captured, still return what the uncaptured stages return: no capture reuses
    memory another graph's outputs live in."""
    model = _small_vits().cuda()
    hp = model.hp
    plain = BucketedEngine(model, 22050, graphs=False, batch_buckets=(1, 2, 4))
    graphed = BucketedEngine(model, 22050, graphs=True, batch_buckets=(1, 2, 4))
    # (batch, phonemes, pace): new shapes between repeats of earlier ones.
    shapes = [(1, 20, 1.0), (3, 70, 1.5), (1, 20, 1.0), (2, 120, 0.8), (3, 70, 1.5), (1, 20, 1.0), (2, 120, 0.8)]
    for index, (batch, length, pace) in enumerate(shapes):
        generator = torch.Generator().manual_seed(index)  # each repeat a different request of the same shape
        ids = torch.randint(1, hp.num_symbols, (batch, length), generator=generator)
        request = SynthesisRequest(ids, torch.full((batch,), length), sampling=VitsSampling(length_scale=pace, seed=index))
        reference, candidate = plain.synthesize(request), graphed.synthesize(request)
        assert torch.equal(reference.durations, candidate.durations), (index, batch, length, pace)
        assert torch.equal(reference.audio_lengths, candidate.audio_lengths)
        assert torch.allclose(reference.audio, candidate.audio, atol=1e-4), (index, batch, length, pace)
    assert len({key for key in graphed.captured if key[0] == "text"}) == 3


def test_aoti_packages_compute_the_eager_stages(tmp_path):
    """AOTInductor export + compile of a small VITS (dynamic batch, text and frame axes) on the CPU."""
    model = _small_vits()
    hp = model.hp
    eager = BucketedEngine(model, 22050, graphs=False)
    compiled = BucketedEngine(model, 22050, graphs=False, backend=StageBackend("aoti", package_dir=str(tmp_path)))
    assert sorted(path.name for path in tmp_path.glob("*.pt2")) == ["acoustic_stage.pt2", "text_stage.pt2"]
    assert compiled.compile_s > 0
    generator = torch.Generator().manual_seed(1)
    for batch, length in ((1, 20), (3, 70)):  # two text buckets and two batch sizes: the axes are dynamic
        ids = torch.randint(1, hp.num_symbols, (batch, length), generator=generator)
        request = SynthesisRequest(ids, torch.full((batch,), length), sampling=VitsSampling(seed=batch))
        reference, candidate = eager.synthesize(request), compiled.synthesize(request)
        assert torch.equal(reference.durations, candidate.durations)
        assert torch.allclose(reference.audio, candidate.audio, atol=1e-4)
