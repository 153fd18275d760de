"""The fused Triton HiFi-GAN (models/fused_hifigan.py) against the HiFi-GAN module, side by side.

EmotiVoice's released vocoder sizes (random weights from the manifest), FP16, each variant replayed
as a CUDA graph, in one process:

    PYTHONPATH=. python scripts/bench_fused_hifigan.py --batches 1 32 64 --rounds 3 --out $OUT/fused_hifigan.json

* ``module_channels_last``: the module with channels-last 2-D convolutions (models/conv_layout.py),
  what the bucketed engine runs by default;
* ``module_compiled``: the same through torch.compile (what ``compile_frames`` runs);
* ``fused_t{block}_w{warps}``: the Triton kernels at each launch shape of ``--launch`` (each shape
  compiles its own kernels on first use, which takes minutes: ``first_call_s``).

Each batch holds mel lengths within +-30 % of ``--frames`` (172 frames: 2.75 s at 16 kHz), padded to
the longest and masked. Rounds run every variant once in an order that rotates each round; each
figure is the median over rounds of the median of ``--repeats`` replays, with the range as
``spread``. ``snr_db``: each variant's audio (valid samples only) against the FP32 module's;
``first_call_s``: the first call of each batch size (kernel compiles and the graph capture).
Light on purpose (torch, numpy, Triton): it runs on a bare GPU machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from core.publishing import add_allow_dirty_argument, publication_or_exit
from evaluate.rtf import timed_median
from models.conv_layout import converted_copy
from models.cuda_graphs import GraphCache
from models.emotivoice.checkpoints import random_generator
from models.emotivoice.hifigan import FINAL_LRELU_SLOPE, LRELU_SLOPE
from models.fused_hifigan import FusedHifigan
from models.precision import waveform_snr_db

LENGTH_SPREAD = 0.3


def batch_inputs(batch: int, frames: int, n_mels: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    spread = int(frames * LENGTH_SPREAD)
    lengths = torch.tensor(rng.integers(frames - spread, frames + spread + 1, size=batch), device="cuda")
    if batch == 1:
        lengths[0] = frames
    generator = torch.Generator(device="cuda").manual_seed(seed)
    mel = torch.randn(batch, n_mels, int(lengths.max()), device="cuda", generator=generator)  # (B, n_mels, T)
    return mel, lengths


def replay_ms(cache: GraphCache, key: tuple, module, inputs: tuple, repeats: int) -> float:
    """Median of ``repeats`` graph replays after one untimed replay."""
    seconds, _ = timed_median(lambda: cache.run(key, module, inputs), repeats, 1, "cuda")
    return seconds * 1000.0


def valid_samples(audio: torch.Tensor, lengths: torch.Tensor, hop: int) -> torch.Tensor:
    """(B, 1, T_audio) -> every row's samples within its length, end to end (padding is not compared)."""
    return torch.cat([audio[row, 0, :frames * hop] for row, frames in enumerate(lengths.tolist())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--frames", type=int, default=172)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--launch", nargs="+", default=["128x4"],
                        help="fused kernels' launch shapes, BLOCK_TxWARPS; each compiles its own kernels "
                             "(minutes on first use)")
    parser.add_argument("--seed", type=int, default=0)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    torch.backends.cudnn.benchmark = True

    hifigan = random_generator(args.seed).inference_copy().generator.cuda().eval()
    hop = int(np.prod(hifigan.upsample_rates))
    variants = {"module_channels_last": converted_copy(hifigan, "channels_last").half().eval(),
                "module_compiled": torch.compile(converted_copy(hifigan, "channels_last").half().eval(), dynamic=False)}
    for launch in args.launch:
        block_t, warps = (int(part) for part in launch.split("x"))
        variants[f"fused_t{block_t}_w{warps}"] = FusedHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float16,
                                                               block_t=block_t, num_warps=warps)
    report = {"what": "EmotiVoice HiFi-GAN (released sizes, random weights), FP16, CUDA graphs, masked batches",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "provenance": origin,
              "frames": args.frames, "rounds": args.rounds, "repeats": args.repeats, "batches": {}}
    cache = GraphCache()
    with torch.inference_mode():
        for batch in args.batches:
            mel, lengths = batch_inputs(batch, args.frames, hifigan.conv_pre.in_channels, args.seed + batch)
            reference = hifigan(mel, lengths)
            names = list(variants)
            rounds: dict[str, list[float]] = {name: [] for name in names}
            section = {"frames_max": int(lengths.max()), "audio_s": float(lengths.sum()) * hop / 16000, "snr_db": {},
                       "first_call_s": {}}
            for name in names:
                start = time.perf_counter()
                audio, = cache.run((name, batch), variants[name], (mel.half(), lengths))
                torch.cuda.synchronize()
                section["first_call_s"][name] = time.perf_counter() - start  # compiles and the graph capture
                section["snr_db"][name] = waveform_snr_db(valid_samples(audio.float(), lengths, hop),
                                                          valid_samples(reference, lengths, hop))
                print(f"b{batch} {name}: first call {section['first_call_s'][name]:.1f} s", flush=True)
            for round_index in range(args.rounds):
                order = names[round_index % len(names):] + names[:round_index % len(names)]
                for name in order:
                    rounds[name].append(replay_ms(cache, (name, batch), variants[name], (mel.half(), lengths),
                                                  args.repeats))
            section["median_ms"] = {name: statistics.median(times) for name, times in rounds.items()}
            section["spread_ms"] = {name: max(times) - min(times) for name, times in rounds.items()}
            section["rounds_ms"] = rounds
            section["sentences_per_s"] = {name: batch / (ms / 1000.0) for name, ms in section["median_ms"].items()}
            report["batches"][f"b{batch}"] = section
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))
            print(batch, json.dumps(section["median_ms"]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
