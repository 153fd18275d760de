"""What the pruning and distillation stages read from EmotiVoice's registry entry (models/family.py:
PruneHooks, DistilHooks): the vocoder is the part both change. Kept apart from
models/emotivoice/vocoder_student.py, which a GPU machine imports with torch alone.

    python -m compress model=emotivoice +experiment=debug_emotivoice_stages   # pruned and lite variants
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from models.emotivoice.vocoder_student import (
    LiteVocoderConfig,
    build_lite_vocoder,
    build_vocoder,
    load_student,
    prune_vocoder,
    save_student,
    teacher_mels,
    train_student,
    vocoder_config,
    vocoder_widths,
)
from models.family import DecoderPruning, DistilHooks, PruneHooks
from models.interface import Utterance
from models.training.decoder_training import write_bundle_record

VOCODER = "vocoder"


def _check_prunable(voice) -> None:
    """Every EmotiVoice voice prunes: the vocoder takes mel frames whoever speaks."""


PRUNE_HOOKS = PruneHooks(
    check_model=_check_prunable,
    decoder=DecoderPruning(
        part_role=VOCODER,
        latent_channels=lambda voice: voice.generator.config.n_mels,
        teacher_latents=teacher_mels,
        prune=prune_vocoder,
        config=lambda vocoder, voice: vocoder_config(vocoder),
        build=build_vocoder,
        widths=vocoder_widths,
    ),
)


def _check_student_config(fields: dict) -> None:
    LiteVocoderConfig.from_dict(dict(fields))


def _load_student(voice, weights_path: Path) -> tuple[dict[str, nn.Module], dict]:
    vocoder, config = load_student(weights_path)
    return {VOCODER: vocoder}, config


def _utterances_of(voice, phoneme_ids: list[list[int]]) -> list:
    """The voice's own utterances for these ids (their text feeds the content embedding)."""
    return [Utterance(voice.sentence_text(tuple(ids)), tuple(voice.frontend.tokens[i] for i in ids), tuple(ids))
            for ids in phoneme_ids]


def _train_student(voice, phoneme_ids: list[list[int]], student_config: dict, checkpoint_path: Path,
                   weights_path: Path, card: dict, *, steps: int, lr: float, warmup_steps: int,
                   final_lr_fraction: float, batch_size: int, segment_frames: int, latent_weight: float,
                   seed: int) -> dict:
    """Train the Lite vocoder here on the teacher's mels of ``phoneme_ids``. ``latent_weight`` is
    not read: the student replaces the vocoder alone, whose input is the teacher's own mel."""
    dataset = teacher_mels(voice, _utterances_of(voice, phoneme_ids))
    student = build_lite_vocoder(dataset.teacher_decoder, student_config)
    summary = train_student(student, dataset, steps, lr, checkpoint_path, str(voice.device), batch_size,
                            segment_frames, seed, warmup_steps, final_lr_fraction)
    save_student(student, weights_path, {"steps": summary["step"], **card})
    return summary


def _write_bundle(voice, phoneme_ids: list[list[int]], out: Path, provenance: dict) -> None:
    """The teacher's mels and folded vocoder (one safetensors file) for vocoder_student's ``train``."""
    out.mkdir(parents=True, exist_ok=True)
    teacher_mels(voice, _utterances_of(voice, phoneme_ids)).save(out / "mels.safetensors")
    write_bundle_record(out, voice, len(phoneme_ids), provenance)


DISTIL_HOOKS = DistilHooks(
    student_parts=(VOCODER,),
    check_student_config=_check_student_config,
    load_student=_load_student,
    train_student=_train_student,
    write_bundle=_write_bundle,
    train_command="python -m models.emotivoice.vocoder_student train --dataset {bundle}/mels.safetensors "
                  "--steps 24000 --max-steps-this-call 4000 --checkpoint $OUT/lite_ckpt.pt --device cuda "
                  "--export $OUT/lite_vocoder.safetensors",
)
