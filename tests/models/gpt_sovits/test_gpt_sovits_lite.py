"""The Lite GPT-SoVITS transformer on tiny random weights: which teacher layers it starts from, the
teacher-forced pass that reproduces every decode step, a distillation that lowers the loss and
resumes from its checkpoint, and the pipeline's hooks (train, save, load, speak)."""
from __future__ import annotations

import pytest
import torch

from models.gpt_sovits.capabilities import GptSovitsSampling
from models.gpt_sovits.lite import (
    DISTIL_HOOKS,
    LiteT2SConfig,
    build_student,
    distillation_losses,
    load_student,
    save_student,
    sequence_logits,
    teacher_layers,
    teacher_targets,
    train_student,
    voice_inputs,
)
from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel
from models.gpt_sovits.tiny import tiny_voice
from models.interface import SynthesisRequest

SENTENCES = ("Where did Kenji leave his lantern?", "Thanks so much for the gifts!")


@pytest.fixture(scope="module")
def voice():
    torch.set_num_threads(1)
    return tiny_voice(0)


@pytest.fixture(scope="module")
def inputs(voice):
    return voice_inputs(voice, [u.phoneme_ids for text in SENTENCES for u in voice.text_to_utterances(text)])


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(1)
    return Text2SemanticModel(T2SConfig(vocab_size=1025, phoneme_vocab_size=732, hidden_dim=32, num_heads=4, num_layers=4,
                                        eos_id=1024)).eval()


def test_student_layers_are_evenly_spaced_teacher_layers():
    assert teacher_layers(24, 6) == [0, 5, 9, 14, 18, 23]
    assert teacher_layers(4, 2) == [0, 3]
    assert teacher_layers(4, 1) == [3]
    with pytest.raises(ValueError, match="5 layers from a teacher of 4"):
        teacher_layers(4, 5)


def test_the_student_starts_from_the_teacher_weights(teacher):
    student = build_student(teacher, LiteT2SConfig(layers=2))
    assert student.config.layers == 2 and len(student.h.layers) == 2
    for student_index, teacher_index in enumerate([0, 3]):
        for name, value in student.h.layers[student_index].state_dict().items():
            assert torch.equal(value, teacher.h.layers[teacher_index].state_dict()[name]), name
    assert torch.equal(student.ar_predict_layer.weight, teacher.ar_predict_layer.weight)
    assert torch.equal(student.bert_proj.weight, teacher.bert_proj.weight)


@pytest.mark.parametrize("fields, message", [({"layers": 0}, "layers=0"), ({"width": 3}, "unknown \\['width'\\]")])
def test_bad_student_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        DISTIL_HOOKS.check_student_config(fields)


def test_the_teacher_forced_pass_gives_every_decode_step(voice, inputs):
    targets = teacher_targets(voice.t2s, inputs, tokens_per_sequence=20)
    for target in targets:
        assert target.tokens.shape[0] == target.logits.shape[0] and target.tokens.shape[0] > 0
        with torch.no_grad():
            logits = sequence_logits(voice.t2s, target.source, target.tokens)
        torch.testing.assert_close(logits, target.logits, atol=2e-4, rtol=1e-4)


def test_a_student_with_every_teacher_layer_matches_it_exactly(voice, inputs):
    same = build_student(voice.t2s, LiteT2SConfig(layers=voice.t2s.config.layers))
    target = teacher_targets(voice.t2s, inputs[:1], tokens_per_sequence=20)[0]
    with torch.no_grad():
        losses = distillation_losses(same, target)
    assert float(losses["kl"]) < 1e-6
    # The teacher chose its tokens from penalised logits (repetition penalty, no EOS in the first
    # steps): the raw argmax agrees with them as often for the student as for the teacher itself.
    raw_agreement = (target.logits.argmax(dim=-1) == target.tokens).float().mean()
    assert float(losses["token_accuracy"]) == pytest.approx(float(raw_agreement))


def test_distillation_lowers_the_loss_and_resumes_from_its_checkpoint(voice, inputs, tmp_path):
    targets = teacher_targets(voice.t2s, inputs, tokens_per_sequence=20)
    student = build_student(voice.t2s, LiteT2SConfig(layers=1))
    with torch.no_grad():
        before = sum(float(distillation_losses(student, t)["kl"]) for t in targets)
    checkpoint = tmp_path / "lite_ckpt.pt"
    summary = train_student(student, targets, steps=30, lr=3e-3, checkpoint_path=checkpoint, batch_size=2)
    assert summary["step"] == 30 and checkpoint.is_file()
    with torch.no_grad():
        after = sum(float(distillation_losses(student, t)["kl"]) for t in targets)
    assert after < 0.5 * before, (before, after)
    resumed = build_student(voice.t2s, LiteT2SConfig(layers=1))
    assert train_student(resumed, targets, steps=30, lr=3e-3, checkpoint_path=checkpoint)["step"] == 30
    for name, value in resumed.state_dict().items():  # nothing left to train: the checkpoint's weights
        assert torch.equal(value, student.state_dict()[name]), name
    path = tmp_path / "student.safetensors"
    save_student(student, LiteT2SConfig(layers=1), path, {"steps": 30})
    loaded, config = load_student(voice.t2s.config, path)
    assert config == LiteT2SConfig(layers=1)
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_the_pipeline_hooks_train_load_and_the_lite_voice_speaks(voice, tmp_path):
    ids = [u.phoneme_ids for u in voice.text_to_utterances(SENTENCES[0])]
    weights = tmp_path / "lite_student.safetensors"
    summary = DISTIL_HOOKS.train_student(
        voice, ids, {"layers": 1}, tmp_path / "lite_ckpt.pt", weights, {"machine": "test"}, steps=2, lr=1e-3,
        warmup_steps=1, final_lr_fraction=0.05, batch_size=1, segment_frames=12, latent_weight=1.0, seed=0)
    assert summary["step"] == 2 and weights.is_file()
    assert (tmp_path / "lite_teacher_targets.safetensors").is_file()  # kept for a resumed run
    parts, config = DISTIL_HOOKS.load_student(voice, weights)
    assert config == {"layers": 1} and parts["t2s"].config.layers == 1
    import copy

    lite = copy.deepcopy(voice)
    lite.replace_part("t2s", parts["t2s"])
    result = lite.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances(SENTENCES[1]),
                                                              sampling=GptSovitsSampling.deterministic(max_tokens=15)))
    assert result.audio.shape[0] == 1 and result.audio_lengths[0] > 0
    assert torch.isfinite(result.audio).all()


def test_a_copied_voice_shares_its_encoders_and_owns_its_parts(voice):
    """Every pipeline variant is a copy of the teacher: HuBERT and BERT (1.7 GB at full size) are no
    parts, so the copies share them; the parts a stage changes are the copy's own."""
    import copy

    copied = copy.deepcopy(voice)
    assert copied.hubert is voice.hubert and copied.bert is voice.bert
    assert copied.t2s is not voice.t2s and copied.sovits is not voice.sovits
    with torch.no_grad():
        copied.t2s.ar_predict_layer.weight.zero_()
    assert voice.t2s.ar_predict_layer.weight.abs().sum() > 0


def test_a_gpu_bundle_trains_through_the_command_line(voice, tmp_path):
    """What ``python -m compress.distil prepare`` writes, trained by the command the GPU machine runs."""
    from models.gpt_sovits.lite import main

    ids = [u.phoneme_ids for u in voice.text_to_utterances(SENTENCES[1])]
    DISTIL_HOOKS.write_bundle(voice, ids, tmp_path / "bundle", {"voice": "tiny"})
    export = tmp_path / "out" / "lite_student.safetensors"
    main(["--bundle", str(tmp_path / "bundle"), "--checkpoint", str(tmp_path / "out" / "lite_ckpt.pt"),
          "--export", str(export), "--steps", "2", "--batch-size", "1", "--tokens-per-sequence", "10",
          "--layers", "1"])
    student, config = load_student(voice.t2s.config, export)
    assert config == LiteT2SConfig(layers=1) and len(student.h.layers) == 1
