"""The distillation stage (compress/distil.py) end to end on GPT-SoVITS's tiny voice: the family's
Lite hooks train here, the ``lite`` variant swaps in the student transformer and speaks, and a
second build finds the finished weights (resume)."""
from __future__ import annotations

import pytest
import torch

from compress.distil import DistilSettings, build
from compress.variants import StageContext, Variant
from evaluate.memory import parameter_count, state_dict_size_mb
from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.tiny import tiny_voice
from models.interface import SynthesisRequest
from models.registry import get_family


def test_the_lite_variant_trains_swaps_the_transformer_and_resumes(tmp_path):
    torch.set_num_threads(1)
    voice = tiny_voice(0)
    teacher = Variant("teacher", voice, "torch", "cpu", parameter_count(voice) / 1e6, state_dict_size_mb(voice))
    sampling = GptSovitsSampling(seed=0, max_tokens=12)
    ctx = StageContext([], tmp_path / "lite", 1, tmp_path / "cache", get_family(voice.family), "random", sampling)
    settings = DistilSettings(checkpoint=None, student={"layers": 1}, train_steps=2, lr=1e-3, warmup_steps=1,
                              batch_size=1, segment_frames=10, training_sentences=2)
    settings.check_family(ctx.family)
    lite = build(teacher, settings, ctx)
    assert lite.model.t2s.config.layers == 1 and voice.t2s.config.layers == 2  # the teacher keeps its own
    assert lite.stage_metrics["distil_steps"] == 2
    assert lite.stage_metrics["t2s_params_after"] < lite.stage_metrics["t2s_params_before"]
    result = lite.model.synthesize(SynthesisRequest.from_utterances(
        lite.model.text_to_utterances("Where did Kenji leave his lantern?"), sampling=sampling))
    assert result.audio_lengths[0] > 0 and torch.isfinite(result.audio).all()
    again = build(teacher, settings, ctx)  # the finished weights are found: no training this time
    assert "distil_steps" not in again.stage_metrics
    for name, value in again.model.t2s.state_dict().items():
        assert torch.equal(value, lite.model.t2s.state_dict()[name]), name


@pytest.mark.parametrize("student, message", [({"layers": 0}, "layers=0"), ({"depth": 2}, "unknown")])
def test_bad_student_settings_stop_the_run_at_start(student, message):
    from core.config import ConfigError

    settings = DistilSettings(checkpoint=None, student=student, train_steps=1)
    with pytest.raises(ConfigError, match=message):
        settings.check_family(get_family("gpt_sovits_v2"))
