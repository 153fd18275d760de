"""export_variant end to end on a tiny voice (fp32 and an fp16 decoder), and the export/engine settings.

    python -m pytest -q tests/test_export_variant.py
"""
from __future__ import annotations

import json

import pytest

from core.config import ConfigError
from compress.run_config import settings_from_config
from export.settings import EngineSettings, ExportSettings
from export.variant_export import export_variant
from models.interface import Utterance
from models.piper.voice import PiperVoice
from models.precision import PrecisionIsland
from models.piper.tiny import tiny_vits

pytestmark = pytest.mark.slow  # loads the real voice

SEQUENCES = [Utterance("a", (), (1, 5, 9, 3, 2, 7, 4, 1)), Utterance("b", (), (1, 12, 3, 2))]


def tiny_voice(decoder_dtype: str | None = None) -> PiperVoice:
    vits = tiny_vits()
    if decoder_dtype:
        vits.replace_part("decoder", PrecisionIsland(vits.dec, decoder_dtype))
    return PiperVoice(vits, frontend=None, sample_rate_hz=22050)


@pytest.mark.parametrize("decoder_dtype, precision", [(None, "fp32"), ("float16", "fp16")])
def test_export_variant_reports_parity_checks_readiness_and_engine_status(tmp_path, decoder_dtype, precision):
    report = export_variant("v", tiny_voice(decoder_dtype), tmp_path, SEQUENCES, ExportSettings(parity_sentences=2))
    assert report.precision == precision
    assert report.parity["durations_equal_fraction"] == 1.0 and report.parity["within_budget"], report.parity
    assert report.graph_checks["checker"] == "ok"
    assert report.readiness["ready"], report.readiness["blockers"]
    # The real builder (TensorRT-RTX) refuses the one-graph synthesizer at its frame count, a shape computed
    # from float values; the pair split at the durations builds (tests/models/piper/test_tensorrt_pair.py).
    assert report.engine_status == "failed" and "shape tensor" in report.engine_reason and report.engine_path is None
    assert report.ort_optimized_path.is_file() and report.simplified_path.is_file()
    saved = json.loads(report.report_path.read_text())
    assert saved["engine_status"] == "failed" and saved["node_counts"]["exported"] > 0


def test_export_and_engine_config_groups_are_typed_and_unknown_keys_fail(debug_config):
    settings = settings_from_config(debug_config())
    assert isinstance(settings.export, ExportSettings) and isinstance(settings.engine, EngineSettings)
    assert settings.engine.tensorrt.axis_ranges["phonemes"] == [2, 64, 400]
    with pytest.raises(ConfigError, match="unknown keys"):
        settings_from_config(debug_config("+export.opset_version=17"))
    with pytest.raises(ConfigError, match="engine.tensorrt"):
        settings_from_config(debug_config("+engine.tensorrt.fp16=true"))
    with pytest.raises(ConfigError, match="min <= opt <= max"):
        settings_from_config(debug_config("engine.tensorrt.axis_ranges.batch_size=[4,2,8]"))
