"""What the distillation stage reads from Kokoro's registry entry (models/family.py: DistilHooks):
the student is the Lite decoder, the teacher's decoder with a narrower generator. Kept apart from
models/kokoro/generator_student.py, which a GPU machine imports with torch alone.

    python -m compress model=kokoro_ja +experiment=debug_kokoro_lite   # the lite variant and its graphs
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from models.family import DistilHooks
from models.kokoro.generator_student import (
    DATASET_STEM,
    check_fits,
    check_student_config,
    lite_decoder,
    load_student_generator,
    teacher_dataset,
    train_student,
)
from models.training.decoder_training import write_bundle_record

DECODER = "decoder"


def _load_student(voice, weights_path: Path) -> tuple[dict[str, nn.Module], dict]:
    generator, config = load_student_generator(voice.model.config, weights_path)
    return {DECODER: lite_decoder(voice.model.decoder, generator)}, config


def _train_student(voice, phoneme_ids: list[list[int]], student_config: dict, checkpoint_path: Path,
                   weights_path: Path, card: dict, *, steps: int, lr: float, warmup_steps: int,
                   final_lr_fraction: float, batch_size: int, segment_frames: int, latent_weight: float,
                   seed: int) -> dict:
    """Slice the teacher's generator and train it here toward the teacher generator's audio on
    ``phoneme_ids`` at three speeds. ``latent_weight`` is not read: the student's input is the
    teacher's own decode-block output, so there is no latent of its own to match."""
    checkpoint_path = Path(checkpoint_path)
    checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    widths = check_student_config(student_config)
    check_fits(widths, voice.model.decoder.generator)  # before the dataset, which takes seconds a sentence
    dataset = teacher_dataset(voice, phoneme_ids)  # the same on a resume
    return train_student(dataset, widths, checkpoint_path, weights_path, card, steps, lr=lr,
                         batch_size=batch_size, segment_frames=segment_frames, seed=seed,
                         device=str(next(voice.model.parameters()).device), warmup_steps=warmup_steps,
                         final_lr_fraction=final_lr_fraction)


def _write_bundle(voice, phoneme_ids: list[list[int]], out: Path, provenance: dict) -> None:
    """The teacher's packed generator inputs and its generator, in shards a GPU call can carry, for ``train``."""
    out.mkdir(parents=True, exist_ok=True)
    teacher_dataset(voice, phoneme_ids).save_shards(out, DATASET_STEM)
    write_bundle_record(out, voice, len(phoneme_ids), provenance)


DISTIL_HOOKS = DistilHooks(
    student_parts=(DECODER,),
    check_student_config=check_student_config,
    load_student=_load_student,
    train_student=_train_student,
    write_bundle=_write_bundle,
    # The CLI's defaults are the recipe of conf/stages/family/kokoro.yaml (lr, warm-up, decay,
    # batch, segment), here with the GPU's longer schedule. The checkpoint (74 MB with the optimizer)
    # stays on the warm machine between calls; the student comes back in float16, under the 16 MiB
    # a GPU call returns per file. Each call ends cleanly inside the 10-minute limit.
    train_command=f"python -m models.kokoro.generator_student train --dataset {{bundle}}/{DATASET_STEM}-*.safetensors "
                  "--stage-channels 128 64 --steps 20000 --max-seconds-this-call 540 --batch-size 16 "
                  "--checkpoint .device/kokoro_lite/lite_ckpt.pt --device cuda --export-each-call "
                  "--export-dtype float16 --export $OUT/lite_generator.safetensors",
    training_set="calibration_ja",  # Japanese voices: the generated training text is English
    held_out_set="eval_ja",
)
