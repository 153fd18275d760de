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


@pytest.mark.parametrize("engine_precision", [False, True])
def test_a_half_source_on_a_bucketed_engine_is_made_where_the_family_says(engine_precision):
    """fp16 on a bucketed engine: the server converts the teacher itself, unless the family's engine
    builds the half variant its own way (``engine_precision``); then the engine gets the float32
    teacher and the precision."""
    import dataclasses

    import torch

    calls = []

    def spy_engine(teacher, backend, graphs, package_dir, batch_buckets, **options):
        calls.append(({parameter.dtype for parameter in teacher.parameters()}, options))
        return teacher, False, (64,)

    family = dataclasses.replace(FAMILY, torch_engine=spy_engine, engine_precision=engine_precision)
    settings = ServeSettings(family=FAMILY.name, source="fp16", torch_engine="compile", device="cpu")
    served = load_variant(family, "fp16", "", 1, "cpu", settings)
    (dtypes, options), = calls
    if engine_precision:
        assert dtypes == {torch.float32} and options == {"precision": torch.float16}
    else:
        assert torch.float16 in dtypes and options == {}
    assert served.engine == "torch_compile"


def test_the_family_engine_settings_reach_its_engine():
    """serve.engine_options, read as the family's own dataclass, reaches its torch_engine as ``options``
    (a Piper teacher stands in for the family whose settings these are: nothing here runs it)."""
    import dataclasses

    from models.emotivoice.engine_voice import ServedEngineOptions

    calls = []

    class Grouped:  # an engine's model that runs batches in length groups
        length_groups = 32

    def spy_engine(teacher, backend, graphs, package_dir, batch_buckets, **options):
        calls.append(options)
        return (Grouped() if options["options"].frame_groups > 1 else teacher), False, (64,)

    family = dataclasses.replace(FAMILY, torch_engine=spy_engine, engine_options=ServedEngineOptions)
    settings = ServeSettings(family="emotivoice", source="teacher", torch_engine="compile", device="cpu")
    grouped = load_variant(family, "teacher", "", 1, "cpu",
                           dataclasses.replace(settings, engine_options={"frame_groups": 32}))
    one_run = load_variant(family, "teacher", "", 1, "cpu",
                           dataclasses.replace(settings, engine_options={"frame_groups": 1}))
    assert calls == [{"options": ServedEngineOptions(frame_groups=32)},
                     {"options": ServedEngineOptions(frame_groups=1)}]
    # The warm-up reads it: a model without length groups (the teacher has no such attribute) warms as before.
    assert grouped.splits_by_length and not one_run.splits_by_length
