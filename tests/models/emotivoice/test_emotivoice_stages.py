"""EmotiVoice through the pipeline's INT8, pruning and Lite stages on tiny random weights: each stage
reads the family's hooks (models/emotivoice/quantization.py, stage_hooks.py), changes only the
part it names, and leaves the teacher untouched.

    python -m pytest -q tests/models/emotivoice/test_emotivoice_stages.py
"""
from __future__ import annotations

import pytest
import torch

from compress.distil import DistilSettings
from compress.distil import build as build_lite
from compress.int8_dynamic import Int8DynamicSettings
from compress.int8_dynamic import build as build_dynamic
from compress.int8_modelopt import Int8ModeloptSettings
from compress.int8_modelopt import build as build_int8
from compress.prune import PruneSettings
from compress.prune import build as build_pruned
from compress.stages import stage_settings
from compress.variants import StageContext, Variant
from core.config import ConfigError
from evaluate.memory import parameter_count, state_dict_size_mb
from models.emotivoice.calibration import (
    CALIBRATION_PAIRS,
    EMOTIONS,
    calibration_prompts,
    prompt_for,
)
from models.emotivoice.family import FAMILY
from models.emotivoice.quantization import QUANTIZATION
from models.emotivoice.tiny import tiny_voice
from models.emotivoice.vocoder_student import (
    LiteVocoderConfig,
    build_vocoder,
    plain_vocoder,
    prune_vocoder,
    teacher_mels,
    vocoder_config,
)
from models.interface import SynthesisRequest, VoiceCondition
from texts import load_sentences

SENTENCE = "今天天气很好。"
# Segments the distillation loss can read at the tiny hop of 16: its longest STFT (2048) pads 1024
# samples each side, so a segment must be longer than that.
SEGMENT_FRAMES = 72


@pytest.fixture(scope="module")
def teacher():
    torch.set_num_threads(1)
    voice = tiny_voice(0)
    return Variant("teacher", voice, "torch", "cpu", parameter_count(voice) / 1e6, state_dict_size_mb(voice))


def _context(voice, work_dir, sentences: int = 4) -> StageContext:
    texts = load_sentences(str(CALIBRATION_PAIRS))[:sentences]
    sequences = [u for text in texts for u in voice.text_to_utterances(text)]
    return StageContext(calibration_sequences=sequences, work_dir=work_dir, cpu_threads=1, cache_dir=work_dir,
                        family=FAMILY, voice="random")


def _speak(voice, emotion="开心"):
    request = SynthesisRequest.from_utterances(voice.text_to_utterances(SENTENCE),
                                               voice=VoiceCondition(emotion=emotion))
    return voice.synthesize(request)


def test_calibration_pairs_are_ours_and_cover_every_emotion():
    pairs = calibration_prompts()
    assert set(pairs.values()) == set(EMOTIONS)
    assert any(ord(c) > 0x4E00 for text in pairs for c in text) and any(text.isascii() for text in pairs)
    held_out = set(load_sentences("eval"))
    assert not held_out & set(pairs), "calibration text must never be evaluation text"
    assert prompt_for("我们终于在山顶看到了日出。") == "开心"
    assert prompt_for("A sentence of the training text.") == prompt_for("A sentence of the training text.")


def test_blocks_follow_the_generator_module_paths():
    assert QUANTIZATION.module_block("generator.resblocks.3.convs1.0") == "generator.resblocks.3"
    assert QUANTIZATION.module_block("am.decoder.encoders.1.feed_forward.w_1") == "am.decoder.encoders.1"
    assert QUANTIZATION.module_block("am.duration_predictor.conv.0.0") == "am.duration_predictor"
    assert QUANTIZATION.module_block("generator.conv_pre") == "generator.conv_pre"


def test_the_stage_settings_read_the_family_capabilities():
    raw = {"prune": {"ratio": 0.5, "importance": "magnitude", "parts": ["decoder"]},
           "int8_modelopt": {"parts": ["vocoder"]}, "distil": {"checkpoint": None, "train_steps": 1}}
    typed = stage_settings(("teacher", "pruned", "int8_modelopt", "lite"), raw, FAMILY)
    assert set(typed) == {"prune", "int8_modelopt", "distil"}
    with pytest.raises(ConfigError, match="quantizes only"):
        stage_settings(("teacher", "int8_modelopt"), {"int8_modelopt": {"parts": ["style_encoder"]}}, FAMILY)
    with pytest.raises(ConfigError, match="cannot prune"):
        stage_settings(("teacher", "pruned"), {"prune": {"ratio": 0.5, "importance": "magnitude",
                                                         "parts": ["encoder_ffn"]}}, FAMILY)
    with pytest.raises(ConfigError, match="unknown fields"):
        stage_settings(("teacher", "lite"), {"distil": {"checkpoint": None, "train_steps": 1,
                                                        "student": {"width": 8}}}, FAMILY)


def test_folded_and_rebuilt_vocoders_speak_as_the_teacher(teacher):
    vocoder = teacher.model.parts()["vocoder"]
    mel = torch.randn(1, 80, 20, generator=torch.Generator().manual_seed(0))  # (B, n_mels, T)
    with torch.no_grad():
        expected = vocoder(mel)
        plain = plain_vocoder(vocoder)
        rebuilt = build_vocoder(vocoder_config(plain))
        rebuilt.load_state_dict(plain.state_dict())
        assert torch.allclose(plain(mel), expected, atol=1e-5)
        assert torch.allclose(rebuilt(mel), expected, atol=1e-5)
        assert torch.equal(vocoder(mel), expected), "folding a copy must leave the teacher's weight norm"


def test_teacher_mels_have_the_frames_the_voice_speaks(teacher):
    voice = teacher.model
    dataset = teacher_mels(voice, [SENTENCE])
    result = _speak(voice, emotion=prompt_for(SENTENCE))
    (mel,) = dataset.latents
    assert mel.shape == (80, int(result.audio_lengths[0]) // voice.hop_length)
    with torch.no_grad():
        audio = dataset.teacher_decoder(mel[None])[0, 0]
    assert torch.allclose(audio, result.audio[0, : audio.shape[0]], atol=1e-4)


def test_pruning_halves_the_vocoder_and_keeps_the_durations(teacher, tmp_path):
    settings = PruneSettings(ratio=0.5, importance="taylor", parts=("decoder",), finetune_steps=2,
                             finetune_sentences=4, finetune_batch_size=2, segment_frames=SEGMENT_FRAMES)
    before = _speak(teacher.model)
    pruned = build_pruned(teacher, settings, _context(teacher.model, tmp_path))
    widths = FAMILY.prune.decoder.widths(pruned.model.parts()["vocoder"])
    assert widths["conv_pre"] == 16  # 32 channels, half removed
    assert pruned.stage_metrics["decoder_params_after"] < 0.5 * pruned.stage_metrics["decoder_params_before"]
    after = _speak(pruned.model)
    assert torch.equal(after.durations, before.durations) and torch.equal(after.audio_lengths, before.audio_lengths)
    assert torch.equal(_speak(teacher.model).audio, before.audio), "the teacher must stay as it was"
    again = build_pruned(teacher, settings, _context(teacher.model, tmp_path))  # resumed from the saved files
    assert torch.equal(_speak(again.model).audio, after.audio)


def test_pruning_refuses_a_width_it_cannot_touch():
    vocoder = tiny_voice(1).parts()["vocoder"]
    pruned = prune_vocoder(vocoder, 80, 0.5, "magnitude")
    assert pruned.conv_pre.in_channels == 80 and pruned.conv_post.out_channels == 1


def test_lite_student_trains_here_and_reloads(teacher, tmp_path):
    settings = DistilSettings(checkpoint=None, student={"upsample_initial_channel": 16}, train_steps=2, lr=1e-3,
                              warmup_steps=1, batch_size=2, segment_frames=SEGMENT_FRAMES, training_sentences=4)
    settings.check_family(FAMILY)
    before = _speak(teacher.model)
    lite = build_lite(teacher, settings, _context(teacher.model, tmp_path))
    assert lite.stage_metrics["vocoder_params_after"] < 0.5 * lite.stage_metrics["vocoder_params_before"]
    assert lite.stage_metrics["distil_steps"] == 2
    after = _speak(lite.model)
    assert torch.equal(after.durations, before.durations) and after.audio.shape == before.audio.shape
    reloaded = build_lite(teacher, settings, _context(teacher.model, tmp_path))  # the saved student, not retrained
    assert "distil_steps" not in reloaded.stage_metrics
    assert torch.equal(_speak(reloaded.model).audio, after.audio)


def test_lite_config_names_bad_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        LiteVocoderConfig.from_dict({"channels": 64})
    with pytest.raises(ValueError, match="3 dilations"):
        LiteVocoderConfig.from_dict({"resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3]]})


def test_int8_quantizes_vocoder_blocks_calibrated_on_emotion_prompts(teacher, tmp_path):
    pytest.importorskip("modelopt")
    settings = Int8ModeloptSettings(parts=("vocoder",), calibration_sentences=2, sensitivity_sentences=1,
                                    sensitivity_blocks=("generator.conv_pre", "generator.resblocks.0"),
                                    max_block_mcd_db=100.0, export_qdq=True)
    before = _speak(teacher.model)
    int8 = build_int8(teacher, settings, _context(teacher.model, tmp_path))
    assert int8.stage_metrics["int8_block_count"] == 2
    assert set(int8.stage_tags["fp32_blocks"].split(",")) >= {"generator.conv_post", "generator.ups.0"}
    assert int8.stage_metrics["qdq_quantize_linear_nodes"] > 0 and int8.artifacts["qdq_decoder_onnx"].is_file()
    after = _speak(int8.model)
    assert torch.equal(after.durations, before.durations)
    assert not torch.equal(after.audio, before.audio)  # int8 weights and activations change the waveform
    assert torch.equal(_speak(teacher.model).audio, before.audio), "the teacher must stay as it was"


def test_dynamic_int8_style_encoder_empties_the_prompt_cache(teacher, tmp_path):
    before = _speak(teacher.model)
    variant = build_dynamic(teacher, Int8DynamicSettings(parts=("style_encoder",)), _context(teacher.model, tmp_path))
    assert variant.stage_metrics["style_encoder_int8_weight_fraction"] > 0.5
    prompts = variant.model.prompts
    calls = prompts.calls
    after = _speak(variant.model)
    assert prompts.calls > calls, "embeddings the float32 encoder cached must not be reused"
    assert after.audio.shape[0] == 1 and torch.equal(_speak(teacher.model).audio, before.audio)
