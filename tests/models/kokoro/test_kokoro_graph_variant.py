"""Which Kokoro graph the pipeline exports: the CPU graph (models/kokoro/cpu_graph.py) by default,
the "float32" or "reference" graph with ``export.graph_variant``, checked at start. Seconds: the
export itself is stopped before it runs, once the contract it was given is known.

    python -m pytest -q tests/models/kokoro/test_kokoro_graph_variant.py
"""
from __future__ import annotations

import pytest

from compress.run_config import settings_from_config
from core.config import ConfigError
from export import variant_export
from export.settings import ExportSettings
from models.graph_contract import SYNTHESIZER
from models.kokoro.cpu_graph import FusedAdaINResBlock1
from models.kokoro.family import FAMILY
from models.kokoro.onnx_contract import (
    DEFAULT_GRAPH_VARIANT,
    GRAPH_VARIANTS,
    graph_contracts,
    tensorrt_axis_ranges,
)
from models.kokoro.release import official_config
from models.kokoro.tiny import tiny_voice
from tests.conftest import compose_config

KOKORO_DEBUG = ["model=kokoro_ja", "+experiment=debug_kokoro"]
FUSED_REWRITE = "generator AdaIN + Snake as one affine, sin and a scale"


def _fused_blocks(contract) -> int:
    return sum(isinstance(module, FusedAdaINResBlock1) for module in contract.module.modules())


def test_the_family_exports_the_cpu_graph_by_default():
    voice = tiny_voice(0)
    assert FAMILY.graph_variants == GRAPH_VARIANTS and GRAPH_VARIANTS[0] == DEFAULT_GRAPH_VARIANT == "cpu"
    contract = FAMILY.graph_contracts(voice)[SYNTHESIZER]
    generator = voice.model.decoder.generator
    assert _fused_blocks(contract) == len(generator.resblocks) + len(generator.noise_res) > 0
    assert FUSED_REWRITE in contract.rewrites
    for variant in ("float32", "reference"):
        other = graph_contracts(voice, variant)[SYNTHESIZER]
        assert _fused_blocks(other) == 0 and FUSED_REWRITE not in other.rewrites
    assert "AdaIN statistics in float32" not in graph_contracts(voice, "reference")[SYNTHESIZER].rewrites


class _Stop(Exception):
    """Raised by the stand-in exporter once it has seen its contract."""


@pytest.mark.parametrize("graph_variant", [None, "float32", "reference"])
def test_export_variant_exports_the_configured_graph(graph_variant, monkeypatch, tmp_path):
    seen = []

    def record(contract, path, opset):
        seen.append(contract)
        raise _Stop

    monkeypatch.setattr(variant_export, "export_graph", record)
    voice = tiny_voice(0)
    with pytest.raises(_Stop):
        variant_export.export_variant("teacher", voice, tmp_path, voice.text_to_utterances("The fox jumps."),
                                      ExportSettings(parity_sentences=1, graph_variant=graph_variant))
    expected = graph_contracts(voice, graph_variant or DEFAULT_GRAPH_VARIANT)[SYNTHESIZER]
    assert seen[0].rewrites == expected.rewrites
    assert _fused_blocks(seen[0]) == _fused_blocks(expected)


def test_graph_variant_is_checked_at_start(tmp_path):
    settings = settings_from_config(compose_config(tmp_path, KOKORO_DEBUG))
    assert settings.export.graph_variant is None  # the family's default: "cpu"
    chosen = settings_from_config(compose_config(tmp_path, [*KOKORO_DEBUG, "export.graph_variant=reference"]))
    assert chosen.export.graph_variant == "reference"
    with pytest.raises(ConfigError, match=r"export.graph_variant='tensorrt'.*\['cpu', 'float32', 'reference'\]"):
        settings_from_config(compose_config(tmp_path, [*KOKORO_DEBUG, "export.graph_variant=tensorrt"]))
    with pytest.raises(ConfigError, match="family 'piper' exports one form of its graphs; leave it null"):
        settings_from_config(compose_config(tmp_path, ["+experiment=debug", "export.graph_variant=cpu"]))


def test_the_debug_preset_gives_tensorrt_the_synthesizer_axes(tmp_path):
    """engine.build_tensorrt=true on the preset builds a profile for every dynamic input axis."""
    settings = settings_from_config(compose_config(tmp_path, KOKORO_DEBUG))
    axes = tensorrt_axis_ranges(official_config())
    assert {name: settings.engine.tensorrt.axis_ranges[name] for name in axes} == axes
    assert {"batch_size"} <= set(settings.engine.tensorrt.axis_ranges)
