"""How a Kokoro Lite student's level departs from its teacher's as its input grows longer.

The student is distilled on short segments of the teacher's generator input; the voice decodes
whole utterances. This script decodes the same training utterances with teacher and student, cut
into segments of each given length (each segment decoded alone, as in training) and whole, and
reports the student's band levels against the teacher's (evaluate/band_levels.py) per length.
It needs the distillation dataset (``python -m compress.distil prepare --family kokoro``), not the
voice: training utterances only, never the evaluation set.

    PYTHONPATH=. python scripts/kokoro_lite_length_gap.py <student>.safetensors ... \
        --dataset .device/distil_kokoro/generator_inputs-*.safetensors --segment-frames 32 64 128 \
        --out docs/results/cpu_NN_kokoro_lite_length_gap.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from evaluate.band_levels import DEFAULT_BAND_EDGES_HZ, band_level_difference_db
from models.kokoro.config import KokoroConfig
from models.kokoro.generator_student import PackedGenerator, build_packed_generator, load_student_generator
from models.training.decoder_training import LatentDataset


@torch.no_grad()
def decode_in_segments(generator: PackedGenerator, packed: torch.Tensor, segment_frames: int | None) -> np.ndarray:
    """Packed input (C, T) -> audio (T' * scale,): whole, or each ``segment_frames`` columns decoded
    alone and joined (the tail shorter than a segment is dropped, in every generator alike)."""
    if segment_frames is None:
        return generator(packed[None])[0, 0].numpy()
    count = packed.shape[-1] // segment_frames
    segments = packed[:, : count * segment_frames].reshape(packed.shape[0], count, segment_frames).transpose(0, 1)
    return generator(segments)[:, 0].reshape(-1).numpy()  # (count * segment samples,)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", type=Path, nargs="+", help="Lite generator files")
    parser.add_argument("--dataset", type=Path, nargs="+", required=True, help="every shard of one dataset")
    parser.add_argument("--segment-frames", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--utterances", type=int, default=12, help="every third utterance from the second")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    if min(args.segment_frames) < 1 or args.utterances < 1:
        parser.error("--segment-frames and --utterances must be positive")
    missing = [str(path) for path in [*args.students, *args.dataset] if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    dataset = LatentDataset.load(args.dataset, build_packed_generator)
    teacher = dataset.teacher_decoder
    model_config = KokoroConfig.from_dict(dataset.teacher_decoder_config["model_config"])
    # One utterance of each (sentence, speed) triple in turn: the middle speed's, as the dataset orders them.
    picked = list(range(1, len(dataset.latents), 3))[: args.utterances]
    lengths: list[int | None] = [*sorted(set(args.segment_frames)), None]
    teacher_audio = {length: [decode_in_segments(teacher, dataset.latents[i], length) for i in picked]
                     for length in lengths}
    students = []
    for path in args.students:
        generator, _ = load_student_generator(model_config, path)
        with safe_open(str(path), framework="pt") as handle:
            card = json.loads((handle.metadata() or {}).get("card", "{}"))
        student = PackedGenerator(generator, teacher.input_channels).eval()
        by_length = {}
        for length in lengths:
            levels = [band_level_difference_db(decode_in_segments(student, dataset.latents[i], length), reference,
                                               dataset.sample_rate_hz)
                      for i, reference in zip(picked, teacher_audio[length])]
            by_length["whole" if length is None else str(length)] = np.mean(levels, axis=0).round(2).tolist()
        students.append({"student": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                         "stage_channels": list(generator.stage_channels),
                         "trained_segment_frames": card.get("segment_frames"),
                         "band_level_db_vs_teacher": by_length})
        print(f"{path}: whole utterances {by_length['whole']}", flush=True)
    print_and_save_report({
        "what": "Kokoro Lite students' band levels against the teacher's on training utterances, decoded "
                "in segments of each length and whole (median over loud frames, mean over utterances)",
        "command": "PYTHONPATH=. python scripts/kokoro_lite_length_gap.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.node(), "provenance": origin, "torch": torch.__version__, "threads": args.threads,
        "band_edges_hz": list(DEFAULT_BAND_EDGES_HZ), "utterances": picked,
        "segment_frames_samples": dataset.hop_length, "students": students,
    }, args.out)


if __name__ == "__main__":
    main()
