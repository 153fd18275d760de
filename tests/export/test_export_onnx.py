"""export_graph on Piper's contract for a tiny random PiperVits: dynamic batch and lengths, sid, node
names; a decoder exported alone with either exporter.

    python -m pytest -q tests/export/test_export_onnx.py
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.graph_checks import check_graph
from export.onnx_export import export_decoder, export_graph
from models.graph_contract import SYNTHESIZER
from models.interface import SynthesisRequest, Utterance
from models.piper.onnx_contract import graph_contracts
from models.piper.vits import PiperVits
from models.piper.tiny import tiny_vits
from models.precision import PrecisionIsland
from models.sampling import VitsSampling


def export_piper(vits: PiperVits, path):
    return export_graph(graph_contracts(vits)[SYNTHESIZER], path)


def run_both(vits: PiperVits, session: ort.InferenceSession, batch: int, text_length: int):
    """(onnx audio (B, T), onnx durations (B, T_text), torch audio, torch durations) on fresh inputs."""
    generator = torch.Generator().manual_seed(batch * 100 + text_length)
    ids = torch.randint(1, vits.hp.num_symbols, (batch, text_length), generator=generator)
    lengths = torch.tensor([max(2, text_length - 3 * i) for i in range(batch)])
    feeds = {"input": ids, "input_lengths": lengths, "scales": torch.tensor([0.667, 1.0, 0.8]),
             "duration_noise": torch.randn(batch, 2, text_length, generator=generator),
             "prior_noise": torch.randn(batch, vits.hp.latent_channels, text_length * 16, generator=generator)}
    if vits.hp.num_speakers > 1:
        feeds["sid"] = torch.arange(batch) % vits.hp.num_speakers
    with torch.no_grad():
        audio, _, durations = vits(ids, lengths, feeds["duration_noise"], feeds["prior_noise"], 0.667, 1.0, 0.8,
                                   feeds.get("sid"))
    output, onnx_durations = session.run(None, {name: value.numpy() for name, value in feeds.items()})
    return output.reshape(batch, -1), onnx_durations.reshape(batch, -1), audio.numpy(), durations.numpy()


@pytest.fixture(scope="module")
def single_speaker(tmp_path_factory):
    vits = tiny_vits()
    return vits, export_piper(vits, tmp_path_factory.mktemp("export") / "tiny.onnx")


@pytest.mark.parametrize("num_speakers", [1, 2], ids=["single", "multi-speaker"])
def test_graph_traced_on_one_shape_runs_every_batch_and_length(single_speaker, tmp_path, num_speakers):
    if num_speakers == 1:
        vits, path = single_speaker
    else:
        vits = tiny_vits(num_speakers)
        path = export_piper(vits, tmp_path / "tiny_multi.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["input", "input_lengths", "scales", "duration_noise", "prior_noise"] + (["sid"] if num_speakers > 1 else [])
    # Traced at batch 2, lengths 24/17: run smaller, larger, batch 1 and batch 3.
    for batch, text_length in [(1, 5), (3, 40), (2, 11)]:
        audio, durations, reference, reference_durations = run_both(vits, session, batch, text_length)
        np.testing.assert_array_equal(durations, reference_durations)
        assert audio.shape == reference.shape
        assert np.abs(audio - reference).max() <= 1e-5 * np.abs(reference).max()


def test_graph_passes_checks_and_nodes_carry_module_names(single_speaker):
    _, path = single_speaker
    report = check_graph(path)
    assert report["checker"] == "ok" and report["opset"] == 18
    assert report["outputs"]["durations"] == ["batch_size", 1, "phonemes"]
    names = {node.name for node in onnx.load(str(path)).graph.node}
    assert {"/dec/conv_pre/Conv", "/dec/ups.1/ConvTranspose", "/dp/spline_flows.0/proj/Conv"} <= names
    assert not {"RandomNormal", "RandomNormalLike", "NonZero"} & set(report["op_histogram"])


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_decoder_alone_exports_with_dynamic_frames(tmp_path, dynamo):
    decoder = tiny_vits().dec
    path = export_decoder(decoder, tmp_path / "dec.onnx", latent_channels=8, dynamo=dynamo)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    z = torch.randn(3, 8, 50)  # traced on (2, 8, 32)
    with torch.no_grad():
        reference = decoder(z).numpy()
    (audio,) = session.run(None, {"z": z.numpy()})
    assert audio.shape == reference.shape == (3, 1, 400)
    assert np.abs(audio - reference).max() <= 1e-5 * np.abs(reference).max()


def test_precision_island_exports_under_the_fp32_node_names(tmp_path):
    """The island's inner ``module`` level is dropped, so an fp16 part keeps its fp32 part's node names."""
    decoder = PrecisionIsland(tiny_vits().dec, "float16")
    model = onnx.load(str(export_decoder(decoder, tmp_path / "dec_fp16.onnx", latent_channels=8)))
    conv_pre = next(node for node in model.graph.node if node.name == "/conv_pre/Conv")
    weight = next(t for t in model.graph.initializer if t.name == conv_pre.input[1])
    assert weight.data_type == onnx.TensorProto.FLOAT16


def test_multi_speaker_contract_feeds_the_example_speaker():
    contract = graph_contracts(tiny_vits(2))[SYNTHESIZER]
    request = SynthesisRequest.from_utterances([Utterance("a", (), (1, 5, 9, 3))], sampling=VitsSampling(seed=3),
                                               voice=contract.example_voice)
    feeds = contract.feeds(request)
    assert list(contract.input_names) == ["input", "input_lengths", "scales", "duration_noise", "prior_noise", "sid"]
    assert sorted(feeds) == sorted(contract.input_names) and feeds["sid"].tolist() == [0]
    assert feeds["prior_noise"].shape == (1, 8, 4 * 16)  # tiny latent: 8 channels; 16 frames per id
    with pytest.raises(ValueError, match="speaker_id"):
        contract.feeds(SynthesisRequest.from_utterances([Utterance("a", (), (1, 5))], sampling=VitsSampling()))
