"""The shipped int8 Kokoro graph in onnxruntime, optionally exposing its internal tensors (the
durations, F0/N curves and frame-aligned text features) for parity checks against the port."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

# Internal tensors of kokoro-v1.0.int8.onnx (node outputs named by the exporter).
INTERNAL_OUTPUTS = {
    "duration_float": "/encoder/Div_output_0",  # (T,) sigmoid sum / speed
    "frames_per_token": "/encoder/Clip_output_0",  # (T,) rounded, >= 1
    "asr": "/encoder/MatMul_1_output_0",  # (1, 512, F) text features aligned to frames
    "F0_pred": "/encoder/F0_proj/Conv_output_0",  # (1, 1, 2F) Hz
    "N_pred": "/encoder/N_proj/Conv_output_0",  # (1, 1, 2F)
}
# The graph's iSTFT (ConvTranspose + window sum) returns 1.5x the official torch.istft of the same
# spectrum (measured, rel. error 8e-7), so its audio is 3.5 dB louder than the official model's.
GRAPH_AUDIO_GAIN = 1.5


class Int8Graph:
    """Runs ``tokens (1, T) with 0 pads, style (1, 256), speed`` through the shipped graph."""

    def __init__(self, graph_path: Path, threads: int = 2, internals: bool = False):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if internals:
            model = onnx.load(str(graph_path))
            for name in INTERNAL_OUTPUTS.values():
                model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
            source = model.SerializeToString()
        else:
            source = str(graph_path)
        self.session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
        self.internals = internals

    def run(self, token_ids: list[int] | np.ndarray, style: np.ndarray, speed: float = 1.0) -> dict[str, np.ndarray]:
        feeds = {"tokens": np.asarray(token_ids, dtype=np.int64).reshape(1, -1),
                 "style": np.asarray(style, dtype=np.float32).reshape(1, -1),
                 "speed": np.array([speed], dtype=np.float32)}
        values = self.session.run(None, feeds)
        outputs = {"audio": values[0].reshape(-1)}
        if self.internals:
            outputs.update(zip(INTERNAL_OUTPUTS, values[1:]))
        return outputs
