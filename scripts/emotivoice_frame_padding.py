"""How much of EmotiVoice's batched frame stage is padding, and how much length groups would remove,
for the batches scripts/bench_emotivoice.py times: the same random full-size weights and rows of
mixed text lengths, through the engine's FP32 text stage on this CPU (durations only; no GPU).

    PYTHONPATH=. python scripts/emotivoice_frame_padding.py --out docs/results/cpu_32_emotivoice_frame_padding.json

For each batch: the rows' frame counts, the single frame bucket the engine pads them all to, and for
1, 2, 4 and 8 length groups (models/emotivoice/engines.py's ``length_groups``) the padded frames per
row relative to one run: the vocoder's work if its time follows its frames. With ``--frame-buckets``,
the share of the computed frames that are the rows' own for each frame bucket (the engine's
``frame_bucket``) and group count, e.g. the served engine's 32 groups of 32 rows at batch 1,024:

    PYTHONPATH=. python scripts/emotivoice_frame_padding.py --batches 512 1024 --groups 16 32 \
        --frame-buckets 32 16 8 --out docs/results/cpu_41_emotivoice_frame_bucket_padding.json
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.emotivoice.engines import FRAME_BUCKET, TEXT_BUCKETS, BucketedEngine, bucket_of, length_groups
from scripts.bench_emotivoice import SENTENCE_SYMBOLS, batch_lengths, build, make_inputs


def padded_frames(counts: list[int], groups: int, frame_bucket: int = FRAME_BUCKET) -> int:
    """Frames the frame stage computes for these rows in ``groups`` length groups, each padded to a
    multiple of ``frame_bucket``."""
    return sum(len(group) * math.ceil(max(counts[row] for row in group) / frame_bucket) * frame_bucket
               for group in length_groups(counts, groups))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64, 256])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--frame-buckets", type=int, nargs="+", default=[FRAME_BUCKET],
                        help="frame buckets to report the useful share at (the engine's frame_bucket)")
    parser.add_argument("--text-tokens", type=int, default=SENTENCE_SYMBOLS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if min(args.frame_buckets) < 1:
        parser.error(f"--frame-buckets {args.frame_buckets}: each at least 1")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    generator = build("cpu", torch.float32, True, args.seed)
    engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32)
    report = {"weights": "random, full size (the bench's)", "frame_bucket": FRAME_BUCKET, "batches": {},
              "origin": origin}
    for batch in args.batches:
        ids, lengths, speakers, style, content = make_inputs(generator, batch_lengths(args, batch), "cpu", args.seed)
        ids = torch.nn.functional.pad(ids, (0, bucket_of(ids.shape[1], TEXT_BUCKETS, "text length") - ids.shape[1]))
        with torch.inference_mode():
            _, used_durations, _ = engine.text_stage(ids, lengths, speakers, style, content, torch.ones(batch, 1))
        counts = used_durations.sum(dim=-1).tolist()
        one_run = padded_frames(counts, 1)
        row = {"frames_mean": sum(counts) / batch, "frames_min": min(counts), "frames_max": max(counts),
               "bucket": one_run // batch, "useful_share": sum(counts) / one_run,
               "padded_frames_vs_one_run": {groups: padded_frames(counts, groups) / one_run for groups in args.groups},
               "useful_share_by_frame_bucket": {
                   bucket: {groups: sum(counts) / padded_frames(counts, groups, bucket) for groups in args.groups}
                   for bucket in args.frame_buckets}}
        report["batches"][batch] = row
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
