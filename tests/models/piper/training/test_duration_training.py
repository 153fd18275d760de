"""The noise-affine duration student: built from the teacher's trunk, fitted to the teacher's
durations on the same noise, saved and loaded, and a drop-in part of the synthesizer (tiny weights)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from models.piper.duration_student import (NoiseAffineDurationPredictor, duration_student_card,
                                           load_duration_student, save_duration_student)
from models.piper.tiny import tiny_vits
from models.piper.training.duration_training import duration_agreement, text_encodings, train_duration_student


def _sequences(count: int, num_symbols: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 30, (count,), generator=generator).tolist()
    return [torch.randint(1, num_symbols, (length,), generator=generator).tolist() for length in lengths]


@pytest.fixture(autouse=True)
def one_thread():
    """Hundreds of small steps: with two pytest workers on two cores, a second intra-op thread per
    worker only spin-waits (measured: 227 s with torch's default threads, 20 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def teacher():
    vits = tiny_vits(seed=3)
    # Random affine parameters, so that the teacher's durations are not centred on one frame.
    with torch.no_grad():
        vits.dp.affine.m.normal_(0, 0.5)
        vits.dp.affine.logs.normal_(0, 0.3)
    return vits


def test_the_student_starts_from_the_teachers_trunk_and_predicts_one_frame(teacher):
    student = NoiseAffineDurationPredictor.from_teacher(teacher.hp, teacher.dp)
    teacher_state = teacher.dp.state_dict()
    for name, tensor in student.state_dict().items():
        if not name.startswith("head."):
            torch.testing.assert_close(tensor, teacher_state[name], rtol=0, atol=0)
    hidden = torch.randn(2, teacher.hp.hidden_channels, 7)
    mask = torch.ones(2, 1, 7)
    assert torch.count_nonzero(student(hidden, mask, torch.randn(2, 2, 7))) == 0  # log w = 0: one frame


def test_log_durations_are_affine_in_the_noise_and_masked(teacher):
    student = NoiseAffineDurationPredictor(teacher.hp)
    torch.nn.init.normal_(student.head.weight)
    hidden, noise = torch.randn(1, teacher.hp.hidden_channels, 9), torch.randn(1, 2, 9)
    mask = torch.ones(1, 1, 9)
    mask[..., 6:] = 0
    at_zero = student(hidden, mask, torch.zeros_like(noise))
    slope = student(hidden, mask, noise) - at_zero
    torch.testing.assert_close(student(hidden, mask, 2.5 * noise) - at_zero, 2.5 * slope, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(student(hidden, mask, noise)[..., 6:]) == 0


def test_distillation_brings_the_students_durations_to_the_teachers(teacher):
    training = _sequences(64, teacher.hp.num_symbols, seed=1)
    held_out = text_encodings(teacher, _sequences(16, teacher.hp.num_symbols, seed=2), batch_size=1)
    untrained = NoiseAffineDurationPredictor.from_teacher(teacher.hp, teacher.dp).eval()
    before = duration_agreement(teacher, untrained, held_out, noise_scale_w=0.8)
    student, summary = train_duration_student(teacher, training, steps=300, batch_size=16, lr=3e-3, log_every=0)
    after = duration_agreement(teacher, student, held_out, noise_scale_w=0.8)
    redrawn = duration_agreement(teacher, teacher.dp, held_out, 0.8, student_seed_offset=1000)
    # Measured (1 thread): training MSE 1.34 -> 0.053; log-duration MAE 1.11 -> 0.20 (the teacher
    # against itself on other noise: 0.87); equal frame counts 0.887 -> 0.935; length ratio 0.886 -> 1.040.
    assert summary["mse_tail_mean"] < 0.1 * summary["mse_first"]
    assert after["log_duration_mae"] < 0.3 * before["log_duration_mae"]
    assert after["log_duration_mae"] < 0.5 * redrawn["log_duration_mae"]
    assert after["frames_equal"] > before["frames_equal"]
    assert abs(after["length_ratio_mean"] - 1) < 0.08
    assert duration_agreement(teacher, teacher.dp, held_out, 0.8)["log_duration_mae"] == 0


def test_text_encodings_do_not_depend_on_the_batch_they_were_padded_in(teacher):
    sequences = _sequences(5, teacher.hp.num_symbols, seed=4)
    batched = text_encodings(teacher, sequences, batch_size=5)
    for sequence, encoding in zip(sequences, batched):
        alone = text_encodings(teacher, [sequence], batch_size=1)[0]
        assert encoding.shape == (teacher.hp.hidden_channels, len(sequence))
        torch.testing.assert_close(encoding, alone, rtol=1e-4, atol=1e-5)


def test_the_student_replaces_the_synthesizers_duration_part(teacher, tmp_path):
    student, _ = train_duration_student(teacher, _sequences(32, teacher.hp.num_symbols), steps=20, log_every=0)
    path = tmp_path / "duration.safetensors"
    save_duration_student(student, path, {"note": "tiny"})
    loaded = load_duration_student(teacher.hp, path)
    assert duration_student_card(path) == {"note": "tiny"}
    synthesizer = tiny_vits(seed=3)
    synthesizer.load_state_dict(teacher.state_dict())
    synthesizer.replace_part("duration", loaded)
    ids = torch.tensor([_sequences(1, teacher.hp.num_symbols, seed=5)[0]])
    lengths = torch.tensor([ids.shape[1]])
    duration_noise, prior_noise = torch.randn(1, 2, ids.shape[1]), torch.randn(1, teacher.hp.latent_channels, 2000)
    audio, audio_lengths, durations = synthesizer(ids, lengths, duration_noise, prior_noise)
    hidden, _, _, mask = teacher.enc_p(ids, lengths)
    expected = torch.ceil(torch.exp(student(hidden, mask, duration_noise * 0.8)))[:, 0]
    torch.testing.assert_close(durations.float(), expected)
    assert int(audio_lengths[0]) == int(expected.sum()) * teacher.hp.hop_length


def test_refuses_files_that_are_not_a_duration_student(teacher, tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(path), metadata={"kind": "something_else"})
    with pytest.raises(ValueError, match="expected 'noise_affine_duration_predictor'"):
        load_duration_student(teacher.hp, path)


def test_training_refuses_zero_steps_and_no_data(teacher):
    with pytest.raises(ValueError, match="steps >= 1"):
        train_duration_student(teacher, [[1, 2]], steps=0)
    with pytest.raises(ValueError, match="training sequences"):
        train_duration_student(teacher, [], steps=5)


def test_a_multi_speaker_student_is_conditioned_on_the_speaker():
    teacher = tiny_vits(num_speakers=2, seed=5)
    student = NoiseAffineDurationPredictor.from_teacher(teacher.hp, teacher.dp)
    torch.testing.assert_close(student.cond.weight, teacher.dp.cond.weight, rtol=0, atol=0)
    torch.nn.init.normal_(student.head.weight)
    hidden, mask, noise = torch.randn(1, teacher.hp.hidden_channels, 6), torch.ones(1, 1, 6), torch.zeros(1, 2, 6)
    speakers = teacher.emb_g(torch.tensor([0, 1])).unsqueeze(-1)  # (2, C_g, 1)
    first, second = (student(hidden, mask, noise, speakers[i : i + 1]) for i in range(2))
    assert not torch.allclose(first, second)
    trained, summary = train_duration_student(teacher, _sequences(16, teacher.hp.num_symbols), steps=5, log_every=0)
    assert summary["steps"] == 5 and trained.cond is not None
