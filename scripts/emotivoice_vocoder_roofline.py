"""Which of EmotiVoice's HiFi-GAN convolutions are bound by memory, and which by arithmetic, on paper.

    python scripts/emotivoice_vocoder_roofline.py --out docs/results/cpu_46_emotivoice_vocoder_roofline.json

Runs the full-size vocoder (random weights, the released checkpoint's shapes) once on this CPU over
one row of ``--frames`` frames, records each convolution's shapes with forward hooks, and computes
per convolution: FP16 multiply-add FLOPs, the fewest bytes it must move (its input, output and
weights once each, FP16), their ratio (arithmetic intensity), and its floor time on each GPU of
GPU_PEAKS (the larger of FLOPs over peak and bytes over bandwidth). Summed per stage, for a batch of
``--rows`` rows. Why: it says how far the engine's vocoder is from what the card allows, and which
stages a change that saves memory traffic could speed up: only those whose floor is set by memory.
The elementwise passes between convolutions are memory traffic too and are not counted here. No GPU
is timed: a floor, not a measurement.
"""
from __future__ import annotations

import argparse
import math
import platform
from pathlib import Path

import torch
from torch import nn

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.emotivoice.checkpoints import GENERATOR_MANIFEST, random_generator

# Dense FP16 tensor-core peak and memory bandwidth of the SXM parts, from NVIDIA's data sheets.
GPU_PEAKS = {"H100 SXM": {"fp16_tflops": 989.4, "hbm_tb_per_s": 3.35},
             "H200 SXM": {"fp16_tflops": 989.4, "hbm_tb_per_s": 4.8}}
BYTES = 2  # FP16


def conv_records(vocoder: nn.Module, mel: torch.Tensor) -> list[dict]:
    """One record per convolution call: its name, stage and shapes, from forward hooks."""
    records: list[dict] = []
    names = {module: name for name, module in vocoder.named_modules()}

    def hook(module, inputs, output):
        x = inputs[0]  # (1, C_in, T_in)
        weight = module.weight  # Conv1d (C_out, C_in, K); ConvTranspose1d (C_in, C_out, K)
        macs_per_step = weight.numel()  # one multiply-add per weight per input (transposed) or output step
        steps = x.shape[-1] if isinstance(module, nn.ConvTranspose1d) else output.shape[-1]
        records.append({"name": names[module], "kind": type(module).__name__,
                        "in": list(x.shape[1:]), "out": list(output.shape[1:]), "kernel": weight.shape[-1],
                        "flops": 2 * macs_per_step * steps,
                        "activation_bytes": BYTES * (x.numel() + output.numel()),
                        "weight_bytes": BYTES * weight.numel()})

    handles = [module.register_forward_hook(hook) for module in vocoder.modules()
               if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d))]
    with torch.inference_mode():
        vocoder(mel)
    for handle in handles:
        handle.remove()
    return records


def stage_of(name: str, kernels_per_stage: int, stages: int) -> str:
    if name.startswith("ups."):
        return f"stage {name.split('.')[1]}"
    if name.startswith("resblocks."):
        return f"stage {int(name.split('.')[1]) // kernels_per_stage}"
    return "input" if name == "conv_pre" else f"output (after stage {stages - 1})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--frames", type=int, default=200, help="frames a row (200: 3.2 s at 16 kHz)")
    parser.add_argument("--rows", type=int, default=32, help="batch rows the per-stage sums are for")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    generator = random_generator(0).inference_copy()
    vocoder = generator.generator.eval()
    mel = torch.zeros(1, generator.config.n_mels, args.frames)  # (1, n_mels, T): shapes are all that count
    records = conv_records(vocoder, mel)
    stages = len(vocoder.upsample_rates)
    kernels_per_stage = len(vocoder.resblocks) // stages
    per_stage: dict[str, dict] = {}
    for record in records:
        # A batch of rows moves each row's activations but the weights once.
        flops = record["flops"] * args.rows
        moved = record["activation_bytes"] * args.rows + record["weight_bytes"]
        record["intensity_flops_per_byte"] = flops / moved
        stage = per_stage.setdefault(stage_of(record["name"], kernels_per_stage, stages),
                                     {"convolutions": 0, "gflop": 0.0, "mib_moved": 0.0, "largest_activation_mib": 0.0,
                                      **{f"{gpu} floor_ms": 0.0 for gpu in GPU_PEAKS},
                                      **{f"{gpu} memory_bound_convolutions": 0 for gpu in GPU_PEAKS}})
        stage["convolutions"] += 1
        stage["gflop"] += flops / 1e9
        stage["mib_moved"] += moved / 2 ** 20
        largest = BYTES * args.rows * max(math.prod(record["out"]), math.prod(record["in"])) / 2 ** 20
        stage["largest_activation_mib"] = max(stage["largest_activation_mib"], largest)
        for gpu, peak in GPU_PEAKS.items():
            compute_s = flops / (peak["fp16_tflops"] * 1e12)
            memory_s = moved / (peak["hbm_tb_per_s"] * 1e12)
            stage[f"{gpu} floor_ms"] += max(compute_s, memory_s) * 1e3
            stage[f"{gpu} memory_bound_convolutions"] += memory_s > compute_s
    report = {"what": "EmotiVoice HiFi-GAN convolutions on paper: FLOPs, fewest bytes moved, roofline floor "
                      "(FP16, full-size random weights; no GPU timed)",
              "manifest": GENERATOR_MANIFEST.name, "provenance": origin, "torch": torch.__version__,
              "machine": platform.processor(), "frames": args.frames, "rows": args.rows, "gpu_peaks": GPU_PEAKS,
              # Above this many FLOPs a byte a convolution is bound by arithmetic, below it by memory.
              "ridge_flops_per_byte": {gpu: peak["fp16_tflops"] / peak["hbm_tb_per_s"]
                                       for gpu, peak in GPU_PEAKS.items()},
              "per_stage": per_stage, "convolutions": records}
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
