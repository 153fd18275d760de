"""Decoder pruning: the right channels go, the voice still speaks with the teacher's timing,
and the saved decoder comes back identical.

    python -m pytest -q tests/compress/test_prune.py
"""
from __future__ import annotations

import copy

import pytest
import torch

from compress.prune import PruneSettings, build
from core.config import ConfigError
from compress.variants import StageContext, Variant
from models.registry import get_family
from evaluate.memory import parameter_count, state_dict_size_mb
from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from models.piper.training.decoder_student import load_decoder, teacher_latents
from models.piper.training.pruning import prune_decoder
from models.piper.voice import PiperVoice
from models.training.decoder_training import SegmentSampler
from texts import load_sentences

pytestmark = pytest.mark.slow  # loads the real voice

# Written for this test; in no sentence set (eval, calibration, training text, Harvard).
HELD_OUT_LINE = "Marguerite folded the old map twice before the ferry left."
NOISE = VitsSampling(noise_scale=0.667, length_scale=1.0, noise_scale_w=0.8, seed=7)
TINY = dict(ratio=0.25, importance="magnitude", parts=["decoder"], finetune_steps=1, finetune_lr=1e-5,
            finetune_sentences=2, finetune_batch_size=2, segment_frames=16)


@pytest.fixture(scope="module")
def teacher() -> Variant:
    voice = PiperVoice.load("bundled:joe")
    return Variant("teacher", voice, "torch", "cpu", parameter_count(voice) / 1e6, state_dict_size_mb(voice))


@pytest.fixture(scope="module")
def calibration_sequences(teacher) -> list:
    return [teacher.model.text_to_utterances(text)[0] for text in load_sentences("calibration")[:2]]


def context(work_dir, calibration_sequences) -> StageContext:
    return StageContext(calibration_sequences=calibration_sequences, work_dir=work_dir, cpu_threads=1,
                        cache_dir=work_dir / "cache", family=get_family("piper"), voice="bundled:joe")


def synthesize(voice: PiperVoice, text: str):
    return voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances(text), sampling=NOISE))


@pytest.fixture(scope="module")
def pruned(teacher, calibration_sequences, tmp_path_factory) -> tuple[Variant, object]:
    work_dir = tmp_path_factory.mktemp("prune")
    return build(teacher, PruneSettings(**TINY), context(work_dir, calibration_sequences)), work_dir


def test_quarter_of_the_channels_go_and_the_edges_stay(teacher, pruned):
    variant, _ = pruned
    before = teacher.model.parts()["decoder"]
    after = variant.model.parts()["decoder"]
    # Every convolution keeps 3/4 of its inputs and of its outputs, except the latent inputs of
    # conv_pre and the waveform output of conv_post: the expected share of weights, layer by layer.
    kept = sum(layer.weight.numel() * (1.0 if name == "conv_pre" else 0.75) * (1.0 if name == "conv_post" else 0.75)
               for name, layer in before.named_modules() if isinstance(layer, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)))
    expected = kept / sum(p.numel() for name, p in before.named_parameters() if name.endswith("weight"))
    assert parameter_count(after) / parameter_count(before) == pytest.approx(expected, rel=0.01)  # about 0.60
    assert after.conv_pre.in_channels == before.conv_pre.in_channels  # the latent input
    assert after.conv_post.out_channels == 1  # the waveform
    assert [up.out_channels for up in after.ups] == [96, 48, 24]  # 128, 64, 32 less a quarter
    assert variant.stage_metrics["decoder_params_after"] < variant.stage_metrics["decoder_params_before"]
    assert variant.stage_metrics["decoder_size_mb_after"] < variant.stage_metrics["decoder_size_mb_before"]
    assert variant.stage_metrics["decoder_ms_b1_after"] > 0
    assert variant.stage_metrics["calib_mrstft_after_prune"] > 0  # pruning costs something until fine-tuned
    assert variant.stage_metrics["decoder_finetune_step"] == 1 and "calib_mrstft_after_finetune" in variant.stage_metrics
    assert teacher.model.parts()["decoder"] is before and parameter_count(before) == 1662976  # teacher untouched


def test_pruned_voice_keeps_the_teacher_timing(teacher, pruned):
    variant, _ = pruned
    ours, reference = synthesize(variant.model, HELD_OUT_LINE), synthesize(teacher.model, HELD_OUT_LINE)
    assert torch.equal(ours.durations, reference.durations)
    assert torch.equal(ours.audio_lengths, reference.audio_lengths)
    assert ours.audio.shape == reference.audio.shape
    assert torch.isfinite(ours.audio).all() and ours.audio.abs().max() > 0.01


def test_pruned_decoder_runs_on_new_lengths_and_batches(pruned):
    decoder = pruned[0].model.parts()["decoder"]
    with torch.inference_mode():
        for batch, frames in [(1, 7), (3, 41)]:
            assert decoder(torch.randn(batch, 192, frames)).shape == (batch, 1, frames * 256)


def test_saved_decoder_rebuilds_and_resumes_identically(teacher, calibration_sequences, pruned):
    variant, work_dir = pruned
    rebuilt = load_decoder(variant.artifacts["decoder_weights"], variant.artifacts["decoder_config"])
    latent = torch.randn(2, 192, 23, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(rebuilt(latent), variant.model.parts()["decoder"](latent))
    resumed = build(teacher, PruneSettings(**TINY), context(work_dir, calibration_sequences))
    assert torch.equal(synthesize(resumed.model, HELD_OUT_LINE).audio, synthesize(variant.model, HELD_OUT_LINE).audio)
    with pytest.raises(ValueError, match="holds a pruning run with settings"):
        build(teacher, PruneSettings(**(TINY | {"ratio": 0.5})), context(work_dir, calibration_sequences))


def test_taylor_importance_prunes_to_the_same_widths(teacher, calibration_sequences, tmp_path):
    dataset = teacher_latents(teacher.model, calibration_sequences)
    decoder = prune_decoder(copy.deepcopy(teacher.model.parts()["decoder"]), 192, 0.25, "taylor",
                            SegmentSampler(dataset, 2, 16, seed=0))
    assert [up.out_channels for up in decoder.ups] == [96, 48, 24]
    assert all(p.grad is None for p in decoder.parameters())


def test_encoder_feed_forward_pruning(teacher, calibration_sequences, tmp_path):
    settings = PruneSettings(**(TINY | {"parts": ["encoder_ffn"], "importance": "taylor"}))
    variant = build(teacher, settings, context(tmp_path, calibration_sequences))
    encoder = variant.model.parts()["encoder"]
    assert [ffn.conv_1.out_channels for ffn in encoder.encoder.ffn_layers] == [576] * 6  # 768 less a quarter
    assert all(ffn.conv_2.out_channels == 192 for ffn in encoder.encoder.ffn_layers)  # the hidden width stays
    assert variant.model.parts()["decoder"] is not teacher.model.parts()["decoder"]  # a copy, unpruned
    assert variant.stage_metrics["encoder_params_after"] < 0.8 * variant.stage_metrics["encoder_params_before"]
    result = synthesize(variant.model, HELD_OUT_LINE)
    assert torch.isfinite(result.audio).all() and result.audio.abs().max() > 0.01
    resumed = build(teacher, settings, context(tmp_path, calibration_sequences))  # rebuilt from the saved files
    assert torch.equal(synthesize(resumed.model, HELD_OUT_LINE).audio, result.audio)


@pytest.mark.parametrize("field, value", [("ratio", 0.0), ("ratio", 1.0), ("ratio", 1.5), ("importance", "random"),
                                          ("parts", ["flow"]), ("finetune_steps", -1)])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"prune.{field}"):
        PruneSettings(**(TINY | {field: value}))
    assert issubclass(ConfigError, ValueError)
