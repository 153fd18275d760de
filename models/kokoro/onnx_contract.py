"""Kokoro's ONNX graph contract: one end-to-end ``synthesizer`` graph over a padded batch.

Inputs: ``input_ids`` (B, T_text) int64 with each sentence's two 0 pads, right-padded with 0;
``input_lengths`` (B,) int64 ids per sentence, pads included; ``style`` (B, 2S) float32, each
sentence's row of the voice's style pack (KokoroVoice.style_rows), so one graph speaks every voice;
``speed`` (1,) float32 (1 / length_scale); the SineGen's random draws, ``source_phase`` (B, 9) and
``source_noise`` (B, L_noise, 9), already scaled by noise_scale (KokoroSampling.source_noise; zeros
turn the noise off, as the shipped int8 graph has it). Outputs: ``audio`` (B, T_audio) float32, zero
past ``audio_lengths`` (B,) int64, and ``durations`` (B, T_text) int64 frames per id (0 on padding)::

    contract = graph_contracts(FAMILIES["kokoro"].tiny_model(0))[SYNTHESIZER]
    export_graph(contract, "kokoro.onnx")              # export/onnx_export.py
    session.run(None, contract.feeds(request))         # the audio KokoroVoice.synthesize gives

Three variants of the same graph (``synthesizer_contract(voice, variant)``): ``"cpu"`` is
models/kokoro/cpu_graph.py's rewrite for onnxruntime on CPU (float32 statistics, AdaIN + Snake fused);
``"float32"`` takes the masked AdaIN statistics in float32, which TensorRT can build (it has no
float64); ``"reference"`` in float64, as the model does. Real weights, against the float64 path in
PyTorch: the decoder on the same inputs 102-113 dB waveform SNR; end to end 35-38 dB for "float32"
(the predictor's F0 moves by rounding and the phase integrates it; docs/results/cpu_8_kokoro_cpu.json);
the "cpu" graph's DNSMOS and speaker similarity equal the "reference" graph's.

The family exports ``"cpu"`` (DEFAULT_GRAPH_VARIANT): in onnxruntime on 2 threads it ran 1.06-1.07x
the shipped int8 graph's speed where the "reference" graph ran 0.83x, same sentences, same run
(docs/results/cpu_8_kokoro_cpu.json). The others stay a config option away (Family.graph_variants):
``python -m compress model=kokoro_ja export.graph_variant=reference`` (or ``float32``).

The frame count is data dependent: the model takes it with ``.item()``, an unbacked symbol under
torch.export, and its LSTMs become ONNX LSTM nodes with ``sequence_lens`` (models/kokoro/lstm.py),
so the graph needs the dynamo exporter. The graph holds no STFT/DFT (convolutions, models/kokoro/
stft.py), no random op and no NonZero (alignment from cumulative sums).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from models.graph_contract import SYNTHESIZER, GraphContract
from models.interface import SynthesisRequest
from models.kokoro.config import KokoroConfig
from models.kokoro.cpu_graph import cpu_model
from models.kokoro.decoder import HARMONICS, SourceNoise
from models.kokoro.layers import set_statistics_dtype
from models.kokoro.model import KokoroModel
from models.kokoro.sampling import KokoroSampling
from models.kokoro.voice import KokoroVoice

INPUT_NAMES = ("input_ids", "input_lengths", "style", "speed", "source_phase", "source_noise")
OUTPUT_NAMES = ("audio", "audio_lengths", "durations")
# Batch 2 with unequal lengths: torch.export specializes a dimension whose example size is 1.
EXAMPLE_TEXT_LENGTHS = (14, 9)
INPUT_AXES = {
    "input_ids": {0: "batch_size", 1: "phonemes"},
    "input_lengths": {0: "batch_size"},
    "style": {0: "batch_size"},
    "source_phase": {0: "batch_size"},
    "source_noise": {0: "batch_size", 1: "noise_samples"},
}
OUTPUT_AXES = {
    "audio": {0: "batch_size", 1: "samples"},
    "audio_lengths": {0: "batch_size"},
    "durations": {0: "batch_size", 1: "phonemes"},
}


class KokoroExportWrapper(nn.Module):
    """Tensor-only forward with the contract's inputs and outputs (module docstring)."""

    def __init__(self, model: KokoroModel):
        super().__init__()
        self.model = model
        self.samples_per_frame = model.config.samples_per_frame

    def forward(self, input_ids, input_lengths, style, speed, source_phase, source_noise):
        prediction = self.model.predict(input_ids, style, speed, lengths=input_lengths)
        audio = self.model.decode(prediction, style, SourceNoise(source_phase, source_noise))  # (B, T_audio)
        return audio, prediction["frame_lengths"] * self.samples_per_frame, prediction["frames_per_token"]


def kokoro_feeds(request: SynthesisRequest, voice: KokoroVoice) -> dict[str, np.ndarray]:
    """The graph inputs for ``request``: the styles and SineGen draws KokoroVoice.synthesize uses."""
    sampling = KokoroSampling.of(request.sampling)
    lengths = request.phoneme_lengths
    ids = request.phoneme_ids[:, : int(lengths.max())]
    if sampling.noise_scale == 0:
        noise = SourceNoise(torch.zeros(len(lengths), HARMONICS), torch.zeros(len(lengths), 1, HARMONICS))
    else:
        noise = sampling.source_noise(lengths, voice.hop_length)
    return {
        "input_ids": ids.numpy().astype(np.int64),
        "input_lengths": lengths.numpy().astype(np.int64),
        "style": voice.style_rows(lengths).numpy().astype(np.float32),
        "speed": np.array([1.0 / sampling.length_scale], np.float32),
        "source_phase": noise.initial_phase.numpy().astype(np.float32),
        "source_noise": noise.additive.numpy().astype(np.float32),
    }


def example_inputs(voice: KokoroVoice) -> dict[str, torch.Tensor]:
    """Deterministic tracing inputs by graph input name: batch 2, unequal lengths, noise on."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor(EXAMPLE_TEXT_LENGTHS, dtype=torch.long)
    vocabulary = voice.model.config.n_token
    ids = torch.randint(1, vocabulary, (len(lengths), int(lengths.max())), generator=generator)  # (B, T)
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    ids = ids * ((positions > 0) & (positions < lengths.unsqueeze(1) - 1))  # the 0 pads and the padding
    request = SynthesisRequest(phoneme_ids=ids, phoneme_lengths=lengths, sampling=KokoroSampling(seed=0))
    return {name: torch.from_numpy(array) for name, array in kokoro_feeds(request, voice).items()}


GRAPH_VARIANTS = ("cpu", "float32", "reference")  # the family's default first
DEFAULT_GRAPH_VARIANT = GRAPH_VARIANTS[0]


def graph_model(model: KokoroModel, variant: str) -> KokoroModel:
    """A CPU copy of ``model`` in the graph ``variant`` (module docstring)."""
    if variant not in GRAPH_VARIANTS:
        raise ValueError(f"Kokoro graph variant {variant!r}: use one of {list(GRAPH_VARIANTS)}")
    on_cpu = next(model.parameters()).device.type == "cpu"
    if variant == "reference":
        return model if on_cpu else copy.deepcopy(model).cpu()
    if variant == "float32":
        return set_statistics_dtype(copy.deepcopy(model).cpu(), torch.float32)
    return cpu_model(model if on_cpu else copy.deepcopy(model).cpu())  # cpu_model copies


def synthesizer_contract(voice: KokoroVoice, variant: str = DEFAULT_GRAPH_VARIANT) -> GraphContract:
    """The end-to-end graph of a KokoroVoice, traced on a CPU copy of its model in ``variant``."""
    model = graph_model(voice.model, variant)
    cpu_voice = KokoroVoice(model, voice.frontend, voice.style_pack, voice.voice_name)
    return GraphContract(
        module=KokoroExportWrapper(model).eval(),
        example_inputs=example_inputs(cpu_voice),
        output_names=OUTPUT_NAMES,
        input_axes=INPUT_AXES,
        output_axes=OUTPUT_AXES,
        feeds=lambda request: kokoro_feeds(request, cpu_voice),
        audio_output="audio",
        durations_output="durations",
        rewrites=("AdaIN as masked normalisation over time", "STFT/iSTFT as convolutions",
                  "random sources as inputs", "LSTMs as ONNX LSTM with sequence_lens",
                  *(("AdaIN statistics in float32",) if variant != "reference" else ()),
                  *(("generator AdaIN + Snake as one affine, sin and a scale",) if variant == "cpu" else ())),
    )


def tensorrt_axis_ranges(config: KokoroConfig, sampling: KokoroSampling | None = None) -> dict[str, list[int]]:
    """[min, opt, max] of the synthesizer's text and noise axes for a TensorRT profile
    (engine.tensorrt.axis_ranges): ids per sentence up to ALBERT's positions (pads included), and
    the SineGen noise ``sampling`` draws for that many ids (KokoroSampling.noise_samples)."""
    sampling = sampling or KokoroSampling()
    ids = [3, 64, config.plbert.max_position_embeddings]  # 3: one phoneme between its two pads
    return {"phonemes": ids, "noise_samples": [sampling.noise_samples(n, config.samples_per_frame) for n in ids]}


def graph_contracts(voice: KokoroVoice, variant: str = DEFAULT_GRAPH_VARIANT) -> dict[str, GraphContract]:
    """Kokoro exports one graph, the synthesizer, in graph ``variant`` (one of GRAPH_VARIANTS)."""
    if not isinstance(voice, KokoroVoice):
        raise TypeError(f"a Kokoro graph contract needs a KokoroVoice, got {type(voice).__name__}")
    return {SYNTHESIZER: synthesizer_contract(voice, variant)}
