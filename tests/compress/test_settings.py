"""A bad config stops the run at start with a message naming the key."""
import pytest

from core.config import ConfigError
from compress.run_config import settings_from_config


def test_debug_preset_builds_settings(debug_config):
    settings = settings_from_config(debug_config())
    assert settings.data.max_eval_sentences == 2
    assert settings.variants == ("original_onnx", "teacher")
    assert settings.tracking.tracking_uri.startswith("sqlite:////")  # absolute path


@pytest.mark.parametrize(
    "override, message",
    [
        ("+evaluate.calibrator=max", "unknown keys ['calibrator']"),
        ("evaluate.metrics=[dnsmos,pesq]", "unknown ['pesq']"),
        ("variants=[teacher,int4]", "unknown ['int4']"),
        ("evaluate.reference_variant=original_onnx", None),  # valid: the ONNX can be the reference
        ("evaluate.sampling.length_scale=0", "length_scale=0"),
        ("+model.sampling.top_k=5", "unknown ['top_k'] for family 'piper'"),
        ("model.family=tacotron", "not a registered family; registered: ['emotivoice'"),
        ("evaluate.warm_runs=0", "warm_runs"),
        ("data.max_eval_sentences=0", "max_eval_sentences"),
        ("model.device=tpu", "model.device='tpu'"),
    ],
)
def test_bad_values_fail_at_start(debug_config, override, message):
    if message is None:
        settings_from_config(debug_config(override))
        return
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings_from_config(debug_config(override))


def test_reference_must_be_a_variant(debug_config):
    with pytest.raises(ConfigError, match="reference_variant"):
        settings_from_config(debug_config("variants=[original_onnx]"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("stages.int8_ort.calibrator=kl", "calibrator='kl'"),
        ("stages.prune.ratio=1.5", "prune.ratio=1.5"),
        ("stages.prune.ratio=0", "prune.ratio=0"),
        ("data.calibration_set=eval", "never calibrate on an evaluation set"),
        ("data.calibration_set=harvard", "never calibrate on an evaluation set"),
        ("data.calibration_set=/nonexistent/calibration.txt", "no file at"),
        ("stages.fp16.dtype=float8", "float8"),
        ("+stages.prune.warmup=3", "unexpected keyword argument 'warmup'"),
    ],
)
def test_bad_stage_config_stops_the_run_at_start(debug_config, override, message):
    with pytest.raises(ValueError, match=message):
        settings_from_config(debug_config("variants=[original_onnx,teacher,fp16,int8_ort,pruned]", override))


def test_a_stage_variant_needs_its_source(debug_config):
    with pytest.raises(ConfigError, match="list 'original_onnx' in variants"):
        settings_from_config(debug_config("variants=[teacher,int8_ort]"))


def test_the_model_config_brings_its_family_sampling_and_stage_defaults(debug_config):
    """conf/model/piper_joe.yaml: Piper's noise scales and the parts its stages keep or touch."""
    settings = settings_from_config(debug_config("variants=[original_onnx,teacher,fp16,pruned,int8_modelopt]"))
    assert settings.model.sampling == {"noise_scale": 0.667, "noise_scale_w": 0.8}
    assert settings.stages["fp16"].keep_fp32 == ("encoder", "duration")
    assert settings.stages["prune"].parts == ("decoder",)
    assert settings.stages["int8_modelopt"].sensitivity_blocks == ("dec.conv_pre", "dec.resblocks.0")


def test_the_debug_preset_is_the_piper_debug_preset(tmp_path):
    from tests.conftest import compose_config

    assert compose_config(tmp_path, ["+experiment=debug"]) == compose_config(tmp_path, ["+experiment=debug_piper"])


def test_stage_part_names_are_checked_against_the_family_at_start(debug_config):
    with pytest.raises(ConfigError, match="family 'piper' has no part \\['vocoder'\\]"):
        settings_from_config(debug_config("variants=[teacher,fp16]", "stages.fp16.keep_fp32=[vocoder]"))


def test_a_family_without_a_reference_runtime_drops_the_variants_that_need_one(debug_config, monkeypatch, caplog):
    """An experiment's variants are written for every family: a family with no graph of its own runs
    the others, and the log names what was dropped; built by hand, such settings still fail."""
    import dataclasses

    from compress import settings as compress_settings
    from models.registry import FAMILIES

    no_graph = dataclasses.replace(FAMILIES["piper"], reference=None)
    monkeypatch.setitem(compress_settings.FAMILIES, "piper", no_graph)
    with caplog.at_level("WARNING"):
        settings = settings_from_config(debug_config())
    assert "original_onnx" not in settings.variants and "teacher" in settings.variants
    assert settings.evaluate.reference_variant == "teacher"
    assert "cannot build variant original_onnx" in caplog.text
    with pytest.raises(ConfigError, match="has none"):
        dataclasses.replace(settings, variants=("original_onnx", "teacher"))
