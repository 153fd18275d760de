"""Teacher-forced decoder training of a Piper student decoder: teacher batches, the cached dataset,
resumable training, the CLI.

    python -m pytest -q tests/models/piper/test_decoder_student.py
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from models.piper.training.decoder_student import (
    build_decoder, decoder_config, load_latent_dataset, main, teacher_latent_batches, teacher_latents,
)
from models.training.decoder_training import SegmentSampler, train_decoder
from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from models.piper.voice import PiperVoice
from tests.conftest import REPO_ROOT
from texts.training_text import generate_training_sentences

pytestmark = pytest.mark.slow  # loads the real voice

SEGMENT_FRAMES = 16


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return PiperVoice.load("bundled:joe")


@pytest.fixture(scope="module")
def batches(voice) -> SegmentSampler:
    return teacher_latent_batches(voice, generate_training_sentences(2, seed=0), batch_size=2,
                                  segment_frames=SEGMENT_FRAMES, seed=0)


def tiny_student_config(voice: PiperVoice) -> dict:
    """The teacher's decoder layout at an eighth of its width: a student that trains in milliseconds."""
    hp = dataclasses.replace(voice.model.hp, upsample_initial_channel=32)
    return decoder_config(build_decoder({"kind": "piper_hifigan", "hyperparams": dataclasses.asdict(hp)}), hp)


def test_batches_are_aligned_teacher_segments(voice, batches):
    z, audio = batches.batch(0)
    assert z.shape == (2, 192, SEGMENT_FRAMES) and audio.shape == (2, SEGMENT_FRAMES * 256)
    with torch.inference_mode():
        assert torch.allclose(audio, voice.parts()["decoder"](z)[:, 0])  # the teacher's audio for exactly this z
    again_z, again_audio = batches.batch(0)
    assert torch.equal(z, again_z) and torch.equal(audio, again_audio)  # a batch depends only on (seed, step)
    assert not torch.equal(z, batches.batch(1)[0])
    first = next(iter(batches))
    assert torch.equal(first[0], z)


def test_latents_are_the_teacher_flow_output(voice):
    """Decoding a cached latent whole gives the teacher's own synthesis of that sentence, same noise."""
    sequence = voice.text_to_utterances(generate_training_sentences(1, seed=0)[0])[0]
    noise = VitsSampling(seed=5)
    dataset = teacher_latents(voice, [sequence], noise)
    with torch.inference_mode():
        audio = voice.parts()["decoder"](dataset.latents[0][None])[0, 0]
    reference = voice.synthesize(SynthesisRequest.from_utterances([sequence], sampling=noise)).audio[0]
    assert audio.shape == reference.shape
    assert torch.allclose(audio, reference, atol=1e-6)


def test_teacher_as_student_costs_nothing(voice, batches, tmp_path):
    student = build_decoder(decoder_config(voice.parts()["decoder"], voice.model.hp))
    student.load_state_dict(voice.parts()["decoder"].state_dict())
    summary = train_decoder(student, batches, steps=1, lr=1e-4, checkpoint_path=tmp_path / "ckpt.pt", log_every=0)
    assert summary["loss_first"] == pytest.approx(0.0, abs=1e-6)


def test_resumed_training_equals_straight_training(voice, batches, tmp_path):
    config = tiny_student_config(voice)

    def fresh_student():
        torch.manual_seed(0)
        return build_decoder(config)

    straight = fresh_student()
    train_decoder(straight, batches, steps=4, lr=1e-3, checkpoint_path=tmp_path / "straight.pt", log_every=0)

    chunked = fresh_student()
    first = train_decoder(chunked, batches, steps=4, lr=1e-3, checkpoint_path=tmp_path / "chunked.pt",
                          log_every=0, max_steps_this_call=2)
    assert first["step"] == 2 and not first["done"]
    resumed_student = fresh_student()  # a new process would start from fresh weights too
    second = train_decoder(resumed_student, batches, steps=4, lr=1e-3, checkpoint_path=tmp_path / "chunked.pt",
                           log_every=0, max_steps_this_call=2)
    assert second["start_step"] == 2 and second["step"] == 4 and second["done"]
    for (name, ours), theirs in zip(resumed_student.state_dict().items(), straight.state_dict().values()):
        assert torch.equal(ours, theirs), name

    state = torch.load(tmp_path / "chunked.pt", weights_only=True)
    assert state["step"] == 4 and set(state) == {"model", "optimizer", "step"}
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave nothing behind


def test_time_budget_ends_the_call_with_a_checkpoint_and_a_resume_goes_on(voice, batches, tmp_path):
    torch.manual_seed(0)
    student = build_decoder(tiny_student_config(voice))
    checkpoint = tmp_path / "ckpt.pt"
    # A budget no step fits in: the call ends after its first step, and saves it.
    first = train_decoder(student, batches, steps=5, lr=1e-3, checkpoint_path=checkpoint, log_every=0,
                          max_seconds_this_call=1e-9)
    assert first["step"] == 1 and first["steps_this_call"] == 1 and not first["done"]
    assert torch.load(checkpoint, weights_only=True)["step"] == 1
    second = train_decoder(student, batches, steps=5, lr=1e-3, checkpoint_path=checkpoint, log_every=0,
                           max_seconds_this_call=3600)
    assert second["start_step"] == 1 and second["step"] == 5 and second["done"]
    with pytest.raises(ValueError, match="max_seconds_this_call"):
        train_decoder(student, batches, steps=5, lr=1e-3, checkpoint_path=checkpoint, max_seconds_this_call=0)


def test_dataset_file_round_trip(batches, tmp_path):
    path = tmp_path / "latents.safetensors"
    batches.dataset.save(path)
    loaded = load_latent_dataset([path, path])  # shards of one teacher concatenate
    assert len(loaded.latents) == 2 * len(batches.dataset.latents)
    for ours, theirs in zip(loaded.latents, batches.dataset.latents):
        assert torch.allclose(ours, theirs, atol=2e-2, rtol=1e-3)  # float16 on disk
    assert loaded.teacher_decoder_config == batches.dataset.teacher_decoder_config
    for name, weight in batches.dataset.teacher_decoder.state_dict().items():
        assert torch.equal(loaded.teacher_decoder.state_dict()[name], weight), name


def test_cli_trains_in_chunks_and_exports(voice, batches, tmp_path):
    dataset_path, config_path = tmp_path / "latents.safetensors", tmp_path / "student.json"
    checkpoint, export = tmp_path / "ckpt.pt", tmp_path / "student.safetensors"
    batches.dataset.save(dataset_path)
    config_path.write_text(json.dumps(tiny_student_config(voice)))
    command = ["train", "--dataset", str(dataset_path), "--student-config", str(config_path), "--steps", "2",
               "--checkpoint", str(checkpoint), "--max-steps-this-call", "1", "--batch-size", "2",
               "--segment-frames", str(SEGMENT_FRAMES), "--log-every", "1", "--export", str(export)]
    main(command)
    assert torch.load(checkpoint, weights_only=True)["step"] == 1 and not export.exists()
    main(command)
    assert torch.load(checkpoint, weights_only=True)["step"] == 2
    student = build_decoder(json.loads(config_path.read_text()))
    student.load_state_dict(load_file(str(export)))


def test_training_core_imports_without_espeak_onnx_or_hydra():
    """What the GPU machine has: torch, numpy, safetensors."""
    blocked = ["onnx", "onnxruntime", "piper_phonemize", "hydra", "mlflow", "librosa", "torch_pruning"]
    code = ("import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
            + "import models.piper.training.decoder_student, models.piper.training.lite_training\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
