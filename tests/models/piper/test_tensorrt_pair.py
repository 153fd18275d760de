"""Piper's synthesizer in TensorRT: the graph pair split at the durations builds with the real
builder (TensorRT-RTX runs on this CPU; a missing builder fails, not skips), speaks as the model
in onnxruntime, and its relative attention's gather equals the scatter-add it replaced.

    python -m pytest -q tests/models/piper/test_tensorrt_pair.py
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export.onnx_export import export_graph
from export.settings import TensorRTSettings
from export.tensorrt_engine import build_engine, import_backend
from models.interface import SynthesisRequest, VoiceCondition
from models.piper.onnx_contract import (
    DURATIONS_TO_AUDIO,
    TEXT_OUTPUT_NAMES,
    TEXT_TO_DURATIONS,
    frame_feeds,
    piper_feeds,
    tensorrt_graph_contracts,
)
from models.piper.vits import PiperVits, RelativeMultiHeadAttention, VitsHyperParams
from models.sampling import VitsSampling

SETTINGS = TensorRTSettings(axis_ranges={"batch_size": [1, 2, 4], "phonemes": [2, 32, 64], "frames": [2, 256, 1024]},
                            workspace_mib=256)


def smallest_piper(num_speakers: int) -> PiperVits:
    """Piper's architecture at its smallest (one layer or flow of each kind), so two dynamo
    exports and two builds take seconds; every op kind of the real voice's graph is there."""
    torch.manual_seed(0)
    hp = VitsHyperParams(
        num_symbols=12, hidden_channels=8, filter_channels=8, n_layers=1, latent_channels=4, flow_layers=1,
        flow_wn_layers=1, dp_filter_channels=8, dp_flows=2, upsample_initial_channel=8, upsample_rates=(2,),
        upsample_kernel_sizes=(4,), resblock_kernel_sizes=(3,), resblock_dilations=((1,),),
        num_speakers=num_speakers, speaker_channels=4 if num_speakers > 1 else 0,
    )
    return PiperVits(hp).eval()


# Two speakers add the speaker input to both graphs; a second export pair makes it slow.
@pytest.fixture(scope="module", params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["one_speaker", "two_speakers"])
def exported_pair(request, tmp_path_factory):
    vits = smallest_piper(request.param)
    contracts = tensorrt_graph_contracts(vits)
    folder = tmp_path_factory.mktemp(f"pair_{request.param}")
    return vits, contracts, {name: export_graph(contract, folder / f"{name}.onnx") for name, contract in contracts.items()}


def test_the_pair_in_onnxruntime_speaks_as_the_model(exported_pair):
    """Graph one, the host's cut of the prior noise, graph two: PiperVits.forward's audio and durations."""
    vits, contracts, graphs = exported_pair
    lengths = torch.tensor([9, 5])
    ids = torch.randint(1, vits.hp.num_symbols, (2, 9), generator=torch.Generator().manual_seed(3))
    ids = ids * (torch.arange(9) < lengths.unsqueeze(1))
    request = SynthesisRequest(phoneme_ids=ids, phoneme_lengths=lengths,
                               sampling=VitsSampling(noise_scale=0.667, length_scale=1.0, noise_scale_w=0.8, seed=5),
                               voice=VoiceCondition(speaker_id=torch.tensor([1, 0])) if vits.hp.num_speakers > 1
                               else None)
    sessions = {name: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                for name, path in graphs.items()}
    text_feeds = contracts[TEXT_TO_DURATIONS].feeds(request)
    text_outputs = dict(zip(TEXT_OUTPUT_NAMES, sessions[TEXT_TO_DURATIONS].run(None, text_feeds)))
    prior_noise = piper_feeds(request, vits.hp.latent_channels, vits.hp.num_speakers)["prior_noise"]
    (audio,) = sessions[DURATIONS_TO_AUDIO].run(None, frame_feeds(text_outputs, text_feeds, prior_noise))
    feeds = {name: torch.from_numpy(value) for name, value in piper_feeds(request, vits.hp.latent_channels,
                                                                           vits.hp.num_speakers).items()}
    with torch.no_grad():
        expected, audio_lengths, durations = vits(feeds["input"], feeds["input_lengths"], feeds["duration_noise"],
                                                  feeds["prior_noise"], *feeds["scales"], feeds.get("sid"))
    assert np.array_equal(text_outputs["durations"][:, 0], durations.numpy())
    assert audio.shape == (2, 1, 1, expected.shape[1])
    peak = float(expected.abs().max())
    assert float(np.abs(audio[:, 0, 0] - expected.numpy()).max()) <= 1e-4 * peak
    assert int(audio_lengths.max()) == audio.shape[-1]


def test_the_pair_builds_with_tensorrt(exported_pair, tmp_path):
    """TensorRT derives every shape of both graphs from input shapes: both build, fp32 throughout.
    (The one-graph synthesizer is refused at the frame Range: tests/export/test_tensorrt_engine.py.)"""
    backend, reason = import_backend()
    assert backend is not None, reason
    _, _, graphs = exported_pair
    for name, graph in graphs.items():
        result = build_engine(graph, tmp_path / f"{name}.plan", SETTINGS)
        assert result.status == "built", f"{name}: {result.reason}"
        assert result.plan_bytes == (tmp_path / f"{name}.plan").stat().st_size > 0
        assert result.precision_counts.get("fp32", 0) >= 5 and "fp16" not in result.precision_counts, \
            result.precision_counts
    assert result.profile["prior_noise"]["max"][2] == SETTINGS.axis_ranges["frames"][2]


@pytest.mark.parametrize("length", [1, 2, 4, 5, 13])
def test_relative_attention_gathers_what_the_scatter_add_summed(length):
    """The attention weight per relative offset, by gather, equals the scatter-add over keys it
    replaced (ScatterElements(reduction=add) in ONNX) bit for bit, shorter and longer than the window."""
    torch.manual_seed(length)
    attention = RelativeMultiHeadAttention(channels=8, n_heads=2, window_size=4)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_()
    batch, heads, window = 2, 2, 9
    weights = torch.softmax(torch.randn(batch, heads, length, length), dim=-1)  # (B, H, T, T)
    index, in_window = attention._relative_index(length, weights.device)
    scattered = torch.zeros(batch, heads, length, window).scatter_add_(
        3, index.expand(batch, heads, length, length), weights * in_window)
    key_index, in_sequence = attention._key_index(length, weights.device)
    gathered = torch.gather(weights, 3, key_index.expand(batch, heads, length, window)) * in_sequence
    assert torch.equal(gathered, scattered)
