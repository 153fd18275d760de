"""EmotiVoice's HiFi-GAN with two exact rewrites, alone and together, side by side with the vocoder as it is.

    PYTHONPATH=. python3 scripts/bench_hifigan_rewrites.py --out $OUT/rewrites.json             # GPU
    PYTHONPATH=. python scripts/bench_hifigan_rewrites.py --device cpu --no-compile --rows 2 \\
        --frames 16 --repeats 2 --rounds 1 --out /tmp/rewrites.json                            # smoke run

What it answers, before an engine or server takes either rewrite:
* ``polyphase``: the upsampling's transposed convolutions as stride-1 convolutions with s x C_out
  outputs whose phases interleave by a view (models/conv_layout.py), against cuDNN's transposed
  kernels;
* ``activation_residual``: each ResBlock1 carries only its activated stream and reads the residual
  back through the inverse LeakyReLU (models/emotivoice/hifigan.py), one tensor written per step
  instead of two;
* ``both``.
Every arm runs the same full-size vocoder (random weights, weight norm folded), FP16, channels-last
2-D convolutions as the engines run them, compiled with static shapes and replayed as a CUDA graph,
on one batch of ``--rows`` rows whose frame counts spread +-30 % around ``--frames`` (masked, as the
engine's length groups run). The arms alternate for ``--rounds`` rounds so that clock drift falls
on all. Reported: each arm's median replay time per round, sentences/s, its speed-up over ``base``,
the largest difference of its audio from base's (rounding only), and each upsampling layer alone in
both forms at the batch's shapes (eager, one CUDA graph each). Only torch and numpy: it runs on the
GPU machine as it is.
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
ARMS = {"base": (False, False), "polyphase": (True, False), "activation_residual": (False, True),
        "both": (True, True)}  # name: (polyphase upsampling, residual from activation)


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


def replayer(module, inputs: tuple, cuda: bool):
    """A call of ``module(*inputs)``: one CUDA graph replay on CUDA, an eager call elsewhere."""
    if not cuda:
        return lambda: module(*inputs)
    cache = GraphCache()
    return lambda: cache.run(("module",), module, inputs)[0]


def upsampling_layers(vocoders: dict, mel: torch.Tensor, cuda: bool, repeats: int) -> list[dict]:
    """Each upsampling convolution alone in both forms, at the input shape the batch gives it."""
    inputs = []
    hooks = [up.register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach().clone()))
             for up in vocoders["base"].ups]
    with torch.inference_mode():
        vocoders["base"](mel)
    for hook in hooks:
        hook.remove()
    rows = []
    for index, x in enumerate(inputs):
        row = {"layer": index, "input_shape": list(x.shape), "stride": vocoders["base"].ups[index].stride[0]}
        outputs = {}
        for arm, source in (("transposed", "base"), ("polyphase", "polyphase")):
            up = vocoders[source].ups[index]
            with torch.inference_mode():
                run = replayer(up, (x,), cuda)
                outputs[arm] = run().float().cpu()
                row[f"{arm}_ms"] = timed(run, cuda, repeats)
        row["speedup"] = row["transposed_ms"] / row["polyphase_ms"]
        row["max_abs_diff"] = float((outputs["polyphase"] - outputs["transposed"]).abs().max())
        rows.append(row)
        print("layer", json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=32, help="batch rows (the server's length groups hold 32)")
    parser.add_argument("--frames", type=int, default=200, help="mean frames a row (200 frames: 3.2 s at 16 kHz)")
    parser.add_argument("--repeats", type=int, default=20, help="timed replays per arm and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two arms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="eager modules (CPU smoke runs)")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if args.rows < 1 or args.frames < 4 or args.rounds < 1 or args.repeats < 1:
        parser.error("--rows, --rounds and --repeats at least 1, --frames at least 4")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    dtype = torch.float16 if cuda else torch.float32
    generator = random_generator(args.seed).inference_copy()
    vocoders = {}
    for arm, (polyphase, from_activation) in ARMS.items():
        vocoders[arm] = converted_copy(generator.generator, "channels_last", polyphase=polyphase)
        vocoders[arm].residual_from_activation = from_activation
        vocoders[arm].to(args.device, dtype).eval()
    lengths = frame_lengths(args.rows, args.frames, args.seed)
    mel = torch.randn(args.rows, generator.config.n_mels, max(lengths),  # (B, n_mels, T_feats)
                      generator=torch.Generator().manual_seed(args.seed)).to(args.device, dtype)
    lengths_t = torch.tensor(lengths, device=args.device)
    audio_s = sum(lengths) * generator.config.upsample_factor / generator.config.sample_rate_hz
    report = {"what": "EmotiVoice HiFi-GAN, full-size random weights, with polyphase upsampling and the "
                      "residual read from the activation, alone and together",
              "manifest": GENERATOR_MANIFEST.name, "provenance": origin, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if cuda else platform.processor(),
              "rows": args.rows, "frame_lengths": lengths, "audio_s": audio_s, "dtype": str(dtype),
              "compiled": not args.no_compile, "cuda_graphs": cuda, "rounds": {arm: [] for arm in ARMS}}
    runs, audio = {}, {}
    for arm in ARMS:
        module = vocoders[arm] if args.no_compile else torch.compile(vocoders[arm], dynamic=False)
        started = time.perf_counter()
        with torch.inference_mode():
            runs[arm] = replayer(module, (mel, lengths_t), cuda)
            audio[arm] = runs[arm]().float().cpu()
        report[f"{arm}_first_call_s"] = time.perf_counter() - started
    report["max_abs_diff_vs_base"] = {arm: float((audio[arm] - audio["base"]).abs().max()) for arm in ARMS}
    report["audio_peak"] = float(audio["base"].abs().max())
    for round_index in range(args.rounds):
        for arm in ARMS:
            with torch.inference_mode():
                report["rounds"][arm].append(timed(runs[arm], cuda, args.repeats))
        print("round", round_index, {arm: report["rounds"][arm][-1] for arm in ARMS}, flush=True)
    for arm in ARMS:
        ms = statistics.median(report["rounds"][arm])
        report[arm] = {"median_ms": ms, "sentences_per_s": args.rows / (ms / 1000.0),
                       "audio_s_per_s": audio_s / (ms / 1000.0)}
    report["speedup_vs_base"] = {arm: report["base"]["median_ms"] / report[arm]["median_ms"] for arm in ARMS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    report["layers"] = upsampling_layers(vocoders, mel, cuda, args.repeats)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({key: report[key] for key in (*ARMS, "speedup_vs_base", "max_abs_diff_vs_base")}, indent=2))


if __name__ == "__main__":
    main()
