"""Kokoro's synthesizer graph (models/kokoro/onnx_contract.py) on the tiny voice: it exports with
the dynamo exporter, holds none of the ops that block TensorRT (STFT/DFT, random draws, NonZero),
stays dynamic in batch, text and frames, and onnxruntime speaks as KokoroVoice.synthesize for a
padded batch, with the source noise on and off. One export (about a minute on two cores), shared.

The graph here is the "reference" variant: the model's own float64 AdaIN statistics, so onnxruntime
must give KokoroVoice.synthesize's audio to 1e-4 of peak on any batch. The family's default, the CPU
graph (float32 statistics), is checked against its own module in test_kokoro_cpu_graph.py and end
to end in tests/families/test_contract.py: on these tiny random weights with the noise off, float32
statistics of near-constant channels move its audio (and the "float32" graph's) by 2-3 % of peak
between onnxruntime and PyTorch; on the real voice both graphs stay 30-34 dB from the port
(docs/results/cpu_8_kokoro_cpu.json)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.onnx_export import export_graph
from models.graph_contract import SYNTHESIZER
from models.interface import SynthesisRequest
from models.kokoro.onnx_contract import INPUT_NAMES, OUTPUT_NAMES, graph_contracts
from models.kokoro.sampling import KokoroSampling
from models.kokoro.tiny import tiny_voice

pytestmark = pytest.mark.slow
BLOCKING_OPS = {"STFT", "DFT", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "NonZero"}
TEXT = "The quick brown fox jumps. Where did Kenji leave his lantern? Yes."


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.set_num_threads(1)
    voice = tiny_voice(0)
    contract = graph_contracts(voice, "reference")[SYNTHESIZER]
    path = export_graph(contract, tmp_path_factory.mktemp("kokoro") / "synthesizer.onnx")
    return voice, contract, path


def test_graph_has_no_blocking_op_and_its_lstms_whole(exported):
    _, contract, path = exported
    graph = onnx.load(str(path)).graph
    ops = Counter(node.op_type for node in graph.node)
    assert not BLOCKING_OPS & set(ops), sorted(BLOCKING_OPS & set(ops))
    assert ops["LSTM"] == 5  # duration encoder x2, duration head, text encoder, frame-level shared
    assert ops["Conv"] > 0 and ops["ConvTranspose"] > 0  # the (i)STFT as convolutions
    assert tuple(i.name for i in graph.input) == INPUT_NAMES == contract.input_names
    assert tuple(o.name for o in graph.output) == OUTPUT_NAMES


def test_onnxruntime_matches_the_module_on_the_example(exported):
    _, contract, path = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: tensor.numpy() for name, tensor in contract.example_inputs.items()})
    with torch.no_grad():
        expected = contract.module(*contract.example_inputs.values())
    audio, lengths, durations = (tensor.numpy() for tensor in expected)
    assert np.abs(got[0] - audio).max() <= 1e-4 * np.abs(audio).max()
    assert np.array_equal(got[1], lengths) and np.array_equal(got[2], durations)


@pytest.mark.parametrize("sampling", [KokoroSampling(seed=7), KokoroSampling.deterministic(length_scale=1.3)],
                         ids=["noise", "quiet-slow"])
def test_feeds_of_a_three_sentence_batch_give_the_voice_audio(exported, sampling):
    """Another batch size and text length than the export's example: the graph is dynamic."""
    voice, contract, path = exported
    utterances = voice.text_to_utterances(TEXT)
    request = SynthesisRequest.from_utterances(utterances, sampling=sampling)
    expected = voice.synthesize(request)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = dict(zip(contract.output_names, session.run(None, contract.feeds(request))))
    assert np.array_equal(outputs["audio_lengths"], expected.audio_lengths.numpy())
    assert np.array_equal(outputs["durations"], expected.durations[:, : outputs["durations"].shape[1]].numpy())
    for row, waveform in enumerate(expected.waveforms()):
        np.testing.assert_allclose(outputs["audio"][row, : waveform.numel()], waveform.numpy(), atol=1e-4)
        assert not outputs["audio"][row, waveform.numel():].any()
