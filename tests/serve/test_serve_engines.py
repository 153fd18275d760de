"""How serve/engines.py builds the served model through the family registry.

    python -m pytest -q tests/serve/test_serve_engines.py
"""
from __future__ import annotations

import pytest

from models.registry import get_family
from serve.engines import load_variant
from serve.settings import ServeConfigError, ServeSettings

FAMILY = get_family("piper")


@pytest.mark.parametrize("engine, backend, graphs", [("compile", "compile", False), ("eager", None, None)])
def test_serve_torch_engine_picks_the_backend(engine, backend, graphs):
    """serve.torch_engine names the family's bucketed engine backend (compile: lazy, nothing compiles here)."""
    settings = ServeSettings(family=FAMILY.name, source="teacher", torch_engine=engine, device="cpu")
    served = load_variant(FAMILY, "teacher", "", 1, "cpu", settings)
    assert served.voice == FAMILY.default_voice  # "" is the family's own default voice
    assert served.engine == ("torch" if engine == "eager" else f"torch_{engine}")
    assert served.capabilities == FAMILY.capabilities and served.noise_channels == 192
    if backend is None:
        assert served.decoder_streaming and served.text_buckets == ()
    else:
        assert not served.decoder_streaming and served.text_buckets  # a bucketed engine offers no decoder windows
        assert (served.model.engine.backend.kind, served.model.engine.graphs) == (backend, graphs)
        assert served.noise_device == "cpu" and served.captures_graphs is False


def test_the_family_must_be_registered():
    with pytest.raises(ServeConfigError, match="serve.family='tortoise': use a registered family"):
        ServeSettings(family="tortoise", source="teacher")
