"""EmotiVoice's HiFi-GAN over a batch, whole or with its late stages run a few rows at a time.

    PYTHONPATH=. python3 scripts/bench_vocoder_row_chunks.py --out $OUT/chunks.json            # GPU
    PYTHONPATH=. python scripts/bench_vocoder_row_chunks.py --device cpu --no-compile --rows 3 \\
        --frames 16 --chunks 0 1 --repeats 2 --out /tmp/chunks.json                           # smoke run

What it answers: whether ``HifiganGenerator.chunk_rows`` (models/emotivoice/hifigan.py) makes the
vocoder faster by keeping the late, memory-bound stages' tensors in L2, before any engine or server
takes it. Every variant runs the same full-size vocoder (random weights, weight norm folded), FP16,
channels-last 2-D convolutions as the engines run them, compiled with static shapes and replayed as a
CUDA graph (``head`` and ``tail``, the stages before and from the split, compiled apart), on one batch of ``--rows`` rows whose frame counts spread +-30 % around ``--frames``
(masked, as the engine's length groups run). Reported per variant: the median replay time over
``--repeats`` replays, sentences/s of the batch, and the largest difference from the whole batch's
audio (rounding only: kernels may be picked per row count). Only torch and numpy: it runs on the GPU
machine as it is.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.conv_layout import converted_copy
from models.cuda_graphs import GraphCache
from models.emotivoice.checkpoints import GENERATOR_MANIFEST, random_generator

LENGTH_SPREAD = 0.3


def frame_lengths(rows: int, frames: int, seed: int) -> list[int]:
    spread = int(frames * LENGTH_SPREAD)
    return np.random.default_rng(seed).integers(frames - spread, frames + spread + 1, size=rows).tolist()


def timed(run, cuda: bool, repeats: int) -> float:
    """Median milliseconds of ``run()`` after two untimed calls."""
    for _ in range(2):
        run()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=32, help="batch rows (the server's length groups hold 32)")
    parser.add_argument("--frames", type=int, default=200, help="mean frames a row (200 frames: 3.2 s at 16 kHz)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 8, 4, 2, 1],
                        help="rows a chunk of the late stages (divisors of --rows keep one chunk shape); "
                             "0 runs the batch whole")
    parser.add_argument("--from-stages", type=int, nargs="+", default=[1, 2],
                        help="the first stage run in chunks (0-3; stage 1 is the 128-channel one)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="eager modules (CPU smoke runs)")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if min(args.chunks) < 0 or args.rows < 1 or args.frames < 4:
        parser.error("--chunks at least 0, --rows at least 1, --frames at least 4")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    dtype = torch.float16 if cuda else torch.float32
    generator = random_generator(args.seed).inference_copy()
    vocoder = converted_copy(generator.generator, "channels_last" if cuda else "ncw").to(args.device, dtype).eval()
    lengths = frame_lengths(args.rows, args.frames, args.seed)
    mel = torch.randn(args.rows, generator.config.n_mels, max(lengths),  # (B, n_mels, T_feats)
                      generator=torch.Generator().manual_seed(args.seed)).to(args.device, dtype)
    lengths_t = torch.tensor(lengths, device=args.device)
    audio_s = sum(lengths) * generator.config.upsample_factor / generator.config.sample_rate_hz
    report = {"what": "EmotiVoice HiFi-GAN, full-size random weights, late stages whole or in row chunks",
              "manifest": GENERATOR_MANIFEST.name, "provenance": origin, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if cuda else platform.processor(),
              "l2_cache_mib": torch.cuda.get_device_properties(0).L2_cache_size / 2 ** 20 if cuda else None,
              "rows": args.rows, "frame_lengths": lengths, "audio_s": audio_s, "dtype": str(dtype),
              "compiled": not args.no_compile, "cuda_graphs": cuda, "variants": {}}
    variants = [(0, 0)] + [(rows, stage) for rows in args.chunks if rows for stage in args.from_stages]
    reference = None
    for rows, stage in variants:
        name = "whole" if rows == 0 else f"rows{rows}_from_stage{stage}"
        vocoder.chunk_rows(rows or None, stage if rows else 1)
        torch._dynamo.reset()
        for half in ("head", "tail"):
            vocoder.__dict__.pop(half, None)
        if not args.no_compile:
            # The halves compiled apart, the loop over chunks not: one compile per chunk shape instead of
            # the late stages unrolled once per chunk (minutes to compile at 1-row chunks). Replayed as one
            # CUDA graph, the loop costs no host time.
            vocoder.head = torch.compile(vocoder.head, dynamic=False)
            vocoder.tail = torch.compile(vocoder.tail, dynamic=False)
        module = vocoder
        started = time.perf_counter()
        with torch.inference_mode():
            if cuda:
                cache = GraphCache()
                run = lambda: cache.run(("vocoder",), module, (mel, lengths_t))[0]  # noqa: E731
            else:
                run = lambda: module(mel, lengths_t)  # noqa: E731
            audio = run().float().cpu()
            first_s = time.perf_counter() - started
            ms = timed(run, cuda, args.repeats)
        if reference is None:
            reference = audio
        report["variants"][name] = {
            "chunk_rows": rows or None, "from_stage": stage if rows else None, "median_ms": ms,
            "sentences_per_s": args.rows / (ms / 1000.0), "audio_s_per_s": audio_s / (ms / 1000.0),
            "first_call_s": first_s, "max_abs_diff_vs_whole": float((audio - reference).abs().max())}
        print(name, json.dumps(report["variants"][name]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    whole_ms = report["variants"]["whole"]["median_ms"]
    report["speedup_vs_whole"] = {name: whole_ms / figures["median_ms"] for name, figures in report["variants"].items()}
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["speedup_vs_whole"], indent=2))


if __name__ == "__main__":
    main()
