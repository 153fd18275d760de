"""Piper's ONNX graph contract: the one place its graph inputs are named and fed.

The graph takes Piper's inputs, ``input`` (B, T_text) int64, ``input_lengths`` (B,) int64,
``scales`` (3,) float32 = [noise_scale, length_scale, noise_scale_w] and ``sid`` (B,) int64 for
multi-speaker voices, plus the explicit standard-normal noise ``duration_noise`` (B, 2, T_text)
and ``prior_noise`` (B, C_lat, T_frames_max). Outputs: ``output`` (B, 1, 1, T_audio) like Piper's
graphs, and ``durations`` (B, 1, T_text) float32 frames per phoneme, the output of the graph's one
``Ceil``, as ``models.piper.onnx_runtime.prepare_graph`` exposes it for the original voice. So
``PiperOnnxRuntimeVoice(voice, graph_path=...)`` runs an exported graph unchanged, and
``piper_feeds`` feeds the original graph, an exported one, parity and simplify alike::

    contracts = graph_contracts(PiperVoice.load("bundled:joe"))   # {"synthesizer": GraphContract}
    export_graph(contracts["synthesizer"], "teacher.onnx")          # export/onnx_export.py

The frame count is data dependent; PiperVits states it as an unbacked symbol (models/piper/vits.py),
which keeps T_frames dynamic under the dynamo exporter. The TorchScript exporter would freeze it
to the example's value, so this contract asks for dynamo.

TensorRT takes no shape computed from values, so for it the synthesizer is also stated as a pair
of graphs split at the durations (models/piper/rewrites/duration_split.py), fed in turn::

    pair = tensorrt_graph_contracts(voice)    # {"text_to_durations": ..., "durations_to_audio": ...}
    text_feeds = pair[TEXT_TO_DURATIONS].feeds(request)
    first = dict(zip(TEXT_OUTPUT_NAMES, text_session.run(None, text_feeds)))
    prior_noise = piper_feeds(request, latent_channels, num_speakers)["prior_noise"]
    (audio,) = audio_session.run(None, frame_feeds(first, text_feeds, prior_noise))
"""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import onnx
import torch
from torch import nn

from models.graph_contract import REWRITTEN_CONV_TRANSPOSE_STRIDES, SYNTHESIZER, GraphContract
from models.interface import SynthesisRequest, VoiceCondition
from models.sampling import VitsSampling
from models.piper.rewrites.duration_split import DurationsToAudio, TextToDurations
from models.piper.vits import PiperVits

INPUT_NAMES = ("input", "input_lengths", "scales", "duration_noise", "prior_noise")  # then "sid" if multi-speaker
OUTPUT_NAMES = ("output", "durations")
# Example shapes for tracing; the graph is dynamic in all of them. Batch 2 with unequal lengths:
# torch.export specializes a dimension whose example size is 1.
EXAMPLE_TEXT_LENGTHS = (24, 17)
EXAMPLE_FRAMES_PER_ID = 16  # VitsSampling.max_frames_per_phoneme_id
EXAMPLE_SCALES = (0.667, 1.0, 0.8)  # Piper's default noise_scale, length_scale, noise_scale_w
INPUT_AXES = {
    "input": {0: "batch_size", 1: "phonemes"},
    "input_lengths": {0: "batch_size"},
    "duration_noise": {0: "batch_size", 2: "phonemes"},
    "prior_noise": {0: "batch_size", 2: "frames"},
    "sid": {0: "batch_size"},
}


def vits_of(voice_or_vits) -> PiperVits:
    """The PiperVits inside a PiperVoice (``.model``), or the PiperVits itself."""
    vits = getattr(voice_or_vits, "model", voice_or_vits)
    if not isinstance(vits, PiperVits):
        raise TypeError(f"a Piper graph contract needs a PiperVoice or PiperVits, got {type(voice_or_vits).__name__}")
    return vits


class PiperExportWrapper(nn.Module):
    """Tensor-only forward with Piper's graph contract (module docstring)."""

    def __init__(self, vits: PiperVits):
        super().__init__()
        self.vits = vits

    def forward(self, input, input_lengths, scales, duration_noise, prior_noise, sid=None):  # noqa: A002 (Piper's name)
        audio, _, durations = self.vits(input, input_lengths, duration_noise, prior_noise,
                                        scales[0], scales[1], scales[2], sid)
        return audio.unsqueeze(1).unsqueeze(1), durations  # (B, 1, 1, T_audio), (B, T_text)


def example_inputs(vits: PiperVits, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Deterministic tracing inputs by graph input name: batch 2, unequal text lengths."""
    hp = vits.hp
    generator = torch.Generator().manual_seed(0)
    batch, text_length = len(EXAMPLE_TEXT_LENGTHS), max(EXAMPLE_TEXT_LENGTHS)
    ids = torch.randint(1, hp.num_symbols, (batch, text_length), generator=generator)  # (B, T_text)
    lengths = torch.tensor(EXAMPLE_TEXT_LENGTHS, dtype=torch.long)
    ids = ids * (torch.arange(text_length) < lengths.unsqueeze(1))
    inputs = {
        "input": ids,
        "input_lengths": lengths,
        "scales": torch.tensor(EXAMPLE_SCALES),
        "duration_noise": torch.randn(batch, 2, text_length, generator=generator),
        "prior_noise": torch.randn(batch, hp.latent_channels, text_length * EXAMPLE_FRAMES_PER_ID, generator=generator),
    }
    if hp.num_speakers > 1:
        inputs["sid"] = torch.arange(batch) % hp.num_speakers
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def piper_feeds(request: SynthesisRequest, latent_channels: int, num_speakers: int) -> dict[str, np.ndarray]:
    """The graph inputs for ``request`` by input name; the noise is ``request.sampling.draw``'s, the
    same a PyTorch PiperVoice draws for that request."""
    noise = VitsSampling.of(request.sampling)
    duration_noise, prior_noise = noise.draw(request.phoneme_ids.shape[0], request.phoneme_ids.shape[1],
                                             latent_channels)
    feeds = {
        "duration_noise": duration_noise.numpy(),
        "prior_noise": prior_noise.numpy(),
        "input": request.phoneme_ids.numpy().astype(np.int64),
        "input_lengths": request.phoneme_lengths.numpy().astype(np.int64),
        "scales": np.array([noise.noise_scale, noise.length_scale, noise.noise_scale_w], np.float32),
    }
    if num_speakers > 1:
        if request.voice is None or request.voice.speaker_id is None:
            raise ValueError("this multi-speaker voice needs speaker_id on the request")
        feeds["sid"] = request.voice.speaker_id.numpy().astype(np.int64)
    return feeds


def duration_ceil(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The graph's one ``Ceil`` (frames per phoneme, (B, 1, T_text) float), or None if not exactly one."""
    ceil_nodes = [node for node in model.graph.node if node.op_type == "Ceil"]
    return ceil_nodes[0] if len(ceil_nodes) == 1 else None


def convtranspose_hop(model: onnx.ModelProto) -> int:
    """Samples per frame as PiperOnnxRuntimeVoice reads it: the product of the ConvTranspose strides,
    those a rewrite replaced included (recorded in the graph's metadata)."""
    rewritten = next((json.loads(prop.value) for prop in model.metadata_props
                      if prop.key == REWRITTEN_CONV_TRANSPOSE_STRIDES), {})
    return int(math.prod(
        onnx.helper.get_attribute_value(attr)[0]
        for node in model.graph.node if node.op_type == "ConvTranspose"
        for attr in node.attribute if attr.name == "strides"
    ) * math.prod(rewritten.values()))


def expose_ceil_as_durations(model: onnx.ModelProto) -> None:
    """Make the one ``Ceil`` (frames per phoneme, (B, 1, T_text) float) the ``durations`` output.

    The wrapper's own int64 durations output is renamed out of the way and left for the exporter's
    dead-node removal.
    """
    ceil = duration_ceil(model)
    if ceil is None:
        found = sum(node.op_type == "Ceil" for node in model.graph.node)
        raise ValueError(f"expected exactly one Ceil node (the duration rounding), found {found}")
    ceil_output = ceil.output[0]
    unused = "durations_int64"
    for node in model.graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == "durations":
                    names[i] = unused
                elif name == ceil_output:
                    names[i] = "durations"
    outputs = [output for output in model.graph.output if output.name != "durations"]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("durations", onnx.TensorProto.FLOAT, ["batch_size", 1, "phonemes"])
    )


def _samples_per_frame(wrapper: PiperExportWrapper, inputs: dict[str, torch.Tensor]) -> int:
    with torch.no_grad():
        audio, durations = wrapper(*inputs.values())  # (B, 1, 1, T_audio), (B, T_text)
    frames = int(durations.sum(dim=1).clamp_min(1).max())
    return audio.shape[-1] // frames


def _postprocess(wrapper: PiperExportWrapper, inputs: dict[str, torch.Tensor]):
    def postprocess(model: onnx.ModelProto) -> None:
        """Durations from the Ceil; a decoder whose strides give another hop than it makes is refused."""
        expose_ceil_as_durations(model)
        hop_samples = _samples_per_frame(wrapper, inputs)
        if convtranspose_hop(model) != hop_samples:
            raise ValueError(
                f"the decoder makes {hop_samples} samples per frame but its ConvTranspose strides multiply to "
                f"{convtranspose_hop(model)}: PiperOnnxRuntimeVoice reads the hop from those strides"
            )
    return postprocess


def synthesizer_contract(voice_or_vits) -> GraphContract:
    """The end-to-end graph of a PiperVoice or PiperVits (any parts), traced on a CPU copy if it
    lives elsewhere; the model itself is not modified."""
    vits = vits_of(voice_or_vits)
    if next(vits.parameters()).device.type != "cpu":
        vits = copy.deepcopy(vits).cpu()
    wrapper = PiperExportWrapper(vits).eval()
    inputs = example_inputs(vits)
    latent_channels, num_speakers = vits.hp.latent_channels, vits.hp.num_speakers
    return GraphContract(
        module=wrapper,
        example_inputs=inputs,
        output_names=OUTPUT_NAMES,
        input_axes={name: axes for name, axes in INPUT_AXES.items() if name in inputs},
        feeds=lambda request: piper_feeds(request, latent_channels, num_speakers),
        audio_output="output",
        durations_output="durations",
        example_voice=VoiceCondition(speaker_id=torch.zeros(1, dtype=torch.long)) if num_speakers > 1 else None,
        postprocess=_postprocess(wrapper, inputs),
    )


def graph_contracts(voice_or_vits) -> dict[str, GraphContract]:
    """Piper exports one graph, the synthesizer."""
    return {SYNTHESIZER: synthesizer_contract(voice_or_vits)}


# ---------------------------------------------------------------- the pair TensorRT builds

TEXT_TO_DURATIONS, DURATIONS_TO_AUDIO = "text_to_durations", "durations_to_audio"
TEXT_OUTPUT_NAMES = ("durations", "prior_mean", "prior_log_std")
PRIOR_AXES = {0: "batch_size", 2: "phonemes"}


def frame_feeds(text_outputs: dict[str, np.ndarray], text_feeds: dict[str, np.ndarray],
                prior_noise: np.ndarray) -> dict[str, np.ndarray]:
    """``durations_to_audio``'s inputs from ``text_to_durations``' outputs and inputs (by name): the
    host's one step between the graphs is cutting ``prior_noise`` to the batch's frame count, the
    largest duration sum (at least one frame, as PiperVits)."""
    frames = max(1, int(text_outputs["durations"].sum(axis=-1).max()))
    if prior_noise.shape[-1] < frames:
        raise ValueError(f"prior_noise covers {prior_noise.shape[-1]} frames but the utterance needs {frames}: "
                         "raise VitsSampling.max_frames_per_phoneme_id")
    feeds = {name: text_outputs[name] for name in TEXT_OUTPUT_NAMES}
    feeds.update(prior_noise=np.ascontiguousarray(prior_noise[:, :, :frames]), scales=text_feeds["scales"])
    if "sid" in text_feeds:
        feeds["sid"] = text_feeds["sid"]
    return feeds


def tensorrt_graph_contracts(voice_or_vits) -> dict[str, GraphContract]:
    """The synthesizer as two graphs split at the durations (module docstring), each of whose shapes
    TensorRT derives from input shapes. ``text_to_durations`` is fed from a request (without the
    prior noise); ``durations_to_audio`` from ``frame_feeds``. Not among ``graph_contracts``: the
    onnxruntime path and the pipeline keep the one synthesizer graph."""
    vits = vits_of(voice_or_vits)
    if next(vits.parameters()).device.type != "cpu":
        vits = copy.deepcopy(vits).cpu()
    text_module, audio_module = TextToDurations(vits).eval(), DurationsToAudio(vits).eval()
    synthesizer_inputs = example_inputs(vits)
    prior_noise = synthesizer_inputs.pop("prior_noise")
    with torch.no_grad():
        text_outputs = dict(zip(TEXT_OUTPUT_NAMES, text_module(*synthesizer_inputs.values())))
    audio_feeds = frame_feeds({name: tensor.numpy() for name, tensor in text_outputs.items()},
                              {name: tensor.numpy() for name, tensor in synthesizer_inputs.items()},
                              prior_noise.numpy())
    audio_inputs = {name: torch.from_numpy(array) for name, array in audio_feeds.items()}
    latent_channels, num_speakers = vits.hp.latent_channels, vits.hp.num_speakers

    def text_feeds(request: SynthesisRequest) -> dict[str, np.ndarray]:
        feeds = piper_feeds(request, latent_channels, num_speakers)
        del feeds["prior_noise"]  # the second graph's, cut to the frame count by frame_feeds
        return feeds

    example_voice = VoiceCondition(speaker_id=torch.zeros(1, dtype=torch.long)) if num_speakers > 1 else None
    text_axes = {name: axes for name, axes in INPUT_AXES.items() if name in synthesizer_inputs}
    audio_axes = {"durations": PRIOR_AXES, "prior_mean": PRIOR_AXES, "prior_log_std": PRIOR_AXES,
                  "prior_noise": INPUT_AXES["prior_noise"], "sid": INPUT_AXES["sid"]}
    return {
        TEXT_TO_DURATIONS: GraphContract(
            module=text_module, example_inputs=synthesizer_inputs, output_names=TEXT_OUTPUT_NAMES,
            input_axes=text_axes, feeds=text_feeds, durations_output="durations", example_voice=example_voice,
            rewrites=("split at the durations",)),
        DURATIONS_TO_AUDIO: GraphContract(
            module=audio_module, example_inputs=audio_inputs, output_names=("output",),
            input_axes={name: axes for name, axes in audio_axes.items() if name in audio_inputs},
            audio_output="output", example_voice=example_voice, rewrites=("split at the durations",)),
    }
