"""INT8 after the polyphase ConvTranspose rewrite (``int8_onnxruntime.build(..., polyphase_conv_transpose=True)``,
the ``lite_poly_int8`` stage), on the joe voice's own graph: its upsampling convs become blocks that
are measured and quantized, and the voice still reads its hop and keeps its durations.

    python -m pytest -q -m slow tests/compress/test_int8_polyphase.py
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from compress_support import piper_original_onnx_variant

from compress.int8_onnxruntime import Int8OrtSettings, build
from compress.run_config import settings_from_config
from compress.variants import StageContext, Variant
from core.config import ConfigError
from evaluate.mcd import mel_cepstral_distortion
from models.interface import SynthesisRequest
from models.registry import get_family
from models.sampling import VitsSampling
from texts import load_sentences

SLOW = pytest.mark.slow  # loads the real voice and calibrates it (about 30 s)

UPSAMPLING_BLOCK = "dec.ups.0"  # the first ConvTranspose of the decoder, x8
HELD_OUT = "Seventeen pelicans circled the harbor at dawn."  # written for the tests, in no sentence set
NOISE = VitsSampling(seed=1234)


@pytest.fixture(scope="module")
def original() -> Variant:
    return piper_original_onnx_variant()


@pytest.fixture(scope="module")
def poly_int8(original, tmp_path_factory) -> Variant:
    sequences = [original.model.text_to_utterances(text)[0] for text in load_sentences("calibration")[:2]]
    work_dir = tmp_path_factory.mktemp("int8_polyphase")
    ctx = StageContext(calibration_sequences=sequences, work_dir=work_dir, cpu_threads=2, cache_dir=work_dir,
                       family=get_family("piper"), voice="bundled:joe")
    settings = Int8OrtSettings(calibrator="minmax", calibration_sentences=2, sensitivity_sentences=1,
                               speed_check_sentences=1, sensitivity_blocks=[UPSAMPLING_BLOCK])
    return build(original, settings, ctx, variant_name="poly_int8", polyphase_conv_transpose=True)


@SLOW
def test_every_conv_transpose_is_rewritten_and_the_upsampling_block_runs_int8(poly_int8):
    report = json.loads(poly_int8.stage_tags["conv_transpose_polyphase"])
    assert report and set(report.values()) == {"rewritten"}
    graph = onnx.load(str(poly_int8.artifacts["int8_onnx"]))
    assert "ConvTranspose" not in {node.op_type for node in graph.graph.node}
    dequantized = {node.output[0] for node in graph.graph.node if node.op_type == "DequantizeLinear"}
    upsampling = [node for node in graph.graph.node
                  if node.op_type == "Conv" and node.name.startswith("/dec/ups.0/")]
    assert len(upsampling) == 1 and upsampling[0].input[1] in dequantized
    assert poly_int8.stage_metrics["quantized_nodes"] == 1  # only the measured block


@SLOW
def test_voice_keeps_its_hop_and_durations_and_stays_close(poly_int8, original):
    assert poly_int8.model.hop_length == original.model.hop_length == 256
    request = SynthesisRequest.from_utterances(original.model.text_to_utterances(HELD_OUT)[:1], sampling=NOISE)
    expected, result = original.model.synthesize(request), poly_int8.model.synthesize(request)
    assert result.audio.shape == expected.audio.shape
    np.testing.assert_array_equal(result.durations.numpy(), expected.durations.numpy())
    assert int(result.audio_lengths[0]) == int(result.durations.sum()) * 256
    # one x8 upsampling conv in int8: a small step, far below a broken graph's several dB
    assert mel_cepstral_distortion(result.waveforms()[0], expected.waveforms()[0], sample_rate_hz=22050) < 0.5


def test_lite_poly_int8_is_a_stage_of_the_lite_graph(debug_config):
    resolved = debug_config("variants=[original_onnx,teacher,lite,lite_ort,lite_poly_int8]", "export.enabled=true")
    settings = settings_from_config(resolved)
    assert "lite_poly_int8" in settings.variants and "int8_ort" in settings.stages  # it reads int8_ort's settings
    with pytest.raises(ConfigError, match="built from 'lite_ort'"):
        settings_from_config(debug_config("variants=[original_onnx,teacher,lite,lite_poly_int8]",
                                          "export.enabled=true"))
