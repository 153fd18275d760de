"""What the pruning and distillation stages read from Piper's registry entry (models/family.py:
PruneHooks, DistilHooks). Kept apart from the training modules, which the GPU machine imports with
torch alone: the registry types pull in onnx."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import save_file
from torch import nn

from core.atomic_io import atomic_write, write_text_atomic
from models.family import DecoderPruning, DistilHooks, EncoderFfnPruning, PruneHooks
from models.piper.lite import STUDENT_PARTS, LiteStudent, LiteStudentConfig, build_lite_parts, load_student
from models.piper.training.decoder_student import build_decoder, decoder_config, teacher_latents
from models.piper.training.lite_training import TeacherTargets, save_student, train_lite
from models.piper.training.pruning import (
    build_text_encoder, decoder_widths, encoder_config, encoder_distillation_mse, finetune_encoder, prune_decoder,
    prune_encoder_ffn,
)

# ---------------------------------------------------------------- pruning


def _check_prunable(voice) -> None:
    speakers = voice.model.hp.num_speakers
    if speakers > 1:
        raise ValueError(f"pruning a multi-speaker voice ({speakers} speakers) is not supported yet")


PRUNE_HOOKS = PruneHooks(
    check_model=_check_prunable,
    decoder=DecoderPruning(
        part_role="decoder",
        latent_channels=lambda voice: voice.model.hp.latent_channels,
        teacher_latents=teacher_latents,
        prune=prune_decoder,
        config=lambda decoder, voice: decoder_config(decoder, voice.model.hp),
        build=build_decoder,
        widths=decoder_widths,
    ),
    encoder_ffn=EncoderFfnPruning(
        part_role="encoder",
        prune=prune_encoder_ffn,
        finetune=finetune_encoder,
        distance=encoder_distillation_mse,
        config=lambda encoder, voice: encoder_config(encoder, voice.model.hp),
        build=build_text_encoder,
        widths=lambda encoder: [ffn.conv_1.out_channels for ffn in encoder.encoder.ffn_layers],
    ),
)

# ---------------------------------------------------------------- distillation into the Lite student


def _check_student_config(fields: dict) -> None:
    LiteStudentConfig.from_dict(dict(fields))


def _load_student(voice, weights_path: Path) -> tuple[dict[str, nn.Module], dict]:
    parts, config = load_student(voice.model.hp, weights_path)
    return parts, config.to_dict()


def _train_student(voice, phoneme_ids: list[list[int]], student_config: dict, checkpoint_dir: Path,
                   weights_path: Path, card: dict, *, steps: int, lr: float, warmup_steps: int,
                   final_lr_fraction: float, batch_size: int, segment_frames: int, latent_weight: float,
                   seed: int) -> dict:
    """Train the Lite student here on ``phoneme_ids``; its weights (with ``card``) go to ``weights_path``."""
    config = LiteStudentConfig.from_dict(dict(student_config))
    parts = build_lite_parts(voice.model.hp, config)
    student = LiteStudent(parts["flow"], parts["decoder"])
    targets = TeacherTargets(voice.model, phoneme_ids, batch_size, segment_frames, seed, str(voice.device))
    summary = train_lite(student, targets, steps, lr, checkpoint_dir, voice.sample_rate_hz, latent_weight,
                         warmup_steps, final_lr_fraction, log_every=0)
    save_student(student, config, weights_path, {"steps": summary["step"], **card})
    return summary


def _write_bundle(voice, phoneme_ids: list[list[int]], out: Path, provenance: dict) -> None:
    """Teacher weights (float16: a GPU call carries at most 64 MiB), hyperparameters and phoneme ids,
    for ``python -m models.piper.training.lite_training train``."""
    state = {k: v.detach().half().contiguous() for k, v in voice.model.state_dict().items()}
    atomic_write(out / "teacher.safetensors", lambda tmp: save_file(state, tmp))
    write_text_atomic(out / "bundle.json", json.dumps({
        "family": voice.family, "hyperparams": dataclasses.asdict(voice.model.hp), "sample_rate_hz": voice.sample_rate_hz,
        **provenance, "phoneme_ids": phoneme_ids}))


DISTIL_HOOKS = DistilHooks(
    student_parts=STUDENT_PARTS,
    check_student_config=_check_student_config,
    load_student=_load_student,
    train_student=_train_student,
    write_bundle=_write_bundle,
    train_command="python -m models.piper.training.lite_training train --bundle {bundle} --checkpoint $OUT/state "
                  "--steps 24000 --max-seconds 450 --device cuda --export $OUT/lite_student.safetensors",
)
