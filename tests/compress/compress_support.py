"""Builders the stage tests share (kept out of tests/conftest.py, which the PyTriton venv also loads)."""
from __future__ import annotations

from compress.variants import Variant
from evaluate.memory import file_size_mb
from models.piper.onnx_runtime import PiperOnnxRuntimeVoice


def piper_original_onnx_variant():
    """The bundled Piper voice's original ONNX as the variant stages start from (onnxruntime, 2 threads)."""
    voice = PiperOnnxRuntimeVoice("bundled:joe", threads=2)
    return Variant("original_onnx", voice, "onnxruntime", "cpu", voice.num_parameters / 1e6,
                   file_size_mb(voice.files.onnx_path))
