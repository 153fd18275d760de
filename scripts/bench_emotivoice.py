"""Speed and memory of EmotiVoice's acoustic model + vocoder at full size (random weights from the
released checkpoint's manifest, models/emotivoice/data/).

    PYTHONPATH=. python scripts/bench_emotivoice.py --device cuda --out $OUT/emotivoice_h200.json
    PYTHONPATH=. python scripts/bench_emotivoice.py --device cpu --threads 2 --repeats 2 --batch 4 \\
        --text-tokens 12 --out /tmp/emotivoice_cpu.json

Light on purpose (torch and numpy only): it runs on a bare GPU machine. The batch-1 input is a
15-character Mandarin sentence as our front end makes it (43 symbols); random weights speak about
4 frames per symbol (models/emotivoice/checkpoints.py), so it lasts about 2.8 s.

Side by side in one process, median of warm runs:
* batch 1, acoustic model and vocoder timed apart: the eager FP32 port as loaded (weight norm
  computed each call), then weight norm folded in FP32 and FP16, and FP16 with torch.compile on
  the encoder, decoder and vocoder;
* the bucketed engine (models/emotivoice/engines.py: FP32 text stage per text bucket, frame stage
  per frame bucket in FP32, FP16 or BF16, each a CUDA graph; eager FP16 buckets on any device):
  batch-1 latency with the audio copied to the host, SNR against eager FP32, and sentences/s over
  batches of ``--engine-batches`` mixed-length sentences (lengths within +-30%);
* each stage's share of the batch-1 time;
* batch ``--batch`` (64) sentences/s with masked batching and peak VRAM, FP32 against FP16.
The JSON is rewritten after each section, so a run cut short still leaves its figures.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from core.revision import git_revision
from models.emotivoice.checkpoints import GENERATOR_MANIFEST, random_generator
from models.emotivoice.engines import BucketedEngine
from models.emotivoice.generator import EmotiVoiceGenerator

SENTENCE_SYMBOLS = 43  # "今天天气很好，我们一起去公园散步。" through models/emotivoice/frontend.py
LENGTH_SPREAD = 0.3  # batch rows take lengths uniformly within +-30% of --text-tokens


def make_inputs(generator: EmotiVoiceGenerator, lengths: list[int], device: str, seed: int) -> tuple:
    """(phoneme_ids, lengths, speakers, style, content) for rows of the given text lengths."""
    config = generator.config
    rng = torch.Generator().manual_seed(seed)
    steps = max(lengths)
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    ids = torch.randint(2, config.n_vocab, (len(lengths), steps), generator=rng) * (torch.arange(steps) < lengths_t[:, None])
    speakers = torch.randint(0, config.n_speaker, (len(lengths),), generator=rng)
    style = torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng))
    content = torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng))
    return tuple(t.to(device) for t in (ids, lengths_t, speakers, style, content))


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
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


def cast_inputs(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)


class StagedRun:
    """One batch through the acoustic model and the vocoder, timed stage by stage."""

    def __init__(self, generator: EmotiVoiceGenerator, inputs: tuple):
        self.generator, self.inputs = generator, inputs

    def acoustic(self):
        return self.generator.am(*self.inputs, masked=True)

    def vocoder(self, mel: torch.Tensor, frame_lengths: torch.Tensor):
        return self.generator.generator(mel.transpose(1, 2), frame_lengths)

    def measure(self, device: str, repeats: int, warmup: int) -> dict:
        with torch.inference_mode():
            out = self.acoustic()
            acoustic_ms = median_ms(self.acoustic, device, repeats, warmup)
            mel, lengths = out["mel"], out["frame_lengths"]
            vocoder_ms = median_ms(lambda: self.vocoder(mel, lengths), device, repeats, warmup)
            total_ms = median_ms(lambda: self.vocoder(*(lambda o: (o["mel"], o["frame_lengths"]))(self.acoustic())),
                                 device, repeats, warmup)
        return {"acoustic_ms": acoustic_ms, "vocoder_ms": vocoder_ms, "total_ms": total_ms,
                "frames": int(lengths.max()), "audio_s": float(lengths.max()) * self.generator.config.upsample_factor
                / self.generator.config.sample_rate_hz}


def write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False))


def build(device: str, dtype: torch.dtype, fold_weight_norm: bool, seed: int) -> EmotiVoiceGenerator:
    generator = random_generator(seed)
    if fold_weight_norm:
        generator = generator.inference_copy()
    return generator.to(device=device, dtype=dtype).eval()


def batch_section(args, dtype: torch.dtype) -> dict:
    """Sentences/s and peak VRAM of a masked batch, the model built fresh in ``dtype``."""
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    generator = build(args.device, dtype, True, args.seed)
    lengths = batch_lengths(args, args.batch)
    inputs = cast_inputs(make_inputs(generator, lengths, args.device, args.seed), dtype)
    with torch.inference_mode():
        batch_ms = median_ms(lambda: generator(*inputs, masked=True), args.device, args.repeats, args.warmup)
    section = {"batch": args.batch, "median_ms": batch_ms, "sentences_per_s": args.batch / (batch_ms / 1000.0)}
    if args.device.startswith("cuda"):
        section["peak_vram_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return section  # the model is freed with this frame, before the next dtype's is built


def snr_db(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    reference, estimate = reference.double(), estimate.double()
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - estimate).pow(2).sum().clamp_min(1e-30)))


def batch_lengths(args, batch: int) -> list[int]:
    rng = np.random.default_rng(args.seed)
    spread = max(1, int(args.text_tokens * LENGTH_SPREAD))
    return rng.integers(args.text_tokens - spread, args.text_tokens + spread + 1, size=batch).tolist()


def engine_section(args, generator: EmotiVoiceGenerator, graphs: bool, frame_dtype: torch.dtype,
                   reference: torch.Tensor) -> dict:
    """The bucketed engine (models/emotivoice/engines.py): batch-1 latency including the copy of the
    audio to the host, its SNR against eager FP32, and sentences/s over mixed-length batches."""
    # Fixed shapes per bucket: cuDNN times its kernels once. Engines only: its trial workspaces
    # would count in the eager sections' peak VRAM.
    torch.backends.cudnn.benchmark = True
    engine = BucketedEngine(generator, graphs=graphs, frame_dtype=frame_dtype)
    single = make_inputs(generator, [args.text_tokens], args.device, args.seed)
    audio = engine.synthesize(*single)["audio"][0]
    section = {"total_ms": median_ms(lambda: engine.synthesize(*single), args.device, args.repeats, args.warmup),
               "snr_vs_eager_fp32_db": snr_db(reference, audio), "same_length": audio.numel() == reference.numel()}
    for batch in args.engine_batches:
        inputs = make_inputs(generator, batch_lengths(args, batch), args.device, args.seed)
        batch_ms = median_ms(lambda batch_inputs=inputs: engine.synthesize(*batch_inputs), args.device, max(3, args.repeats // 4), 1)
        section[f"b{batch}_sentences_per_s"] = batch / (batch_ms / 1000.0)
    if args.device.startswith("cuda"):
        section["graphs_captured"] = len(engine.cache.captured) if graphs else 0
    torch.backends.cudnn.benchmark = False
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True, help="the JSON report's path")
    parser.add_argument("--text-tokens", type=int, default=SENTENCE_SYMBOLS, help="symbols of the batch-1 sentence")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--engine-batches", type=int, nargs="+", default=[64, 128, 256],
                        help="batch sizes of mixed-length sentences through the bucketed engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    half = torch.float16

    report: dict = {
        "what": "EmotiVoice acoustic model + HiFi-GAN, full-size random weights (speed and memory real, quality not)",
        "manifest": GENERATOR_MANIFEST.name, "device": torch.cuda.get_device_name() if cuda else platform.processor(),
        "torch": torch.__version__, "git_revision": git_revision(Path(__file__).resolve().parents[1]), "text_tokens": args.text_tokens,
        "repeats": args.repeats, "batch1": {}, "errors": {},
    }
    single = [args.text_tokens]
    variants = [("eager_fp32", torch.float32, False), ("eager_fp32_folded", torch.float32, True),
                ("eager_fp16_folded", half, True)]
    for name, dtype, folded in variants:
        generator = build(args.device, dtype, folded, args.seed)
        inputs = cast_inputs(make_inputs(generator, single, args.device, args.seed), dtype)
        report["batch1"][name] = StagedRun(generator, inputs).measure(args.device, args.repeats, args.warmup)
        write(args.out, report)
        del generator

    fp32 = build(args.device, torch.float32, True, args.seed)
    with torch.inference_mode():
        reference = fp32(*make_inputs(fp32, single, args.device, args.seed), masked=True)["audio"][0].float().cpu()
    engines = [("engine_eager_fp16", False, half)]
    if cuda:
        engines += [("engine_graphs_fp32", True, torch.float32), ("engine_graphs_fp16", True, half),
                    ("engine_graphs_bf16", True, torch.bfloat16)]
    report["engines"] = {}
    for name, graphs, frame_dtype in engines:
        try:
            report["engines"][name] = engine_section(args, fp32, graphs, frame_dtype, reference)
        except (RuntimeError, ValueError) as error:
            report["errors"][name] = f"{type(error).__name__}: {error}"
        write(args.out, report)
    del fp32
    report["engine_speedup_vs_eager_fp32"] = {name: report["batch1"]["eager_fp32"]["total_ms"] / figures["total_ms"]
                                              for name, figures in report["engines"].items()}
    write(args.out, report)

    generator = build(args.device, half, True, args.seed)
    inputs = cast_inputs(make_inputs(generator, single, args.device, args.seed), half)
    if not args.no_compile:
        try:
            for module in (generator.am.encoder, generator.am.decoder, generator.generator):
                module.compile(dynamic=False)
            report["batch1"]["compiled_fp16"] = StagedRun(generator, inputs).measure(args.device, args.repeats,
                                                                                      args.warmup)
        except Exception as error:  # an inductor failure is a figure we lack, not a failed benchmark
            report["errors"]["compiled_fp16"] = f"{type(error).__name__}: {error}"
        write(args.out, report)
    del generator

    baseline = report["batch1"]["eager_fp32"]["total_ms"]
    report["speedup_vs_eager_fp32"] = {name: baseline / figures["total_ms"] for name, figures in report["batch1"].items()}
    report["stage_share"] = {name: {"acoustic": f["acoustic_ms"] / (f["acoustic_ms"] + f["vocoder_ms"]),
                                    "vocoder": f["vocoder_ms"] / (f["acoustic_ms"] + f["vocoder_ms"])}
                             for name, f in report["batch1"].items() if "acoustic_ms" in f}
    write(args.out, report)

    report["batched"] = {"fp32": batch_section(args, torch.float32), "fp16": batch_section(args, half)}
    if cuda:
        report["fp16_peak_vram_of_fp32"] = (report["batched"]["fp16"]["peak_vram_mib"]
                                            / report["batched"]["fp32"]["peak_vram_mib"])
    write(args.out, report)
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
