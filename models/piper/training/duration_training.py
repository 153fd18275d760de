"""Distil a Piper voice's stochastic duration predictor into a NoiseAffineDurationPredictor (CPU, minutes).

    python -m compress.distil prepare --family piper --voice bundled:joe --out outputs/distil_bundle
    python -m models.piper.training.duration_training --bundle outputs/distil_bundle \
        --out models/checkpoints/duration_joe_medium.safetensors

Each step draws a batch of training sequences (the bundle's: generated training text, never eval,
calibration or Harvard), standard-normal noise and a noise scale per sequence uniform in [0, 1]
(Piper voices ship 0.8; users set it), and fits the student's log-durations to the teacher's on that
same noise (masked mean squared error). The teacher's text encoder provides the input, as in a graph.
The bundle's eval sequences measure the result at the voices' default scale and at zero noise.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from models.piper.duration_student import NoiseAffineDurationPredictor, save_duration_student
from models.piper.training.lite_training import load_training_bundle, padded_batch
from models.piper.vits import PiperVits

DEFAULT_NOISE_SCALE_W = 0.8  # Piper voices' inference setting
RESAMPLED_NOISE_OFFSET = 1_000_000  # seeds far from the eval's, for the teacher-against-itself yardstick


@torch.no_grad()
def text_encodings(teacher: PiperVits, phoneme_ids: list[list[int]], batch_size: int = 32) -> list[torch.Tensor]:
    """The teacher's text encoding of each sequence, (C, T_i): the duration predictors' input.

    Computed once: the encoder costs about three times the predictor's step, and the student
    never changes it. Batches are formed in length order so that little is padded.
    """
    order = sorted(range(len(phoneme_ids)), key=lambda index: len(phoneme_ids[index]))
    encodings: list[torch.Tensor | None] = [None] * len(phoneme_ids)
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        ids, lengths = padded_batch([phoneme_ids[row] for row in rows])
        hidden, _, _, _ = teacher.enc_p(ids, lengths)  # (B, C, T)
        for row, encoding, length in zip(rows, hidden, lengths.tolist()):
            encodings[row] = encoding[:, :length].clone()
    return encodings


def _encoding_batch(encodings: list[torch.Tensor], rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-padded hidden (B, C, T) and mask (B, 1, T) of the chosen sequences."""
    length = max(encodings[row].shape[1] for row in rows)
    hidden = torch.zeros(len(rows), encodings[rows[0]].shape[0], length)
    mask = torch.zeros(len(rows), 1, length)
    for position, row in enumerate(rows):
        hidden[position, :, : encodings[row].shape[1]] = encodings[row]
        mask[position, :, : encodings[row].shape[1]] = 1
    return hidden, mask


def masked_mse(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((prediction - target) ** 2 * mask).sum() / mask.sum()


def train_duration_student(teacher: PiperVits, phoneme_ids: list[list[int]], steps: int, batch_size: int = 16,
                           lr: float = 1e-3, seed: int = 0, log_every: int = 100) -> tuple[NoiseAffineDurationPredictor, dict]:
    """The student fitted to ``teacher.dp`` on ``phoneme_ids``; returns it and a training summary."""
    if steps < 1 or not phoneme_ids:
        raise ValueError(f"need steps >= 1 and training sequences (got {steps} steps, {len(phoneme_ids)} sequences)")
    teacher = teacher.eval()
    start = time.perf_counter()
    encodings = text_encodings(teacher, phoneme_ids)
    encode_seconds = time.perf_counter() - start
    student = NoiseAffineDurationPredictor.from_teacher(teacher.hp, teacher.dp).train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    generator = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    for step in range(steps):
        rows = torch.randint(0, len(phoneme_ids), (batch_size,), generator=generator).tolist()
        hidden, mask = _encoding_batch(encodings, rows)  # (B, C, T), (B, 1, T)
        scale = torch.rand(batch_size, 1, 1, generator=generator)  # noise_scale_w per sequence
        noise = torch.randn(batch_size, 2, hidden.shape[2], generator=generator) * scale  # (B, 2, T)
        with torch.no_grad():
            g = None
            if teacher.emb_g is not None:  # a random speaker per sequence
                g = teacher.emb_g(torch.randint(0, teacher.hp.num_speakers, (batch_size,), generator=generator))
                g = g.unsqueeze(-1)  # (B, C_g, 1)
            target = teacher.dp(hidden, mask, noise, g)  # (B, 1, T) log-durations
        loss = masked_mse(student(hidden, mask, noise, g), target, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{steps} mse {sum(losses[-log_every:]) / log_every:.5f}", flush=True)
    tail = losses[-max(1, steps // 10):]
    return student.eval(), {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
                            "encode_seconds": encode_seconds, "seconds": time.perf_counter() - start, "mse_first": losses[0],
                            "mse_tail_mean": sum(tail) / len(tail)}


@torch.no_grad()
def duration_agreement(teacher: PiperVits, student: torch.nn.Module, encodings: list[torch.Tensor],
                       noise_scale_w: float, seed: int = 0, student_seed_offset: int = 0) -> dict[str, float]:
    """How closely ``student`` reproduces the teacher's durations on sequences whose ``text_encodings``
    are ``encodings`` (one sequence at a time, sequence i with noise from seed + i, the same noise for both unless ``student_seed_offset``
    shifts the student's: ``teacher.dp`` on other noise is the yardstick, how far the teacher's own
    durations move from one draw to the next).

    ``log_duration_mae``: mean |log w_student - log w_teacher| over phonemes; ``frames_equal``: the
    share of phonemes whose integer frame count (ceil(w), length scale 1) is the same;
    ``length_ratio_mae`` and ``length_ratio_mean``: mean over sequences of |frames_student /
    frames_teacher - 1| and of that ratio itself (a bias towards slower or faster speech).
    """
    errors, equal, phonemes, length_ratios = 0.0, 0, 0, []
    g = teacher.emb_g(torch.zeros(1, dtype=torch.long)).unsqueeze(-1) if teacher.emb_g is not None else None
    for index, encoding in enumerate(encodings):
        hidden, mask = encoding.unsqueeze(0), torch.ones(1, 1, encoding.shape[1])  # (1, C, T), (1, 1, T)
        noise, student_noise = (
            torch.randn(1, 2, encoding.shape[1], generator=torch.Generator().manual_seed(seed + index + offset))
            * noise_scale_w for offset in (0, student_seed_offset))
        reference, predicted = teacher.dp(hidden, mask, noise, g)[0, 0], student(hidden, mask, student_noise, g)[0, 0]
        errors += float((predicted - reference).abs().sum())
        frames_reference, frames_predicted = torch.ceil(torch.exp(reference)), torch.ceil(torch.exp(predicted))
        equal += int((frames_reference == frames_predicted).sum())
        phonemes += encoding.shape[1]
        length_ratios.append(float(frames_predicted.sum() / frames_reference.sum()))
    return {"noise_scale_w": noise_scale_w, "sequences": len(encodings), "phonemes": phonemes,
            "log_duration_mae": errors / phonemes, "frames_equal": equal / phonemes,
            "length_ratio_mae": sum(abs(ratio - 1) for ratio in length_ratios) / len(length_ratios),
            "length_ratio_mean": sum(length_ratios) / len(length_ratios)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.piper.training.duration_training",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="python -m compress.distil prepare's output")
    parser.add_argument("--out", type=Path, required=True, help="<name>.safetensors")
    parser.add_argument("--sequences", type=int, default=1536, help="the bundle's first N training sequences")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.out.suffix != ".safetensors":
        parser.error(f"--out {args.out}: the name must end in .safetensors")
    torch.set_num_threads(args.threads)
    bundle, teacher = load_training_bundle(args.bundle)
    training_ids = bundle["phoneme_ids"][: args.sequences]
    student, summary = train_duration_student(teacher, training_ids, args.steps, args.batch_size, args.lr, args.seed)
    # One sequence a batch: the eval's encodings carry no padding, so its figures do not depend on batching.
    eval_encodings = text_encodings(teacher, bundle["eval_phoneme_ids"], batch_size=1)
    held_out = {f"w{scale}": duration_agreement(teacher, student, eval_encodings, scale)
                for scale in (DEFAULT_NOISE_SCALE_W, 0.0)}
    held_out["teacher_redrawn_w0.8"] = duration_agreement(teacher, teacher.dp, eval_encodings, DEFAULT_NOISE_SCALE_W,
                                                          student_seed_offset=RESAMPLED_NOISE_OFFSET)
    card = {"teacher": bundle.get("voice"), "training_sequences": len(training_ids),
            "training_text_seed": bundle.get("training_text_seed"), "training": summary, "eval": held_out,
            "threads": args.threads}
    save_duration_student(student, args.out, card)
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
