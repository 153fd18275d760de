"""Run an original Piper ``.onnx`` voice in onnxruntime behind the common TTSModel interface.

This is the reference the PyTorch port must match, and the "original" every variant is
measured against. The graph's per-phoneme durations (the ``Ceil`` of the predicted widths)
are exposed as a second output so parity can be checked phoneme by phoneme.

``prepare_graph`` gives that rewritten graph (noise inputs, durations output) for a stage to
transform; ``PiperOnnxRuntimeVoice(voice, threads, graph_path=...)`` runs such a transformed
graph (an INT8 one, say) with the voice's own frontend and config::

    graph = prepare_graph(PiperVoiceFiles.resolve("bundled:joe").onnx_path)   # onnx.ModelProto
    voice = PiperOnnxRuntimeVoice("bundled:joe", threads=2, graph_path="joe_int8.onnx")
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.piper.capabilities import CAPABILITIES, FAMILY_NAME
from models.piper.onnx_contract import convtranspose_hop, duration_ceil, piper_feeds
from models.piper.voice_files import PiperVoiceFiles
from models.sampling import VitsSampling
from models.text.espeak_frontend import EspeakFrontend


def _with_duration_output(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Add the output of the graph's single ``Ceil`` node (durations, (B, 1, T_text)) as an output."""
    ceil = duration_ceil(model)
    if ceil is None:
        return model, None
    name = ceil.output[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model, name


def _duration_output_name(model: onnx.ModelProto) -> str | None:
    """The durations output ``_with_duration_output`` added, if the graph has one."""
    ceil = duration_ceil(model)
    graph_outputs = {output.name for output in model.graph.output}
    return ceil.output[0] if ceil is not None and ceil.output[0] in graph_outputs else None


def _latent_channels(model: onnx.ModelProto) -> int:
    """Width of the flow's latent: the decoder's first conv consumes it."""
    weights = {t.name: t for t in model.graph.initializer}
    conv_pre = next(n for n in model.graph.node if n.name == "/dec/conv_pre/Conv")
    weight_name = conv_pre.input[1]
    # In a quantized graph the weight reaches the conv through a DequantizeLinear of an int8 initializer.
    producer = next((n for n in model.graph.node if weight_name in n.output), None)
    if producer is not None and producer.op_type == "DequantizeLinear":
        weight_name = producer.input[0]
    return int(weights[weight_name].dims[1])


def _with_noise_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace each ``RandomNormalLike`` with a slice of a new standard-normal graph input.

    The duration predictor's draw becomes ``duration_noise`` (B, 2, >= T_text), the prior's
    ``prior_noise`` (B, C_latent, >= T_frames); each is sliced to the shape of the tensor the
    random op mimicked. The same noise can then drive this graph and a PyTorch variant.
    """
    for node in [n for n in model.graph.node if n.op_type == "RandomNormalLike"]:
        input_name = "duration_noise" if node.name.startswith("/dp/") else "prior_noise"
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(input_name, onnx.TensorProto.FLOAT, ["batch_size", None, None])
        )
        prefix = f"{node.name}_as_input"
        starts = onnx.numpy_helper.from_array(np.zeros(3, np.int64), f"{prefix}/starts")
        model.graph.initializer.append(starts)
        replacement = [
            onnx.helper.make_node("Shape", [node.input[0]], [f"{prefix}/shape"], name=f"{prefix}/Shape"),
            onnx.helper.make_node(
                "Slice", [input_name, starts.name, f"{prefix}/shape"], [node.output[0]], name=f"{prefix}/Slice"
            ),
        ]
        position = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        for offset, new_node in enumerate(replacement):
            model.graph.node.insert(position + offset, new_node)
    return model


def prepare_graph(onnx_path: str | Path) -> onnx.ModelProto:
    """A Piper ``.onnx`` with noise inputs (``duration_noise``, ``prior_noise``) and a durations output."""
    model, _ = _with_duration_output(_with_noise_inputs(onnx.load(str(onnx_path))))
    return model


class PiperOnnxRuntimeVoice:
    """A Piper voice in onnxruntime (CPU unless ``providers`` says otherwise).

    By default the voice's original graph, prepared here. ``graph_path`` runs a graph already
    prepared by ``prepare_graph`` and then transformed (quantized, say); the voice's config and
    frontend still come from ``voice``.
    """

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = VitsSampling

    def __init__(self, voice: str = "bundled:joe", threads: int = 0, providers: list[str] | None = None,
                 graph_path: str | Path | None = None):
        self.voice = voice  # as given: "bundled:joe" or a path; another graph of this voice reuses it
        self.files = PiperVoiceFiles.resolve(voice)
        config = self.files.config()
        self.sample_rate_hz = int(config["audio"]["sample_rate"])
        self.frontend = EspeakFrontend(config["espeak"]["voice"], config["phoneme_id_map"])
        self.num_speakers = int(config.get("num_speakers", 1))
        self.graph_path = Path(graph_path) if graph_path is not None else self.files.onnx_path
        if graph_path is None:
            model = prepare_graph(self.files.onnx_path)
        else:
            model = onnx.load(str(graph_path))
            if "duration_noise" not in {graph_input.name for graph_input in model.graph.input}:
                raise ValueError(
                    f"graph_path={graph_path}: not a prepared graph (no 'duration_noise' input); "
                    "give a graph made by models.piper.onnx_runtime.prepare_graph, or leave graph_path unset"
                )
        self._duration_output = _duration_output_name(model)
        # Samples per frame = product of the decoder's upsampling strides (256 for Piper voices).
        self.hop_length = convtranspose_hop(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=providers or ["CPUExecutionProvider"]
        )
        self.latent_channels = _latent_channels(model)
        self.size_bytes = self.graph_path.stat().st_size
        self.num_parameters = sum(int(np.prod(t.dims)) for t in model.graph.initializer)

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return self.frontend(text)

    def parts(self) -> dict:
        return {}  # one opaque graph: nothing a stage can swap

    def session_feeds(self, request: SynthesisRequest) -> dict[str, np.ndarray]:
        """The graph inputs for ``request``, by input name: what ``synthesize`` runs (and calibration replays)."""
        return piper_feeds(request, self.latent_channels, self.num_speakers)

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        outputs = self.session.run(None, self.session_feeds(request))
        audio = torch.from_numpy(outputs[0]).reshape(outputs[0].shape[0], -1)  # (B, T_audio)
        if self._duration_output is None:
            durations = torch.zeros_like(request.phoneme_ids)
            audio_lengths = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)
        else:
            durations = torch.from_numpy(outputs[1]).reshape(audio.shape[0], -1).long()  # (B, T_text)
            audio_lengths = durations.sum(dim=1).clamp_min(1) * self.hop_length
        return SynthesisResult(audio, audio_lengths, self.sample_rate_hz, durations=durations)
