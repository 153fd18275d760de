"""Conv-layout A/B on convolutional vocoders: every Conv1d/ConvTranspose1d as F.conv1d over NCW
tensors against the same convolution as a 2-D one over (N, C, 1, T) in channels-last
(models/conv_layout.py), everything else equal.

    # H200: full-size random weights, batch 1 and 64 (Kokoro 16), FP32/FP16, eager and CUDA graphs
    PYTHONPATH=. python scripts/bench_conv_layout.py --device cuda --out $OUT/conv_layout_h200.json
    # the same script end to end on tiny sizes, in seconds (checks it before a GPU call)
    PYTHONPATH=. python scripts/bench_conv_layout.py --device cpu --quick --out /tmp/conv_layout_cpu.json

Light on purpose (torch only): it runs on a bare GPU machine. The vocoders, each alone:
* emotivoice: the HiFi-GAN of the released checkpoint's manifest (models/emotivoice/checkpoints.py
  ``random_generator``, weight norm as loaded), mel frames in;
* kokoro: the whole decoder (AdaIN blocks, iSTFTNet generator, STFT as convolutions) of the
  official config (models/kokoro/data/manifest_official.json), torch's default initialisation as
  scripts/bench_kokoro.py's random weights, no SineGen noise;
* piper: the HiFi-GAN of a medium voice (VitsHyperParams' defaults), torch's default initialisation.
Batch rows have one length and run unmasked; inputs are random with fixed seeds.

For each vocoder, batch, dtype, layout (``--layouts``; models.conv_layout.CONV_LAYOUTS by default)
and mode (eager; on CUDA also CUDA-graph replay through models/cuda_graphs.py): the median of warm
repeats in ms, sentences/s, audio seconds per second, the SNR against the unconverted module in
eager FP32 on the same device and against the ncw variant of the same dtype and mode (what the
layout alone changes), peak VRAM; and per layout, the layout copies one forward makes
(models.conv_layout.layout_copies). FP16 is the module's weights and buffers in float16; Kokoro's
decoder runs under autocast as well, as its engine runs it (exp of the log-magnitudes and sums stay
FP32; none of its engine's FP32 islands, so on random weights its FP16 SNR against FP32 reads
near 0 dB: read its FP16 rows for speed, and ``snr_vs_ncw_db`` for what the layout changes).
``torch.backends.cudnn.benchmark`` is on for every variant unless ``--no-cudnn-benchmark``;
FP32 convolutions use TF32 where torch's defaults allow it (recorded). The JSON is rewritten after
each vocoder, so a run cut short still leaves its figures.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.conv_layout import CONV_LAYOUTS, converted_copy, layout_copies
from models.cuda_graphs import GraphCache
from models.emotivoice.checkpoints import GENERATOR_MANIFEST, random_generator, read_manifest
from models.emotivoice.config import GeneratorConfig
from models.emotivoice.hifigan import HifiganGenerator
from models.kokoro.config import IstftNetSize, KokoroConfig
from models.kokoro.decoder import Decoder
from models.piper.vits import HifiGanGenerator, VitsHyperParams
from models.precision import waveform_snr_db

FAMILIES = ("emotivoice", "kokoro", "piper")
KOKORO_MANIFEST = REPO_ROOT / "models" / "kokoro" / "data" / "manifest_official.json"
PIPER_SAMPLE_RATE_HZ = 22050  # Piper medium voices, whose HiFi-GAN VitsHyperParams' defaults describe
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
SECONDS_PER_ITEM = 3.0  # audio per batch row: about one sentence
QUICK_SECONDS_PER_ITEM = 0.25


@dataclass
class Vocoder:
    """One family's vocoder as the family holds it, and how to feed it."""

    module: nn.Module
    sample_rate_hz: int
    samples_per_frame: int
    batches: tuple[int, ...]
    make_inputs: Callable[[int, int, torch.Generator], tuple[torch.Tensor, ...]]  # (batch, frames, rng) -> inputs
    fp16_autocast: bool = False


def emotivoice_vocoder(quick: bool, seed: int) -> Vocoder:
    if quick:  # models/emotivoice/tiny.py's vocoder sizes on the released config
        raw = read_manifest(GENERATOR_MANIFEST)["config_used"]
        config = dataclasses.replace(
            GeneratorConfig.from_dict(raw, raw["n_vocab"], raw["n_speaker"]), upsample_initial_channel=32,
            upsample_rates=(4, 4), upsample_kernel_sizes=(8, 8), resblock_kernel_sizes=(3,),
            resblock_dilation_sizes=((1, 3, 5),))
        torch.manual_seed(seed)
        module = HifiganGenerator(config)
    else:
        generator = random_generator(seed)
        config, module = generator.config, generator.generator

    def make_inputs(batch: int, frames: int, rng: torch.Generator):
        return (torch.randn(batch, config.n_mels, frames, generator=rng),)  # (B, n_mels, F)

    return Vocoder(module.eval(), config.sample_rate_hz, config.upsample_factor, (1, 4) if quick else (1, 64),
                   make_inputs)


def kokoro_vocoder(quick: bool, seed: int) -> Vocoder:
    config = KokoroConfig.from_dict(json.loads(KOKORO_MANIFEST.read_text(encoding="utf-8"))["config"])
    if quick:  # models/kokoro/tiny.py's decoder sizes
        config = dataclasses.replace(
            config, hidden_dim=24, decoder_hidden=40, decoder_asr_res=8,
            istftnet=IstftNetSize(upsample_rates=(2, 3), upsample_kernel_sizes=(4, 5), upsample_initial_channel=16,
                                  resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
                                  n_fft=8, hop_length=2))
    torch.manual_seed(seed)
    module = Decoder(config)

    def make_inputs(batch: int, frames: int, rng: torch.Generator):
        asr = torch.randn(batch, config.hidden_dim, frames, generator=rng)  # (B, H, F)
        # A voiced contour: 100-200 Hz per row, +-20 Hz over the utterance, at twice the frame rate
        base_hz = 100 + 100 * torch.rand(batch, 1, generator=rng)
        f0_curve = base_hz + 20 * torch.sin(torch.linspace(0, 2 * math.pi, 2 * frames)).unsqueeze(0)  # (B, 2F)
        energy = torch.randn(batch, 2 * frames, generator=rng)  # (B, 2F)
        style = torch.randn(batch, config.style_dim, generator=rng) * 0.3  # as scripts/bench_kokoro.py's packs
        return asr, f0_curve, energy, style

    return Vocoder(module.eval(), config.sample_rate_hz, config.samples_per_frame, (1, 4) if quick else (1, 16),
                   make_inputs, fp16_autocast=True)


def piper_vocoder(quick: bool, seed: int) -> Vocoder:
    hp = VitsHyperParams(num_symbols=1)  # the symbol table is not the decoder's
    if quick:  # models/piper/tiny.py's decoder sizes
        hp = dataclasses.replace(hp, latent_channels=8, upsample_initial_channel=16, upsample_rates=(4, 2),
                                 upsample_kernel_sizes=(8, 4), resblock_kernel_sizes=(3,), resblock_dilations=((1, 2),))
    torch.manual_seed(seed)
    module = HifiGanGenerator(hp)

    def make_inputs(batch: int, frames: int, rng: torch.Generator):
        return (torch.randn(batch, hp.latent_channels, frames, generator=rng),)  # (B, C_lat, F): the flow's output

    return Vocoder(module.eval(), PIPER_SAMPLE_RATE_HZ, hp.hop_length, (1, 4) if quick else (1, 64), make_inputs)


BUILDERS = {"emotivoice": emotivoice_vocoder, "kokoro": kokoro_vocoder, "piper": piper_vocoder}


class Autocast(nn.Module):
    """``module`` under autocast to ``dtype``; the cast cache off, as CUDA-graph capture needs."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, *inputs):
        device_type = inputs[0].device.type
        with torch.autocast(device_type, dtype=self.dtype, cache_enabled=False):
            return self.module(*inputs)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(run: Callable[[], object], device: str, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        run()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def cast_inputs(inputs: tuple[torch.Tensor, ...], device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in inputs)


def variant(vocoder: Vocoder, layout: str, dtype: torch.dtype, device: str) -> nn.Module:
    module = converted_copy(vocoder.module, layout).to(device=device, dtype=dtype).eval()
    return Autocast(module, dtype) if dtype != torch.float32 and vocoder.fp16_autocast else module


def snr_db(audio: torch.Tensor, reference: torch.Tensor | None) -> float | None:
    """SNR in dB (capped, models/precision.py); None without a reference or where either holds inf/NaN."""
    if reference is None or not (torch.isfinite(audio).all() and torch.isfinite(reference).all()):
        return None
    return waveform_snr_db(audio, reference)


def time_variant(module: nn.Module, inputs: tuple, mode: str, args) -> tuple[dict, torch.Tensor]:
    """One (module, batch, mode) figure and the audio on the host; the CUDA graph's memory is
    freed before returning."""
    device = args.device
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cache = GraphCache() if mode == "graphs" else None

    def run() -> torch.Tensor:
        return module(*inputs) if cache is None else cache.run(("vocoder",), module, inputs)[0]

    with torch.inference_mode():
        audio = run().float().cpu()  # also the graph's capture, outside the timing
        elapsed_ms = median_ms(run, device, args.repeats, args.warmup)
    row = {"median_ms": elapsed_ms, "non_finite": not bool(torch.isfinite(audio).all())}
    if device == "cuda":
        row["peak_vram_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return row, audio


def bench_vocoder(vocoder: Vocoder, args) -> dict:
    device, seconds = args.device, args.seconds or (QUICK_SECONDS_PER_ITEM if args.quick else SECONDS_PER_ITEM)
    frames = max(1, round(seconds * vocoder.sample_rate_hz / vocoder.samples_per_frame))
    item_seconds = frames * vocoder.samples_per_frame / vocoder.sample_rate_hz
    batches = args.batches or vocoder.batches
    inputs = {batch: vocoder.make_inputs(batch, frames, torch.Generator().manual_seed(args.seed + batch))
              for batch in batches}
    section: dict = {
        "sample_rate_hz": vocoder.sample_rate_hz, "frames": frames, "audio_seconds_per_item": item_seconds,
        "parameters": sum(p.numel() for p in vocoder.module.parameters()),
        "convolutions": sum(isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) for m in vocoder.module.modules()),
        "input_shapes": {f"b{b}": [list(t.shape) for t in batch_inputs] for b, batch_inputs in inputs.items()},
        "layout_copies_fp32": {"batch": batches[0]}, "runs": [], "errors": {},
    }
    reference_module = vocoder.module.to(device)
    with torch.inference_mode():
        references = {batch: reference_module(*cast_inputs(batch_inputs, device, torch.float32)).float().cpu()
                      for batch, batch_inputs in inputs.items()}
    vocoder.module.cpu()
    single = cast_inputs(inputs[batches[0]], device, torch.float32)
    for layout in args.layouts:
        converted = variant(vocoder, layout, torch.float32, device)
        counts = layout_copies(converted, lambda: converted(*single))
        counts["copied_at"] = list(dict.fromkeys(counts["copied_at"]))  # each place once, in call order
        section["layout_copies_fp32"][layout] = counts
    modes = ("eager", "graphs") if device == "cuda" else ("eager",)
    ncw_audio: dict[tuple, torch.Tensor] = {}  # (batch, dtype, mode) -> the ncw variant's audio
    for dtype_name, dtype in DTYPES.items():
        for layout in args.layouts:
            module = variant(vocoder, layout, dtype, device)
            for batch, batch_inputs in inputs.items():
                cast = cast_inputs(batch_inputs, device, dtype)
                for mode in modes:
                    key = f"b{batch}_{dtype_name}_{layout}_{mode}"
                    try:
                        row, audio = time_variant(module, cast, mode, args)
                    except (RuntimeError, ValueError) as error:  # one variant's failure is a figure we lack
                        section["errors"][key] = f"{type(error).__name__}: {error}"
                        continue
                    if layout == "ncw":
                        ncw_audio[(batch, dtype_name, mode)] = audio
                    row.update(batch=batch, dtype=dtype_name, layout=layout, mode=mode,
                               snr_vs_eager_fp32_db=snr_db(audio, references[batch]),
                               snr_vs_ncw_db=snr_db(audio, ncw_audio.get((batch, dtype_name, mode))),
                               sentences_per_s=batch / (row["median_ms"] / 1000.0),
                               audio_seconds_per_s=batch * item_seconds / (row["median_ms"] / 1000.0))
                    section["runs"].append(row)
                    print(f"{key}: {row['median_ms']:.3f} ms, SNR {row['snr_vs_eager_fp32_db']} dB vs eager FP32, "
                          f"{row['snr_vs_ncw_db']} dB vs ncw", flush=True)
            del module
    section["speedup_over_ncw"] = speedups(section["runs"])
    return section


def speedups(runs: list[dict]) -> dict:
    """{b1_fp16_graphs: {channels_last: ncw ms / its ms, ...}} for every layout measured beside ncw."""
    table: dict = {}
    ms = {(r["batch"], r["dtype"], r["mode"], r["layout"]): r["median_ms"] for r in runs}
    for (batch, dtype, mode, layout), value in ms.items():
        baseline = ms.get((batch, dtype, mode, "ncw"))
        if layout != "ncw" and baseline is not None:
            table.setdefault(f"b{batch}_{dtype}_{mode}", {})[layout] = baseline / value
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {','.join(FAMILIES)}")
    parser.add_argument("--layouts", default=",".join(CONV_LAYOUTS),
                        help=f"comma-separated, of {','.join(CONV_LAYOUTS)}")
    parser.add_argument("--quick", action="store_true", help="tiny vocoders, short items, batches 1 and 4")
    parser.add_argument("--seconds", type=float, default=None,
                        help=f"audio per batch row (default {SECONDS_PER_ITEM}, --quick {QUICK_SECONDS_PER_ITEM})")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="batch sizes for every vocoder (default 1 and 64, Kokoro 1 and 16; --quick 1 and 4)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cudnn-benchmark", action="store_true", help="leave cuDNN's heuristic kernel choice")
    parser.add_argument("--out", type=Path, required=True, help="the JSON report's path")
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    families = [name.strip() for name in args.families.split(",") if name.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"--families {unknown}: choose from {list(FAMILIES)}")
    layouts = {name.strip() for name in args.layouts.split(",") if name.strip()}
    if not layouts or layouts - set(CONV_LAYOUTS):
        parser.error(f"--layouts {sorted(layouts)}: choose from {list(CONV_LAYOUTS)}")
    args.layouts = [name for name in CONV_LAYOUTS if name in layouts]  # ncw first: the others' SNR is against it
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the first call captures the CUDA graph and tunes cuDNN")
    torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    cuda = args.device == "cuda"
    report: dict = {
        "what": "conv layout A/B on vocoders (models/conv_layout.py), random weights: speed real, audio not",
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "machine": platform.node(), "torch": torch.__version__, "provenance": origin,
        "quick": args.quick, "batches": args.batches, "threads": args.threads, "repeats": args.repeats,
        "warmup": args.warmup,
        "layouts": args.layouts, "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_version": torch.backends.cudnn.version() if cuda else None,
        "families": {},
    }
    for name in families:
        print(f"== {name}", flush=True)
        report["families"][name] = bench_vocoder(BUILDERS[name](args.quick, args.seed), args)
        write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    print(json.dumps({name: section["speedup_over_ncw"] for name, section in report["families"].items()}, indent=2))


if __name__ == "__main__":
    main()
