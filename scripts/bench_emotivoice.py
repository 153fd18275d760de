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
  batches of ``--engine-batches`` mixed-length sentences (lengths within +-30%); with
  ``--compiled-engine`` also the FP16 engine with its frame stage compiled (``engine_graphs_fp16_compiled``;
  with ``--pageable-engine`` the same with its audio copied to pageable host memory, ``_pageable``;
  with ``--autotune-engine`` compiled in torch.compile's max-autotune mode, ``_autotune``, minutes a
  bucket);
  with ``--fused-engine`` the FP16 engine with its vocoder as fused Triton convolutions and its mel
  half compiled (``engine_graphs_fp16_fused``); with ``--lite-vocoder-engine`` the compiled FP16
  engine with a HiFi-GAN of the Lite student's width, randomly initialised
  (``engine_graphs_fp16_compiled_lite_vocoder``: what the distilled student costs, no SNR);
  ``--grouped-engine G:R`` adds the compiled engine with each batch's frame stage in up to G length
  groups of at least R rows (``_groups<G>_rows<R>``), ``--dynamic-engine`` each of those compiled with
  symbolic sizes (``_dynamic``), ``--frame-buckets`` each of those once per frame bucket (``_fb<N>``),
  ``--epilogue-engine`` each of those with its vocoder's block convolutions in cuDNN's epilogue
  (``_epilogue``, models/epilogue_hifigan.py; its cuDNN graphs built for one shape each, and with
  ``--epilogue-kernel-cache`` also shape-agnostic ones sharing a kernel cache, ``_epilogue_kernel_cache``;
  each reports what its graphs cost to build, ``cudnn_graphs``);
  ``--only-engines`` keeps the named ones (an A/B);
* each stage's share of the batch-1 time;
* batch ``--batch`` (64) sentences/s with masked batching and peak VRAM, FP32 against FP16. This
  section runs first, in a process that has allocated nothing yet: engines measured before it left
  blocks (captured graphs' pools, library workspaces) that counted in both peaks (session 8's run:
  +897 MiB in each). ``baseline_mib`` is what was allocated when the model was built; the ratio is
  taken over the peaks above it.
The JSON is rewritten after each section, so a run cut short still leaves its figures.

``--mode profile`` says where the bucketed FP16 engine's time goes: for each ``--engine-batches``
size and batch 1, the text stage (FP32), the acoustic frame side (Gaussian upsampling, decoder, mel
projection) and the vocoder, each replayed alone as a CUDA graph at the engine's shapes (median
ms), and the heaviest kernels of each part from torch.profiler (eager, same kernels without the
launch gaps). On a CPU the parts run eagerly in FP32 and the profiler lists operators (a smoke test):

    PYTHONPATH=. python scripts/bench_emotivoice.py --mode profile --device cuda --engine-batches 64 \
        --out $OUT/emotivoice_profile.json

``--mode end-to-end`` times what a request costs from text to audio instead, through the whole
voice (front end, SimBERT style encoder with its prompt cache, acoustic model, vocoder; full-size
random weights), batch 1, each stage alone and its share of the total:

    PYTHONPATH=. python scripts/bench_emotivoice.py --mode end-to-end --device cuda --out $OUT/emotivoice_e2e.json
    PYTHONPATH=. python scripts/bench_emotivoice.py --mode end-to-end --device cpu --threads 2 --repeats 5 \
        --out /tmp/emotivoice_e2e_cpu.json

* ``frontend_ms``: text -> phoneme ids (jieba + pypinyin for Mandarin, CMUdict for English: this
  mode needs the front end's packages besides torch, numpy and transformers);
* ``style_cold_ms``: the prompt and the sentence both new: one BERT call on the two texts;
  ``style_warm_ms``: the emotion prompt cached (what a service sees after its first request per
  emotion), the sentence new: one BERT call on the sentence (its content embedding);
  ``style_cached_ms``: both cached (a repeated sentence): no BERT call;
* ``acoustic_ms`` and ``vocoder_ms`` (FP32, weight norm folded as the voice holds it);
* ``shares``: each stage over frontend + style (warm) + acoustic + vocoder, the steady state of a
  service; ``synthesize_ms``: the voice's own ``synthesize`` on a new sentence with a cached prompt.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from core.publishing import add_allow_dirty_argument, publication_or_exit
from models.emotivoice.checkpoints import GENERATOR_MANIFEST, random_generator
from models.cuda_graphs import GraphCache, as_tuple
from models.cudnn_epilogue import build_stats, build_stats_since, use_kernel_cache
from models.emotivoice.engines import FRAME_BUCKET, TEXT_BUCKETS, BucketedEngine, FrameStage, bucket_of
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.prompts import EMOTION_PROMPTS
from models.emotivoice.vocoder_student import build_lite_vocoder
from models.interface import SynthesisRequest, VoiceCondition

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


def with_lite_vocoder(generator: EmotiVoiceGenerator, seed: int) -> EmotiVoiceGenerator:
    """A copy of ``generator`` whose HiFi-GAN is the Lite student's width (models/emotivoice/vocoder_student.py),
    randomly initialised: what the distillation stage's student costs, not how it sounds."""
    reference = next(generator.parameters())
    with torch.random.fork_rng(devices=[]):  # the Lite vocoder's initial weights, the caller's RNG untouched
        torch.manual_seed(seed)
        lite = EmotiVoiceGenerator(generator.config)
        lite.am.load_state_dict(generator.am.state_dict())
        lite.generator = build_lite_vocoder(generator.generator, {})
    return lite.to(device=reference.device, dtype=reference.dtype).eval()


def batch_section(args, dtype: torch.dtype) -> dict:
    """Sentences/s and peak VRAM of a masked batch, the model built fresh in ``dtype``."""
    baseline_mib = 0.0
    if args.device.startswith("cuda"):
        gc.collect()  # the previous dtype's model, if a reference cycle still holds it
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        baseline_mib = torch.cuda.memory_allocated() / 2 ** 20
    generator = build(args.device, dtype, True, args.seed)
    lengths = batch_lengths(args, args.batch)
    inputs = cast_inputs(make_inputs(generator, lengths, args.device, args.seed), dtype)
    with torch.inference_mode():
        batch_ms = median_ms(lambda: generator(*inputs, masked=True), args.device, args.repeats, args.warmup)
    section = {"batch": args.batch, "median_ms": batch_ms, "sentences_per_s": args.batch / (batch_ms / 1000.0)}
    if args.device.startswith("cuda"):
        section["peak_vram_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
        section["baseline_mib"] = baseline_mib
        section["peak_vram_over_baseline_mib"] = section["peak_vram_mib"] - baseline_mib
    return section  # the model is freed with this frame, before the next dtype's is built


def snr_db(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    reference, estimate = reference.double(), estimate.double()
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - estimate).pow(2).sum().clamp_min(1e-30)))


def batch_lengths(args, batch: int) -> list[int]:
    rng = np.random.default_rng(args.seed)
    spread = max(1, int(args.text_tokens * LENGTH_SPREAD))
    return rng.integers(args.text_tokens - spread, args.text_tokens + spread + 1, size=batch).tolist()


def engine_section(args, generator: EmotiVoiceGenerator, spec: EngineSpec, reference: torch.Tensor,
                   sorted_chunks: tuple[int, ...] = ()) -> dict:
    """The bucketed engine of ``spec`` (models/emotivoice/engines.py): batch-1 latency including the copy of the
    audio to the host, its SNR against eager FP32, and sentences/s over mixed-length batches.
    ``sorted_chunks``: also the largest batch's sentences sorted by length and sent in batches of
    each chunk size, as a batcher that groups its queue by length would send them."""
    # Fixed shapes per bucket: cuDNN times its kernels once. Engines only: its trial workspaces
    # would count in the eager sections' peak VRAM.
    torch.backends.cudnn.benchmark = True
    use_kernel_cache(spec.cudnn_kernel_cache)
    built_before = build_stats()
    engine = BucketedEngine(generator, **spec.engine_arguments())
    single = make_inputs(generator, [args.text_tokens], args.device, args.seed)
    started = time.perf_counter()
    audio = engine.synthesize(*single)["audio"][0]
    first_calls_s = {"b1": time.perf_counter() - started}  # compiles and captures: what a server's warm-up pays
    section = {"total_ms": median_ms(lambda: engine.synthesize(*single), args.device, args.repeats, args.warmup),
               "snr_vs_eager_fp32_db": snr_db(reference, audio), "same_length": audio.numel() == reference.numel(),
               "first_call_s": first_calls_s}
    for batch in args.engine_batches:
        inputs = make_inputs(generator, batch_lengths(args, batch), args.device, args.seed)
        started = time.perf_counter()
        engine.synthesize(*inputs)
        first_calls_s[f"b{batch}"] = time.perf_counter() - started
        batch_ms = median_ms(lambda batch_inputs=inputs: engine.synthesize(*batch_inputs), args.device, max(3, args.repeats // 4), 1)
        section[f"b{batch}_sentences_per_s"] = batch / (batch_ms / 1000.0)
    pool = sorted(batch_lengths(args, max(args.engine_batches)))
    for chunk in sorted_chunks:
        batches = [make_inputs(generator, pool[start:start + chunk], args.device, args.seed + start)
                   for start in range(0, len(pool), chunk)]
        pool_ms = median_ms(lambda: [engine.synthesize(*rows) for rows in batches], args.device,
                            max(3, args.repeats // 4), 1)
        section[f"sorted{len(pool)}_by{chunk}_sentences_per_s"] = len(pool) / (pool_ms / 1000.0)
    if args.kernel_profile:
        # The largest batch once more, its shapes already captured: where a warm engine's time goes.
        largest = make_inputs(generator, batch_lengths(args, max(args.engine_batches)), args.device, args.seed)
        section[f"kernels_b{max(args.engine_batches)}"] = top_kernels(lambda: engine.synthesize(*largest),
                                                                      args.device.startswith("cuda"), count=25)
    if args.device.startswith("cuda"):
        section["graphs_captured"] = len(engine.cache.captured) if spec.graphs else 0
    if spec.vocoder_kernels == "cudnn":  # what its cuDNN graphs cost to build, within first_call_s
        section["cudnn_graphs"] = build_stats_since(built_before)
    torch.backends.cudnn.benchmark = False
    return section


def top_kernels(run: Callable[[], object], cuda: bool, count: int = 12) -> list[dict]:
    """The ``count`` kernels (CPU: operators) with the most device time over one call of ``run``
    (already warm)."""
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as trace:
        run()
        if cuda:
            torch.cuda.synchronize()
    time_of = (lambda event: event.device_time_total) if cuda else (lambda event: event.self_cpu_time_total)
    events = [event for event in trace.key_averages() if time_of(event) > 0]
    total_us = sum(time_of(event) for event in events)
    events.sort(key=time_of, reverse=True)
    return [{"kernel": event.key[:120], "calls": event.count, "ms": time_of(event) / 1000.0,
             "share": time_of(event) / total_us} for event in events[:count]]


def profile_section(args, batch: int) -> dict:
    """The FP16 engine's three parts at ``batch`` mixed-length rows (module docstring)."""
    cuda = args.device.startswith("cuda")
    generator = build(args.device, torch.float32, True, args.seed)
    engine = BucketedEngine(generator, graphs=cuda, frame_dtype=torch.float16 if cuda else torch.float32)
    lengths = [args.text_tokens] if batch == 1 else batch_lengths(args, batch)
    engine_inputs = make_inputs(generator, lengths, args.device, args.seed)
    ids, phoneme_lengths, speakers, style, content = engine_inputs
    text = bucket_of(ids.shape[1], TEXT_BUCKETS, "text length")
    ids = torch.nn.functional.pad(ids, (0, text - ids.shape[1]))
    # On a CPU (a smoke test of this code) the parts run eagerly: graphs are CUDA's.
    cache = GraphCache() if cuda else None
    run_part = cache.run if cuda else (lambda key, module, inputs: as_tuple(module(*inputs)))
    torch.backends.cudnn.benchmark = True
    with torch.inference_mode():
        text_inputs = (ids, phoneme_lengths, speakers, style, content, torch.ones(batch, 1, device=args.device))
        hidden, used_durations, _ = run_part(("text_stage",), engine.text_stage, text_inputs)
        frame_lengths = used_durations.sum(dim=-1)
        frames = math.ceil(int(frame_lengths.max()) / FRAME_BUCKET) * FRAME_BUCKET
        stage = FrameStage(engine.frame_model, frames).eval()  # the engine's frame stage, in its two halves
        mel, = run_part(("acoustic_frames",), stage.mel, (hidden, used_durations, phoneme_lengths))
        parts = {"text_stage": (engine.text_stage, text_inputs),
                 "acoustic_frames": (stage.mel, (hidden, used_durations, phoneme_lengths)),
                 "vocoder": (stage.vocode, (mel, frame_lengths))}
        section = {"rows": batch, "text_bucket": text, "frame_bucket": frames,
                   "mean_frames": float(frame_lengths.float().mean())}
        for name, (module, inputs) in parts.items():
            section[f"{name}_ms"] = median_ms(lambda m=module, i=inputs, n=name: run_part((n,), m, i),
                                              args.device, args.repeats, args.warmup)
        # The whole engine on the same rows: the parts plus padding, the host sync and the copy to the host.
        section["engine_ms"] = median_ms(lambda: engine.synthesize(*engine_inputs), args.device, args.repeats,
                                         args.warmup)
        total = sum(section[f"{name}_ms"] for name in parts)
        section["shares"] = {name: section[f"{name}_ms"] / total for name in parts}
        section["kernels"] = {name: top_kernels(lambda m=module, i=inputs: m(*i), cuda)
                              for name, (module, inputs) in parts.items()}
    torch.backends.cudnn.benchmark = False
    return section


class EngineSpec(NamedTuple):
    """One bucketed-engine configuration the report measures (``BucketedEngine``'s arguments)."""
    name: str
    graphs: bool
    frame_dtype: torch.dtype
    conv_layout: str | None = None
    compile_frames: bool = False
    vocoder_kernels: str = "torch"
    lite_vocoder: bool = False  # the Lite student's width (random weights: speed only, no SNR to report)
    compile_mode: str | None = None
    pinned_output: bool = True
    fold_dilation: bool = False
    frame_groups: int = 1
    min_group_rows: int = 1
    compile_dynamic: bool = False
    frame_bucket: int = FRAME_BUCKET
    cudnn_kernel_cache: bool = False  # vocoder_kernels="cudnn": shape-agnostic graphs (models.cudnn_epilogue)

    def engine_arguments(self) -> dict:
        """The fields that are ``BucketedEngine``'s keyword arguments."""
        return {key: value for key, value in self._asdict().items()
                if key not in ("name", "lite_vocoder", "cudnn_kernel_cache")}


SORTED_CHUNK_ENGINES = ("engine_eager_fp16", "engine_graphs_fp16", "engine_graphs_fp16_compiled",
                        "engine_graphs_fp16_fused", "engine_graphs_fp16_compiled_lite_vocoder")
E2E_SENTENCES = ("今天天气很好，我们一起去公园散步。", "The train to the coast leaves at a quarter past nine.")
E2E_EMOTION = "开心"


def timed_ms(run: Callable[[int], object], setup: Callable[[int], object], device: str, repeats: int,
             warmup: int) -> float:
    """Median ms of ``run(i)``, each call after an untimed ``setup(i)`` (cache state, say)."""
    times = []
    for index in range(warmup + repeats):
        setup(index)
        synchronize(device)
        start = time.perf_counter()
        run(index)
        synchronize(device)
        if index >= warmup:
            times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def end_to_end_section(args, voice, text: str) -> dict:
    """One sentence from text to audio, stage by stage (module docstring)."""
    prompts, generator, device = voice.prompts, voice.generator, args.device
    # A service's sentences are new to the front end and to the content-embedding cache: each run takes its own.
    new_texts = [f"{text}{i}" for i in range(args.warmup + args.repeats)]

    def nothing(_):
        return None

    figures = {"text": text, "frontend_ms": timed_ms(lambda i: voice.text_to_utterances(new_texts[i]), nothing,
                                                     device, args.repeats, args.warmup)}
    utterances = voice.text_to_utterances(text)
    request = SynthesisRequest.from_utterances(utterances[:1], voice=VoiceCondition(emotion=E2E_EMOTION))
    figures["symbols"] = int(request.phoneme_lengths[0])
    prompt = EMOTION_PROMPTS[E2E_EMOTION]  # what the style encoder reads
    figures["style_cold_ms"] = timed_ms(lambda i: prompts.embed([prompt, new_texts[i]]),
                                        lambda i: prompts.clear(), device, args.repeats, args.warmup)
    prompts.clear()
    figures["style_warm_ms"] = timed_ms(lambda i: prompts.embed([prompt, new_texts[i]]),
                                        lambda i: (prompts.clear(), prompts.embed([prompt])), device,
                                        args.repeats, args.warmup)
    figures["style_cached_ms"] = timed_ms(lambda i: prompts.embed([prompt, text]),
                                          lambda i: prompts.embed([prompt, text]), device, args.repeats, args.warmup)
    calls = prompts.calls
    prompts.embed([prompt, text])
    figures["bert_calls_when_cached"] = prompts.calls - calls

    style = voice.style_embeddings(request).to(device)
    content = prompts.embed(voice.sentence_texts(request)).to(device)
    inputs = (request.phoneme_ids.to(device), request.phoneme_lengths.to(device),
              torch.zeros(1, dtype=torch.long, device=device), style, content)
    with torch.inference_mode():
        out = generator.am(*inputs, masked=True)
        mel, frame_lengths = out["mel"], out["frame_lengths"]
        figures["acoustic_ms"] = timed_ms(lambda i: generator.am(*inputs, masked=True), nothing, device,
                                          args.repeats, args.warmup)
        figures["vocoder_ms"] = timed_ms(lambda i: generator.generator(mel.transpose(1, 2), frame_lengths), nothing,
                                         device, args.repeats, args.warmup)
    if device.startswith("cuda"):
        # What a GPU service runs after the style stage: the bucketed engine (graphs, FP16 frames).
        engine = BucketedEngine(generator, graphs=True, frame_dtype=torch.float16)
        figures["engine_ms"] = timed_ms(lambda i: engine.synthesize(*inputs), nothing, device, args.repeats,
                                        args.warmup)
        figures["total_with_engine_ms"] = figures["frontend_ms"] + figures["style_warm_ms"] + figures["engine_ms"]
    figures["frames"] = int(frame_lengths[0])
    figures["audio_s"] = figures["frames"] * voice.hop_length / voice.sample_rate_hz

    def synthesize_new(i):
        fresh = voice.text_to_utterances(new_texts[i])[:1]
        voice.synthesize(SynthesisRequest.from_utterances(fresh, voice=VoiceCondition(emotion=E2E_EMOTION)))

    figures["synthesize_ms"] = timed_ms(synthesize_new, lambda i: prompts.embed([prompt]), device, args.repeats,
                                        args.warmup)
    stages = ("frontend_ms", "style_warm_ms", "acoustic_ms", "vocoder_ms")
    total_ms = sum(figures[name] for name in stages)
    figures["total_ms"] = total_ms
    figures["rtf"] = total_ms / 1000.0 / figures["audio_s"]
    figures["shares"] = {name.removesuffix("_ms"): figures[name] / total_ms for name in stages}
    figures["style_cold_share"] = figures["style_cold_ms"] / (total_ms - figures["style_warm_ms"]
                                                               + figures["style_cold_ms"])
    return figures


def end_to_end(args, report: dict) -> None:
    # Imported here: the front end's packages (jieba, pypinyin, cmudict) are this mode's alone.
    from models.emotivoice.voice_files import EmotiVoiceFiles, load_voice

    voice = load_voice(EmotiVoiceFiles()).to(args.device).eval()
    report["end_to_end"] = {}
    for text in E2E_SENTENCES:
        language = "zh" if any("\u4e00" <= c <= "\u9fff" for c in text) else "en"
        report["end_to_end"][language] = end_to_end_section(args, voice, text)
        write(args.out, report)
    print(json.dumps(report, indent=2, ensure_ascii=False))


def group_spec(text: str) -> tuple[int, int]:
    """``--grouped-engine``'s "GROUPS" or "GROUPS:ROWS" as (frame_groups, min_group_rows)."""
    groups, _, rows = text.partition(":")
    try:
        return int(groups), int(rows or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: GROUPS or GROUPS:ROWS, both integers") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="components", choices=("components", "end-to-end", "profile"),
                        help="components: the acoustic model and vocoder variants; end-to-end: text to audio; "
                             "profile: the FP16 engine's parts, timed apart, and their heaviest kernels")
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, required=True, help="the JSON report's path")
    parser.add_argument("--text-tokens", type=int, default=SENTENCE_SYMBOLS, help="symbols of the batch-1 sentence")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant of eager batch 1")
    parser.add_argument("--sorted-chunks", type=int, nargs="*", default=[],
                        help="for the FP16 engines: the largest --engine-batches batch sorted by length and sent "
                             "in batches of these sizes (sentences/s of a batcher that groups by length)")
    parser.add_argument("--compiled-engine", action="store_true", help="also the FP16 engine with its frame stage "
                        "compiled (CUDA only; a compile per frame bucket)")
    parser.add_argument("--pageable-engine", action="store_true", help="with --compiled-engine: also that engine "
                        "with its audio read back into pageable host memory (the engines' default is pinned)")
    parser.add_argument("--grouped-engine", type=group_spec, nargs="+", default=[], metavar="GROUPS[:ROWS]",
                        help="with --compiled-engine: also that engine with each batch's frame stage in this many "
                             "length groups, of at least ROWS rows each where given (fewer groups then; one engine "
                             "per spec)")
    parser.add_argument("--frame-buckets", type=int, nargs="+", default=[FRAME_BUCKET], metavar="FRAMES",
                        help="with --grouped-engine: each grouped engine once per frame bucket (the multiple of "
                             "frames a group pads to; names end in _fb<FRAMES> where it is not the default)")
    parser.add_argument("--dynamic-engine", action="store_true", help="with --compiled-engine: also that engine, "
                        "and each --grouped-engine, with one frame stage for every bucket compiled with symbolic "
                        "sizes (``_dynamic``; BucketedEngine's compile_dynamic)")
    parser.add_argument("--folded-engine", action="store_true", help="with --compiled-engine: also that engine "
                        "with its dilated convolutions folded into undilated ones (models/conv_layout.py)")
    parser.add_argument("--autotune-engine", action="store_true", help="with --compiled-engine: also that engine "
                        "compiled in max-autotune mode (minutes a frame bucket)")
    parser.add_argument("--lite-vocoder-engine", action="store_true",
                        help="also the compiled FP16 engine with the Lite student's vocoder width (random weights)")
    parser.add_argument("--epilogue-engine", action="store_true", help="with --grouped-engine: also each grouped "
                        "engine with its vocoder's block convolutions in cuDNN's epilogue (vocoder_kernels='cudnn', "
                        "_epilogue; needs nvidia-cudnn-frontend)")
    parser.add_argument("--epilogue-kernel-cache", action="store_true", help="with --epilogue-engine: also each "
                        "of those with shape-agnostic cuDNN graphs sharing a kernel cache (_kernel_cache)")
    parser.add_argument("--fused-engine", action="store_true", help="also the FP16 engine with its vocoder as fused "
                        "Triton convolutions and its mel half compiled (CUDA and Triton only)")
    parser.add_argument("--kernel-profile", action="store_true", help="each engine's 25 heaviest kernels over one "
                        "more run of the largest --engine-batches batch (torch.profiler)")
    parser.add_argument("--only-engines", nargs="+", default=None,
                        help="measure only these engines (names as in the report), e.g. for a side-by-side A/B")
    parser.add_argument("--engine-batches", type=int, nargs="+", default=[64, 128, 256],
                        help="batch sizes of mixed-length sentences through the bucketed engine")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if args.frame_buckets != [FRAME_BUCKET] and not args.grouped_engine:
        parser.error("--frame-buckets applies to the --grouped-engine engines: add one")
    if min(args.frame_buckets) < 1:
        parser.error(f"--frame-buckets {args.frame_buckets}: each at least 1")
    if any(groups < 2 for groups, _ in args.grouped_engine):
        parser.error(f"--grouped-engine {args.grouped_engine}: group counts of at least 2 (1 is the compiled engine)")
    if args.epilogue_kernel_cache and not args.epilogue_engine:
        parser.error("--epilogue-kernel-cache adds a variant of each --epilogue-engine")
    if args.epilogue_engine and not args.grouped_engine:
        parser.error("--epilogue-engine adds a variant of each --grouped-engine")
    if (args.pageable_engine or args.autotune_engine or args.folded_engine or args.grouped_engine
            or args.dynamic_engine) and not args.compiled_engine:
        parser.error("--pageable-engine, --autotune-engine, --folded-engine, --grouped-engine and --dynamic-engine "
                     "are variants of --compiled-engine: add it")
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    half = torch.float16

    report: dict = {
        "what": "EmotiVoice acoustic model + HiFi-GAN, full-size random weights (speed and memory real, quality not)",
        "manifest": GENERATOR_MANIFEST.name, "device": torch.cuda.get_device_name() if cuda else platform.processor(),
        "torch": torch.__version__, "provenance": origin, "text_tokens": args.text_tokens,
        "repeats": args.repeats, "batch1": {}, "errors": {},
    }
    if args.mode == "end-to-end":
        del report["batch1"], report["text_tokens"]
        end_to_end(args, report)
        return
    if args.mode == "profile":
        del report["batch1"]
        report["profile"] = {}
        for batch in [1, *args.engine_batches]:
            report["profile"][f"b{batch}"] = profile_section(args, batch)
            write(args.out, report)
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    # First, before any engine leaves memory behind (module docstring).
    report["batched"] = {"fp32": batch_section(args, torch.float32), "fp16": batch_section(args, half)}
    if cuda:
        report["fp16_peak_vram_of_fp32"] = (report["batched"]["fp16"]["peak_vram_over_baseline_mib"]
                                            / report["batched"]["fp32"]["peak_vram_over_baseline_mib"])
    write(args.out, report)
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
    # Engines on CUDA convolve channels-last (models/conv_layout.py); the _ncw rows keep the model's layout.
    # _compiled: the frame stage through torch.compile before capture (models/emotivoice/engines.py).
    # _fused: the vocoder as fused Triton convolutions (models/fused_hifigan.py), the mel half compiled.
    engines = [EngineSpec("engine_eager_fp16", False, half)]
    if cuda:
        engines += [EngineSpec("engine_graphs_fp32", True, torch.float32),
                    EngineSpec("engine_graphs_fp16", True, half),
                    EngineSpec("engine_graphs_bf16", True, torch.bfloat16),
                    EngineSpec("engine_graphs_fp16_ncw", True, half, conv_layout="ncw")]
        if args.compiled_engine:
            engines += [EngineSpec("engine_graphs_fp16_compiled", True, half, compile_frames=True)]
            if args.pageable_engine:
                engines += [EngineSpec("engine_graphs_fp16_compiled_pageable", True, half, compile_frames=True,
                                       pinned_output=False)]
            for (groups, rows), frames in itertools.product(args.grouped_engine, args.frame_buckets):
                name = (f"engine_graphs_fp16_compiled_groups{groups}" + (f"_rows{rows}" if rows > 1 else "")
                        + (f"_fb{frames}" if frames != FRAME_BUCKET else ""))
                engines += [EngineSpec(name, True, half, compile_frames=True, frame_groups=groups,
                                       min_group_rows=rows, frame_bucket=frames)]
                if args.dynamic_engine:
                    engines += [EngineSpec(f"{name}_dynamic", True, half, compile_frames=True, frame_groups=groups,
                                           min_group_rows=rows, compile_dynamic=True, frame_bucket=frames)]
                if args.epilogue_engine:
                    variants = [("", False), ("_dynamic", True)] if args.dynamic_engine else [("", False)]
                    caches = [("", False)] + ([("_kernel_cache", True)] if args.epilogue_kernel_cache else [])
                    engines += [EngineSpec(f"{name}{suffix}_epilogue{shapes}", True, half, compile_frames=True,
                                           frame_groups=groups, min_group_rows=rows, compile_dynamic=dynamic,
                                           frame_bucket=frames, vocoder_kernels="cudnn", cudnn_kernel_cache=cache)
                                for suffix, dynamic in variants for shapes, cache in caches]
            if args.dynamic_engine:
                engines += [EngineSpec("engine_graphs_fp16_compiled_dynamic", True, half, compile_frames=True,
                                       compile_dynamic=True)]
            if args.folded_engine:
                engines += [EngineSpec("engine_graphs_fp16_compiled_folded", True, half, compile_frames=True,
                                       fold_dilation=True)]
            if args.autotune_engine:
                engines += [EngineSpec("engine_graphs_fp16_compiled_autotune", True, half, compile_frames=True,
                                       compile_mode="max-autotune-no-cudagraphs")]
        if args.fused_engine:
            engines += [EngineSpec("engine_graphs_fp16_fused", True, half, compile_frames=True, vocoder_kernels="triton")]
        if args.lite_vocoder_engine:
            engines += [EngineSpec("engine_graphs_fp16_compiled_lite_vocoder", True, half, compile_frames=True,
                                   lite_vocoder=True)]
    if args.only_engines is not None:
        unknown = set(args.only_engines) - {engine.name for engine in engines}
        if unknown:
            parser.error(f"--only-engines: no engine named {sorted(unknown)} with these flags")
        engines = [engine for engine in engines if engine.name in args.only_engines]
    report["engines"] = {}
    for engine in engines:
        try:
            generator = with_lite_vocoder(fp32, args.seed) if engine.lite_vocoder else fp32
            section = engine_section(args, generator, engine, reference,
                                     tuple(args.sorted_chunks) if engine.name in SORTED_CHUNK_ENGINES else ())
            if engine.lite_vocoder:  # another vocoder, randomly initialised: its audio has nothing to match
                section["snr_vs_eager_fp32_db"] = None
                section["vocoder"] = {"kind": "Lite student width (LiteVocoderConfig defaults), random weights",
                                      "parameters": sum(p.numel() for p in generator.generator.parameters()),
                                      "teacher_parameters": sum(p.numel() for p in fp32.generator.parameters())}
            report["engines"][engine.name] = section
        except (RuntimeError, ValueError) as error:
            report["errors"][engine.name] = f"{type(error).__name__}: {error}"
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
    print(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
