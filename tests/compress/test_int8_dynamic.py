"""The dynamic INT8 stage (compress/int8_dynamic.py) on GPT-SoVITS's tiny transformer: which Linear
layers become int8, what stays float32, the size it reports, and that the variant still speaks
the teacher's greedy tokens on these weights."""
from __future__ import annotations

import pytest
import torch

from compress.int8_dynamic import Int8DynamicSettings, build, weight_bytes
from compress.variants import StageContext, Variant
from core.config import ConfigError
from evaluate.memory import parameter_count, state_dict_size_mb
from models.dynamic_int8 import DynamicInt8Linear
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.tiny import tiny_voice
from models.interface import SynthesisRequest
from models.registry import get_family


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    voice = tiny_voice(0)
    teacher = Variant("teacher", voice, "torch", "cpu", parameter_count(voice) / 1e6, state_dict_size_mb(voice))
    ctx = StageContext([], tmp_path_factory.mktemp("int8_dynamic"), 1, tmp_path_factory.mktemp("cache"),
                       get_family(voice.family), "random")
    return teacher, build(teacher, Int8DynamicSettings(parts=["t2s"], keep_float=["ar_predict_layer"]), ctx)


def test_linear_layers_become_int8_except_the_kept_ones(built):
    teacher, int8 = built
    t2s = int8.model.t2s
    layer = t2s.h.layers[0]
    assert isinstance(layer.linear1, DynamicInt8Linear) and isinstance(layer.self_attn.out_proj, DynamicInt8Linear)
    assert isinstance(layer.self_attn.in_proj, DynamicInt8Linear)  # the packed q/k/v projection too
    assert isinstance(t2s.ar_predict_layer, torch.nn.Linear) and not isinstance(t2s.ar_predict_layer, DynamicInt8Linear)
    assert isinstance(teacher.model.t2s.h.layers[0].linear1, torch.nn.Linear)  # the teacher is untouched
    # bert_proj, and per layer in_proj, out_proj, linear1, linear2
    assert int8.stage_metrics["int8_linear_layers"] == 1 + 4 * t2s.config.layers
    assert 0 < int8.stage_metrics["t2s_int8_weight_fraction"] < 1
    assert int8.stage_tags["float_linear_layers"] == "t2s.ar_predict_layer"


def test_size_and_parameters_count_int8_weights(built):
    teacher, int8 = built
    assert int8.params_m == pytest.approx(teacher.params_m, rel=1e-6)  # the same weights, fewer bytes
    assert int8.size_mb < teacher.size_mb
    total, _, int8_values = weight_bytes(int8.model.t2s)
    teacher_bytes = sum(v.numel() * v.element_size() for v in teacher.model.t2s.state_dict().values())
    # each int8 value saves 3 of its 4 bytes, less a 4-byte scale per output channel
    assert teacher_bytes - 3 * int8_values < total < teacher_bytes - 2.5 * int8_values


def test_the_int8_voice_speaks(built):
    _, int8 = built
    utterances = int8.model.text_to_utterances("Where did Kenji leave his lantern?")
    result = int8.model.synthesize(SynthesisRequest.from_utterances(
        utterances, sampling=GptSovitsSampling.deterministic(max_tokens=20)))
    assert result.audio_lengths[0] > 0 and torch.isfinite(result.audio).all()


@pytest.mark.parametrize("fields, message", [
    ({"parts": "t2s"}, "give a list"), ({"parts": []}, "give part roles"), ({"parts": ["t2s", "t2s"]}, "repeated")])
def test_bad_settings_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        Int8DynamicSettings(**fields)


def test_parts_are_checked_against_the_family():
    with pytest.raises(ConfigError, match="has no part \\['decoder'\\]"):
        Int8DynamicSettings(parts=["decoder"]).check_family(get_family("gpt_sovits_v2"))
