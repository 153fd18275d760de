"""The real joe teacher exported from Piper's graph contract and run by PiperOnnxRuntimeVoice, against PyTorch.

One export (dynamo, opset 18, about 35 s on one thread), then a padded batch of two sentences of
different lengths with Piper's noise, which are not the lengths the graph was traced on. The
contract's feeds are the ones the original graph's runtime has always fed.

    python -m pytest -q tests/export/test_export_piper.py
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from export.graph_checks import op_histogram
from export.onnx_export import export_graph
from models.graph_contract import SYNTHESIZER
from models.piper.onnx_runtime import PiperOnnxRuntimeVoice
from export.tensorrt_support import readiness_report
from models.interface import SynthesisRequest
from models.registry import family_of
from models.sampling import VitsSampling
from models.piper.voice import PiperVoice

pytestmark = pytest.mark.slow  # loads the real voice

LINES = ["Could you leave the porch light on until midnight?", "Stop."]
MAX_DIFF_OF_PEAK = 2e-4  # fp32 export budget; measured 5e-5 (Intel Xeon), 1.07e-4 (AMD EPYC: other CPU kernels)
FORBIDDEN_OPS = ("RandomNormal", "RandomNormalLike", "NonZero", "DFT", "STFT")


@pytest.fixture(scope="module")
def teacher() -> PiperVoice:
    return PiperVoice.load("bundled:joe")


@pytest.fixture(scope="module")
def graph_path(teacher, tmp_path_factory):
    contract = family_of(teacher).graph_contracts(teacher)[SYNTHESIZER]
    return export_graph(contract, tmp_path_factory.mktemp("export") / "teacher.onnx")


def test_exported_teacher_matches_torch_on_a_padded_batch(teacher, graph_path):
    onnx_voice = PiperOnnxRuntimeVoice("bundled:joe", threads=1, graph_path=graph_path)
    assert onnx_voice.hop_length == teacher.model.hp.hop_length
    assert onnx_voice.latent_channels == teacher.model.hp.latent_channels
    sequences = [teacher.text_to_utterances(line)[0] for line in LINES]
    request = SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(seed=7))
    ours, reference = onnx_voice.synthesize(request), teacher.synthesize(request)

    assert torch.equal(ours.durations, reference.durations)
    assert torch.equal(ours.audio_lengths, reference.audio_lengths)
    for sequence, wave, reference_wave in zip(sequences, ours.waveforms(), reference.waveforms()):
        peak = reference_wave.abs().max()
        max_diff = (wave - reference_wave).abs().max()
        assert max_diff <= MAX_DIFF_OF_PEAK * peak, f"{sequence.text}: {max_diff / peak:.2e} of peak"


def test_exported_teacher_has_no_export_hostile_ops_and_is_tensorrt_ready(graph_path):
    model = onnx.load(str(graph_path))
    histogram = op_histogram(model)
    assert not set(FORBIDDEN_OPS) & set(histogram), histogram
    assert [i.name for i in model.graph.input] == ["input", "input_lengths", "scales", "duration_noise", "prior_noise"]
    assert [o.name for o in model.graph.output] == ["output", "durations"]
    report = readiness_report(model)
    assert report["ready"], report["blockers"]


def test_contract_feeds_are_what_the_original_graph_runtime_feeds(teacher, graph_path):
    """The feeds PiperOnnxRuntimeVoice built before the contract existed, written out by hand."""
    contract = family_of(teacher).graph_contracts(teacher)[SYNTHESIZER]
    original = PiperOnnxRuntimeVoice("bundled:joe", threads=1)
    sequences = [teacher.text_to_utterances(line)[0] for line in LINES]
    sampling = VitsSampling(noise_scale=0.5, length_scale=1.2, noise_scale_w=0.7, seed=11)
    request = SynthesisRequest.from_utterances(sequences, sampling=sampling)
    duration_noise, prior_noise = sampling.draw(2, request.phoneme_ids.shape[1], teacher.model.hp.latent_channels)
    expected = {"input": request.phoneme_ids.numpy(), "input_lengths": request.phoneme_lengths.numpy(),
                "scales": np.array([0.5, 1.2, 0.7], np.float32),
                "duration_noise": duration_noise.numpy(), "prior_noise": prior_noise.numpy()}
    for feeds in (contract.feeds(request), original.session_feeds(request)):
        assert sorted(feeds) == sorted(expected)
        for name, value in expected.items():
            assert feeds[name].dtype == value.dtype and np.array_equal(feeds[name], value), name
    exported_inputs = [i.name for i in onnx.load(str(graph_path)).graph.input]
    assert exported_inputs == list(contract.input_names) and sorted(exported_inputs) == sorted(expected)
