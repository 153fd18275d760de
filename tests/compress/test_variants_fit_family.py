"""An experiment's variant list is written for every family; each family runs the variants it can
build, and the log names the ones it cannot. Variants typed on the command line are strict.

    python -m pytest -q tests/compress/test_variants_fit_family.py
"""
from __future__ import annotations

import logging

import pytest
from conftest import compose_config

from compress.__main__ import variants_typed
from compress.run_config import fit_variants_to_family, settings_from_config
from compress.stages import STAGES, unbuildable_reason
from core.config import ConfigError
from models.registry import FAMILIES


def _settings(tmp_path, *overrides):
    return settings_from_config(compose_config(tmp_path, list(overrides)))


def test_int8_experiment_runs_the_int8_a_family_without_a_shipped_graph_has(tmp_path, caplog):
    """EmotiVoice ships no graph, so int8_ort (which quantizes the shipped graph) cannot be built;
    before the fit, `python -m compress +experiment=int8 model=emotivoice` stopped at start."""
    with caplog.at_level(logging.WARNING, logger="compress.run_config"):
        settings = _settings(tmp_path, "model=emotivoice", "+experiment=int8")
    assert settings.variants == ("teacher", "int8_modelopt", "int8_dynamic")
    assert settings.stages["int8_dynamic"].parts == ("style_encoder",)  # from its family's stage defaults
    assert settings.evaluate.reference_variant == "teacher"
    assert "int8_ort" in caplog.text and "built from 'original_onnx'" in caplog.text


def test_int8_experiment_runs_gpt_sovits_dynamic_int8(tmp_path, caplog):
    """GPT-SoVITS has neither a shipped graph nor parts ModelOpt may quantize: its INT8 is dynamic
    INT8 of the transformer's Linear layers. Before, `+experiment=int8 model=gpt_sovits_v2` stopped at start."""
    with caplog.at_level(logging.WARNING, logger="compress.run_config"):
        settings = _settings(tmp_path, "model=gpt_sovits_v2", "+experiment=int8")
    assert settings.variants == ("teacher", "int8_dynamic")
    assert settings.stages["int8_dynamic"].parts == ("t2s",)
    assert "int8_modelopt" in caplog.text


def test_a_stage_with_no_settings_for_the_family_is_dropped_unless_typed(tmp_path, caplog):
    """Piper's stage defaults name no parts for dynamic INT8 (its text encoder's projections are
    convolutions), so the experiments that list int8_dynamic run without it; typed, it is an error."""
    with caplog.at_level(logging.WARNING, logger="compress.run_config"):
        settings = _settings(tmp_path, "+experiment=int8")
    assert settings.variants == ("original_onnx", "teacher", "int8_ort", "int8_modelopt")
    assert "needs settings under stages.int8_dynamic" in caplog.text
    with pytest.raises(ConfigError, match="needs settings under stages.int8_dynamic"):
        _settings(tmp_path, "variants=[teacher,int8_dynamic]")
    given = _settings(tmp_path, "+experiment=int8", "+stages.int8_dynamic.parts=[encoder]")
    assert given.variants[-1] == "int8_dynamic" and given.stages["int8_dynamic"].parts == ("encoder",)


def test_piper_keeps_every_variant_of_the_full_experiment_its_stage_defaults_configure(tmp_path):
    resolved = compose_config(tmp_path, ["+experiment=full"])
    expected = tuple(v for v in resolved["variants"] if v != "int8_dynamic")
    assert fit_variants_to_family(resolved)["variants"] == list(expected)
    assert _settings(tmp_path, "+experiment=full").variants == expected


def test_a_fitted_run_drops_each_variant_built_from_a_dropped_one(tmp_path):
    """Kokoro has a student but no pruning: lite_slim and everything built from it go, lite stays."""
    settings = _settings(tmp_path, "model=kokoro_ja", "+experiment=lite_slim")
    assert "lite_slim" not in settings.variants and "lite_slim_int8" not in settings.variants
    assert {"lite", "lite_ort", "lite_int8"} <= set(settings.variants)


def test_an_experiment_left_with_no_stage_variant_is_an_error_naming_what_can_run(tmp_path):
    with pytest.raises(ConfigError, match="builds none of this run's stage variants") as error:
        _settings(tmp_path, "model=gpt_sovits_v2", "+experiment=prune")
    assert str(error.value).endswith("['fp16', 'bf16', 'lite', 'int8_dynamic']")
    with pytest.raises(ConfigError, match=r"Family\.prune is None"):
        _settings(tmp_path, "model=kokoro_ja", "+experiment=prune")
    # Kokoro ships an int8 graph: int8_ort had quantized it again and failed after the teacher's scoring.
    with pytest.raises(ConfigError, match="which is INT8 already") as error:
        _settings(tmp_path, "model=kokoro_ja", "+experiment=int8")
    assert "teacher_int8" in str(error.value).split("can build")[1]


def test_variants_typed_on_the_command_line_are_not_dropped(tmp_path):
    resolved = compose_config(tmp_path, ["model=kokoro_ja", "variants=[original_onnx,teacher,pruned]"])
    with pytest.raises(ConfigError, match=r"cannot build them all: 'pruned' needs pruning hooks"):
        fit_variants_to_family(resolved, strict=True)
    assert variants_typed(["model=kokoro_ja", "variants=[teacher,pruned]"])
    assert variants_typed(["+variants=[teacher]"]) and variants_typed(["++variants=[teacher]"])
    assert not variants_typed(["model=kokoro_ja", "+experiment=prune", "stages.prune.ratio=0.3"])


BUILDABLE = {  # what each family registers (models/<family>/family.py), as the stages read it
    "piper": set(STAGES),
    "kokoro": set(STAGES) - {"int8_ort", "int8_modelopt", "pruned", "lite_slim", "lite_slim_ort", "lite_slim_int8"},
    "emotivoice": {"fp16", "bf16", "pruned", "int8_modelopt", "lite", "lite_slim", "int8_dynamic"},
    "gpt_sovits_v2": {"fp16", "bf16", "lite", "int8_dynamic"},
}


def test_each_family_builds_the_stages_its_registry_entry_allows():
    assert set(BUILDABLE) == set(FAMILIES)
    for name, family in FAMILIES.items():
        assert {stage for stage in STAGES if unbuildable_reason(stage, family) is None} == BUILDABLE[name], name
        assert (unbuildable_reason("original_onnx", family) is None) == (family.reference is not None)


def test_the_recognizer_follows_the_language_of_what_is_read(tmp_path):
    """A named evaluation set has a language; the default (null) recognizer picks tiny.en for English
    and multilingual base otherwise. Before, EmotiVoice's int8 run chose tiny.en for its Mandarin
    model.language and failed after MLflow had started."""
    english = _settings(tmp_path, "model=emotivoice", "+experiment=int8")  # the English held-out set
    assert (english.scored_language, english.evaluate.recognizer.whisper_model("en")) == ("en", "tiny.en")
    mandarin = _settings(tmp_path, "model=emotivoice", "+experiment=int8", "data.eval_set=eval_zh")
    assert mandarin.scored_language == "zh"
    assert mandarin.evaluate.recognizer.whisper_model(mandarin.scored_language) == "base"
    with pytest.raises(ConfigError, match="English only and the voice speaks 'zh'"):
        _settings(tmp_path, "model=emotivoice", "+experiment=int8", "data.eval_set=eval_zh",
                  "evaluate.recognizer.model=tiny.en")
    with pytest.raises(ConfigError, match="recognizes English only"):
        _settings(tmp_path, "model=emotivoice", "data.eval_set=eval_zh", "evaluate.recognizer.kind=pocketsphinx_domain")
    own_file = tmp_path / "mine.txt"
    own_file.write_text("你好。\n")  # a file has no language of its own: the voice's is used
    assert _settings(tmp_path, "model=emotivoice", f"data.eval_set={own_file}").scored_language == "zh"
