"""The Lite student: its inverse-STFT head, its parts, the committed checkpoint, training and the stages."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from compress.distil import REPO_ROOT
from core.config import ConfigError
from compress.run_config import settings_from_config
from evaluate.mcd import mel_cepstral_distortion
from evaluate.speaker import speaker_similarity
from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from models.piper.training.lite_training import TeacherTargets, save_student, train_lite, write_eval_audio
from models.piper.lite import InverseStftHead, LiteStudent, LiteStudentConfig, build_lite_parts, load_student
from models.piper.vits import VitsHyperParams
from models.training.discriminators import AdversarialSettings
from models.piper.voice import PiperVoice

pytestmark = pytest.mark.slow  # loads the real voice

CHECKPOINT = REPO_ROOT / "models" / "checkpoints" / "lite_joe_medium.safetensors"
SENTENCE = "A quiet river ran past the old mill before dawn."


@pytest.fixture(scope="module")
def teacher():
    torch.set_num_threads(1)
    return PiperVoice.load("bundled:joe")


def test_inverse_stft_head_inverts_torch_stft():
    n_fft, hop = 16, 4
    waveform = torch.randn(2, 4000, generator=torch.Generator().manual_seed(0))
    spectrum = torch.stft(waveform, n_fft, hop, n_fft, torch.hann_window(n_fft), center=True, return_complex=True)
    # The head takes log-magnitude and phase logits p with phase = pi * sin(p).
    logits = torch.cat([torch.log(spectrum.abs().clamp_min(1e-12)),
                        torch.asin((torch.angle(spectrum) / math.pi).clamp(-1, 1))], dim=1)
    audio = InverseStftHead(n_fft, hop)(logits)[:, 0]
    assert audio.shape == (2, spectrum.shape[-1] * hop)
    # Away from the edges (where the squared windows do not yet overlap-add to a constant) it is exact.
    assert (audio[:, n_fft:3980] - waveform[:, n_fft:3980]).abs().max() < 1e-5


def test_untrained_flow_is_the_identity_and_hop_must_match():
    hp = VitsHyperParams(num_symbols=64)
    parts = build_lite_parts(hp, LiteStudentConfig())
    z = torch.randn(2, hp.latent_channels, 40)
    mask = torch.ones(2, 1, 40)
    assert torch.equal(parts["flow"].reverse(z, mask), z)  # zero output projections, an even number of flips
    assert parts["decoder"](z).shape == (2, 1, 40 * hp.hop_length)
    with pytest.raises(ValueError, match="hop"):
        build_lite_parts(hp, LiteStudentConfig(upsample_rates=(8, 4)))
    with pytest.raises(ValueError, match="unknown keys"):
        LiteStudentConfig.from_dict({"decoder_channels": 3})


def test_committed_checkpoint_keeps_durations_and_speaker(teacher):
    parts, config = load_student(teacher.model.hp, CHECKPOINT)
    assert config == LiteStudentConfig()  # the committed shapes are the defaults
    lite = copy.deepcopy(teacher)
    for role in ("flow", "decoder"):
        lite.replace_part(role, parts[role])
    request = SynthesisRequest.from_utterances(teacher.text_to_utterances(SENTENCE), sampling=VitsSampling(seed=3))
    expected, got = teacher.synthesize(request), lite.synthesize(request)
    # The encoder and duration predictor are the teacher's: same durations, same length.
    assert torch.equal(expected.durations, got.durations)
    assert torch.equal(expected.audio_lengths, got.audio_lengths)
    teacher_audio, lite_audio = expected.waveforms()[0], got.waveforms()[0]
    # Measured on this sentence: MCD 1.0 dB, speaker similarity 0.97 (12 eval sentences: 1.12 / 0.968).
    assert mel_cepstral_distortion(lite_audio, teacher_audio, 22050) < 1.6
    assert speaker_similarity(lite_audio, teacher_audio, 22050) > 0.93


@pytest.mark.parametrize("prefetch", [False, True], ids=["in_line", "prefetched"])
def test_training_resumes_where_it_stopped(teacher, tmp_path, prefetch):
    """Two chunks with the adversarial terms on end where one uninterrupted run ends, bit for bit,
    with the teacher's batches made in line or on the worker thread that CUDA runs use."""
    phoneme_ids = [s.phoneme_ids for s in teacher.text_to_utterances(SENTENCE + " The mill wheel turned slowly.")]
    targets = TeacherTargets(teacher.model, phoneme_ids, batch_size=2, segment_frames=8, seed=1, device="cpu")
    first, again = targets.batch(5), targets.batch(5)
    assert torch.equal(first["audio"], again["audio"])  # a batch is a function of (seed, step)
    config = LiteStudentConfig(decoder_initial_channels=32, flow_hidden_channels=16, flow_wn_layers=1)
    gan = AdversarialSettings(discriminator_warmup_steps=1)  # steps 0: discriminator alone; 1, 2: both

    def fresh_student() -> LiteStudent:
        torch.manual_seed(0)
        return LiteStudent(*build_lite_parts(teacher.model.hp, config).values())

    def train(student, directory, **limits):
        torch.manual_seed(1)  # the discriminator's initial weights
        return train_lite(student, targets, steps=3, lr=1e-3, checkpoint_dir=directory, sample_rate_hz=22050,
                          log_every=0, adversarial=gan, prefetch=prefetch, **limits)

    uninterrupted = fresh_student()
    train(uninterrupted, tmp_path / "whole")
    chunked = fresh_student()
    summary = train(chunked, tmp_path / "chunks", max_steps_this_call=2)
    assert (summary["step"], summary["done"]) == (2, False)
    assert len(list((tmp_path / "chunks").glob("state-*.safetensors"))) >= 1
    resumed = fresh_student()  # weights from the state, not from here
    summary = train(resumed, tmp_path / "chunks")
    assert (summary["start_step"], summary["step"], summary["done"]) == (2, 3, True)
    assert "adv_tail_mean" in summary and "disc_tail_mean" in summary
    for name, value in uninterrupted.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    save_student(resumed, config, tmp_path / "lite.safetensors", {"steps": 3})
    loaded, loaded_config = load_student(teacher.model.hp, tmp_path / "lite.safetensors")
    assert loaded_config == config
    for name, value in loaded["decoder"].state_dict().items():
        assert torch.equal(value, resumed.decoder.state_dict()[name])


def test_eval_audio_pairs_teacher_and_student(teacher, tmp_path):
    """Same noise, same durations: the pair's lengths match, and a student equal to the teacher's parts
    gives the teacher's audio."""
    ids = [s.phoneme_ids for s in teacher.text_to_utterances(SENTENCE)]
    model = teacher.model
    same_as_teacher = LiteStudent(copy.deepcopy(model.parts()["flow"]), copy.deepcopy(model.parts()["decoder"]))
    write_eval_audio(tmp_path / "eval.npz", model, same_as_teacher, ids, step=7, sample_rate_hz=22050)
    with np.load(tmp_path / "eval.npz", allow_pickle=False) as files:
        assert int(files["step"]) == 7 and files["teacher_000"].dtype == np.int16
        assert len(files["teacher_000"]) > 22050 * 0.5
        np.testing.assert_array_equal(files["teacher_000"], files["student_000"])


@pytest.mark.parametrize("overrides, message", [
    (["stages.distil.checkpoint=null"], "none to train \\(train_steps is 0\\)"),
    (["stages.distil.checkpoint=models/checkpoints/missing.safetensors"], "no such file"),
    (["+stages.distil.student.decoder_channels=8"], "unknown keys"),
    (["stages.distil.lr=0"], "lr > 0"),
    (["variants=[teacher,lite_ort]"], "built from 'lite'"),
    (["export.enabled=false"], "export.enabled=true"),
])
def test_bad_distil_config_stops_at_start(debug_config, overrides, message):
    lite_int8 = ["variants=[original_onnx,teacher,lite,lite_ort,lite_int8]", "export.enabled=true"]
    with pytest.raises(ConfigError, match=message):
        settings_from_config(debug_config(*lite_int8, *overrides))


@pytest.mark.parametrize("overrides, message", [
    (["stages.prune_lite.ratio=1.5"], r"stages\.prune_lite \(variant 'lite_slim'\): prune\.ratio=1\.5"),
    (["stages.prune_lite.parts=[flow]"], r"stages\.prune_lite .*unknown \['flow'\]"),
    (["variants=[teacher,lite_slim]"], "built from 'lite'"),
])
def test_bad_lite_slim_config_stops_at_start(debug_config, overrides, message):
    lite_slim = ["variants=[teacher,lite,lite_slim,lite_slim_ort]", "export.enabled=true"]
    with pytest.raises(ConfigError, match=message):
        settings_from_config(debug_config(*lite_slim, *overrides))


def test_lite_stages_in_the_pipeline(debug_config, teacher):
    """teacher -> lite (committed checkpoint) -> exported graph in onnxruntime -> INT8, and lite ->
    lite_slim (its encoder's feed-forward layers pruned) -> its graph in onnxruntime, one debug run."""
    from compress.pipeline import run

    # Scored on MCD alone, the one quality figure asserted, and timed once, not re-timed in rounds:
    # DNSMOS, speaker similarity and the interleaved speed rounds took a tenth of this run and no
    # assertion reads them; every variant stays eligible, so the champion is still deployed.
    resolved = debug_config("variants=[teacher,lite,lite_ort,lite_int8,lite_slim,lite_slim_ort]",
                            "export.enabled=true", "data.max_eval_sentences=1", "export.parity_sentences=1",
                            "evaluate.metrics=[mcd]", "evaluate.speed_rounds=0", "selection.constraints=[]")
    rows = run(settings_from_config(resolved), resolved)
    assert list(rows) == ["teacher", "lite", "lite_ort", "lite_int8", "lite_slim", "lite_slim_ort"]
    # The exported Lite graph matches PyTorch (fp32 budget: 1e-4 of the peak, same durations) ...
    assert rows["lite"]["parity_within_budget"] == 1.0
    assert rows["lite"]["parity_durations_equal_fraction"] == 1.0
    # ... and runs in onnxruntime with the teacher's durations, so its audio is the Lite audio.
    assert abs(rows["lite_ort"]["mcd_db"] - rows["lite"]["mcd_db"]) < 0.05
    assert rows["lite"]["flow_params_after"] < rows["lite"]["flow_params_before"] / 5
    assert rows["lite_int8"]["quantized_nodes"] > 0
    assert Path(resolved["paths"]["output_dir"], "graphs", "piper", "lite", "lite.simplified.onnx").is_file()
    # lite_slim: the student's encoder lost a quarter of its feed-forward channels (the debug ratio),
    # nothing else; its graph exports within the fp32 budget and onnxruntime speaks as PyTorch.
    slim = rows["lite_slim"]
    assert slim["encoder_params_after"] < slim["encoder_params_before"]
    hp = teacher.model.hp  # per layer, two feed-forward convs hidden <-> filter channels (biases aside)
    encoder_ffn = hp.n_layers * 2 * hp.encoder_kernel_size * hp.hidden_channels * hp.filter_channels
    assert slim["encoder_params_before"] - slim["encoder_params_after"] >= 0.25 * encoder_ffn * 0.95
    assert slim["params_m"] < rows["lite"]["params_m"]
    assert slim["parity_within_budget"] == 1.0
    assert abs(rows["lite_slim_ort"]["mcd_db"] - slim["mcd_db"]) < 0.05
    assert Path(resolved["paths"]["output_dir"], "graphs", "piper", "lite_slim", "lite_slim.simplified.onnx").is_file()
