"""Run an original Piper ``.onnx`` voice in onnxruntime behind the common TTSModel interface.

This is the reference the PyTorch port must match, and the "original" every variant is
measured against. The graph's per-phoneme durations (the ``Ceil`` of the predicted widths)
are exposed as a second output so parity can be checked phoneme by phoneme.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from models.interface import PhonemeSequence, SynthesisRequest, SynthesisResult
from models.piper.voice_files import PiperVoiceFiles
from models.text.espeak_frontend import EspeakFrontend


def _with_duration_output(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """Add the output of the graph's single ``Ceil`` node (durations, (B, 1, T_text)) as an output."""
    ceil_nodes = [node for node in model.graph.node if node.op_type == "Ceil"]
    if len(ceil_nodes) != 1:
        return model, None
    name = ceil_nodes[0].output[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model, name


class PiperOnnxRuntimeVoice:
    """An original Piper voice in onnxruntime (CPU unless ``providers`` says otherwise)."""

    def __init__(self, voice: str = "bundled:joe", threads: int = 0, providers: list[str] | None = None):
        self.files = PiperVoiceFiles.resolve(voice)
        config = self.files.config()
        self.sample_rate_hz = int(config["audio"]["sample_rate"])
        self.frontend = EspeakFrontend(config["espeak"]["voice"], config["phoneme_id_map"])
        self.num_speakers = int(config.get("num_speakers", 1))
        model, self._duration_output = _with_duration_output(onnx.load(str(self.files.onnx_path)))
        # Samples per frame = product of the decoder's upsampling strides (256 for Piper voices).
        self.hop_length = int(np.prod([
            onnx.helper.get_attribute_value(attr)[0]
            for node in model.graph.node if node.op_type == "ConvTranspose"
            for attr in node.attribute if attr.name == "strides"
        ]))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=providers or ["CPUExecutionProvider"]
        )
        self.size_bytes = self.files.onnx_path.stat().st_size
        self.num_parameters = sum(int(np.prod(t.dims)) for t in model.graph.initializer)

    def text_to_sequences(self, text: str) -> list[PhonemeSequence]:
        return self.frontend(text)

    def parts(self) -> dict:
        return {}  # one opaque graph: nothing a stage can swap

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        noise = request.noise
        feeds = {
            "input": request.phoneme_ids.numpy().astype(np.int64),
            "input_lengths": request.phoneme_lengths.numpy().astype(np.int64),
            "scales": np.array([noise.noise_scale, noise.length_scale, noise.noise_scale_w], np.float32),
        }
        if self.num_speakers > 1:
            if request.speaker_id is None:
                raise ValueError("this multi-speaker voice needs speaker_id on the request")
            feeds["sid"] = request.speaker_id.numpy().astype(np.int64)
        outputs = self.session.run(None, feeds)
        audio = torch.from_numpy(outputs[0]).reshape(outputs[0].shape[0], -1)  # (B, T_audio)
        if self._duration_output is None:
            durations = torch.zeros_like(request.phoneme_ids)
            audio_lengths = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long)
        else:
            durations = torch.from_numpy(outputs[1]).reshape(audio.shape[0], -1).long()  # (B, T_text)
            audio_lengths = durations.sum(dim=1).clamp_min(1) * self.hop_length
        return SynthesisResult(audio, audio_lengths, durations, self.sample_rate_hz)
