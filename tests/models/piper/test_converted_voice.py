"""models/piper/voice.py: a converted voice (.safetensors + .onnx.json) speaks like the ONNX voice it came from."""
from __future__ import annotations

import pytest
import torch

from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from models.piper.voice import PiperVoice, save_converted_voice

pytestmark = pytest.mark.slow  # loads the real voice


def test_float32_converted_voice_is_the_same_voice(tmp_path):
    path = save_converted_voice("bundled:joe", tmp_path / "en_US-joe-medium.safetensors", torch.float32)
    assert (tmp_path / "en_US-joe-medium.onnx.json").is_file()
    original, converted = PiperVoice.load("bundled:joe"), PiperVoice.load(path)
    assert converted.sample_rate_hz == original.sample_rate_hz == 22050
    sequences = original.text_to_utterances("The birch canoe slid on the smooth planks.")
    assert converted.text_to_utterances("The birch canoe slid on the smooth planks.") == sequences
    request = SynthesisRequest.from_utterances(sequences, sampling=VitsSampling(seed=4))
    reference, candidate = original.synthesize(request), converted.synthesize(request)
    assert torch.equal(reference.durations, candidate.durations)
    assert torch.equal(reference.audio, candidate.audio)


def test_float16_voice_halves_the_bytes_and_loads_as_float32(tmp_path):
    full = save_converted_voice("bundled:joe", tmp_path / "full" / "joe.safetensors", torch.float32)
    half = save_converted_voice("bundled:joe", tmp_path / "half" / "joe.safetensors", torch.float16)
    assert half.stat().st_size < 0.51 * full.stat().st_size
    voice = PiperVoice.load(half)
    assert {p.dtype for p in voice.model.parameters()} == {torch.float32}


def test_a_converted_voice_without_its_config_is_named(tmp_path):
    path = save_converted_voice("bundled:joe", tmp_path / "joe.safetensors", torch.float16)
    (tmp_path / "joe.onnx.json").unlink()
    with pytest.raises(FileNotFoundError, match="joe.onnx.json"):
        PiperVoice.load(path)
