"""CPU paths for the Lite student side by side with the original Piper ONNX: RTF (2 threads, batch 1,
interleaved rounds) and quality against the fp32 Lite graph on the same noise.

    python scripts/bench_lite_cpu.py --out docs/results/cpu_9_lite_cpu_kernels.json

Candidates (each built from the committed student, models/checkpoints/lite_joe_medium.safetensors):

* ``original_onnx``: the voice's own graph in onnxruntime (the yardstick);
* ``lite_ort``: the student's exported graph in onnxruntime, fp32 (the quality reference);
* ``lite_int8``: the pipeline's INT8 stage on that graph (compress/int8_onnxruntime.py, its defaults);
* ``lite_poly_ort``: ``lite_ort`` with every ConvTranspose rewritten as a polyphase Conv
  (export/rewrites/polyphase_conv_transpose.py), fp32;
* ``lite_poly_int8``: the same INT8 stage with ``polyphase_conv_transpose`` (the pipeline variant of
  that name), so the upsampling convs and the iSTFT head are blocks the sensitivity pass may quantize;
* ``lite_poly_int8_durations_free``: the same, but blocks whose INT8 moves a phoneme duration
  (the text encoder's) may go INT8 too, if their MCD is under the bar;
* ``lite_fastdur_ort`` (with ``--duration-student``): ``lite_ort`` with the teacher's stochastic
  duration predictor replaced by a NoiseAffineDurationPredictor (models/piper/duration_student.py),
  exported the same way; its durations differ from the teacher's, so where its frame count differs
  its MCD is DTW-aligned;
* ``lite_torch`` / ``lite_torch_bf16``: the PyTorch student, fp32 and with its decoder's trunk under
  bf16 autocast (oneDNN: AVX512-BF16 / AMX; conv_post and the iSTFT head stay fp32); with
  ``--torch-compile`` also ``lite_torch_compile`` and ``lite_torch_compile_bf16``: the decoder
  through torch.compile (inductor, CPU).

``--candidates`` builds and times only the named ones (``original_onnx`` and ``lite_ort`` always).

Quality: DNSMOS P.808 of each candidate, MCD and speaker similarity against ``lite_ort`` on the first
``--quality-sentences`` eval sentences (sentence i draws noise from seed i), and how many
phoneme durations differ. Speed: the first ``--speed-sentences`` eval sentences, each
run on every variant back to back in rotating order (``speed``), ``--rounds`` times; the ratio to
the original graph is taken per adjacent pair of runs (other work shares the CPU), then the median.
Calibration uses the calibration set only; the eval set is only scored, Harvard never read.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from onnx import TensorProto, helper
from torch import nn

from compress import distil, int8_onnxruntime, onnxruntime_variant
from compress.int8_onnxruntime import Int8OrtSettings
from compress.registration import GRAPH_ARTIFACT
from compress.variants import StageContext, Variant
from core.atomic_io import write_text_atomic
from evaluate.dnsmos import dnsmos_p808
from evaluate.mcd import mel_cepstral_distortion
from evaluate.memory import file_size_mb, parameter_count, state_dict_size_mb
from evaluate.speaker import speaker_similarity
from export.rewrites.polyphase_conv_transpose import polyphase_conv_transpose
from export.settings import EngineSettings, ExportSettings
from export.variant_export import export_variant
from models.interface import SynthesisRequest
from models.piper.duration_student import duration_student_card, load_duration_student
from models.registry import get_family
from texts import load_sentences

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "models/checkpoints/lite_joe_medium.safetensors"
QUALITY_REFERENCE = "lite_ort"
OPTIONAL_CANDIDATES = ("lite_fastdur_ort", "lite_poly_ort", "lite_int8", "lite_poly_int8", "lite_poly_int8_durations_free",
                       "lite_torch", "lite_torch_bf16", "lite_torch_compile", "lite_torch_compile_bf16")
TORCH_PHASE_SUFFIX = "@torch_phase"  # the rows of the onnxruntime yardsticks timed again in the torch phase
PAIRS = (  # (baseline, candidate) compared run against adjacent run, within one speed phase
    ("lite_ort", "lite_poly_ort"), ("lite_ort", "lite_int8"), ("lite_ort", "lite_poly_int8"),
    ("lite_int8", "lite_poly_int8"), ("lite_poly_int8", "lite_poly_int8_durations_free"),
    ("lite_torch", "lite_torch_bf16"), ("lite_ort", "lite_fastdur_ort"), ("lite_poly_int8@torch_phase", "lite_torch_bf16"),
    ("lite_poly_int8@torch_phase", "lite_torch_compile_bf16"),
)


class Bf16Autocast(nn.Module):
    """One decoder module under CPU bf16 autocast (convolutions in oneDNN bf16), float32 at its edges."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.module(x).float()


def bf16_decoder_trunk(decoder: nn.Module) -> nn.Module:
    """``decoder`` (an IstftGenerator) with conv_pre, the upsampling convs and the residual blocks in
    bf16; conv_post and the iSTFT head stay float32. Measured on 4 eval sentences against fp32:
    this trunk 0.02 dB MCD, conv_post alone in bf16 0.26 dB, the whole decoder 1.97 dB (the head's
    exp and phase in bf16's 8-bit mantissa)."""
    decoder.conv_pre = Bf16Autocast(decoder.conv_pre)
    for modules in (decoder.ups, decoder.resblocks):
        for index in range(len(modules)):
            modules[index] = Bf16Autocast(modules[index])
    return decoder


def graph_op_counts(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in graph.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def onnxruntime_bf16_probe() -> dict[str, str]:
    """Whether onnxruntime's CPU provider runs a bfloat16 Conv and MatMul (one-node graphs)."""
    verdicts = {}
    for op, weight_shape, input_shape in (("Conv", [4, 4, 3], [1, 4, 16]), ("MatMul", [4, 4], [1, 4])):
        weight = helper.make_tensor("w", TensorProto.BFLOAT16, weight_shape,
                                    np.zeros(int(np.prod(weight_shape)), dtype=np.uint16).tobytes(), raw=True)
        graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, input_shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)], [weight])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        try:
            onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            verdicts[op] = "session created"
        except Exception as error:  # noqa: BLE001 (the verdict is the error)
            verdicts[op] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return verdicts


def build_candidates(args: argparse.Namespace, family, calibration: list) -> tuple[dict[str, Variant], dict]:
    """Every candidate variant, and what was recorded while building them."""
    work_dir = args.work_dir
    threads = args.threads
    notes: dict[str, dict] = {}

    def context(name: str) -> StageContext:
        return StageContext(calibration, work_dir / "stages" / name, threads, args.cache_dir, family, args.voice)

    reference = family.reference
    original = reference.load(args.voice, threads)
    variants = {"original_onnx": Variant("original_onnx", original, "onnxruntime", "cpu",
                                         original.num_parameters / 1e6,
                                         file_size_mb(reference.graph_path(args.voice)))}
    teacher_model = family.load_teacher(args.voice, args.cache_dir)
    teacher = Variant("teacher", teacher_model, "torch", "cpu", 0.0, 0.0)
    lite = distil.build(teacher, distil.DistilSettings(checkpoint=CHECKPOINT), context("lite"))

    def wanted(name: str) -> bool:
        return args.candidates is None or name in args.candidates

    def exported(variant: Variant) -> Variant:
        """``variant`` in onnxruntime, through the pipeline's export. The graph's folder is named by a
        digest of the variant's weights, so a graph already there is reused only for the same weights."""
        digest = hashlib.sha256()
        for key, tensor in variant.model.state_dict().items():
            digest.update(key.encode())
            digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        name = f"{variant.name}_{digest.hexdigest()[:12]}"
        graph_dir = work_dir / "graphs" / name
        graph = graph_dir / f"{variant.name}.simplified.onnx"
        if not graph.is_file():
            graph_dir.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            report = export_variant(variant.name, variant.model, graph_dir, calibration,
                                    ExportSettings(check_tensorrt_readiness=False),
                                    EngineSettings(build_tensorrt=False))
            notes[f"export_{name}"] = {"seconds": time.perf_counter() - start, "parity": report.parity}
            graph = Path(report.simplified_path)
        variant.artifacts[GRAPH_ARTIFACT] = graph
        return onnxruntime_variant.build(variant, None, context(f"{name}_ort"), variant_name=f"{variant.name}_ort")

    variants["lite_ort"] = exported(lite)
    graph = lite.artifacts[GRAPH_ARTIFACT]
    if args.duration_student and wanted("lite_fastdur_ort"):
        fastdur = copy.deepcopy(lite.model)
        fastdur.replace_part("duration", load_duration_student(fastdur.model.hp, args.duration_student))
        fastdur_variant = Variant("lite_fastdur", fastdur, "torch", "cpu", parameter_count(fastdur) / 1e6,
                                  state_dict_size_mb(fastdur))
        variants["lite_fastdur_ort"] = exported(fastdur_variant)
        notes["duration_student"] = {"path": str(args.duration_student),
                                     "card": duration_student_card(args.duration_student)}

    if wanted("lite_poly_ort"):
        poly_graph = work_dir / "graphs" / "lite_poly.onnx"
        rewritten, rewrite_report = polyphase_conv_transpose(onnx.load(str(graph)))
        onnx.save(rewritten, str(poly_graph))
        notes["polyphase_rewrite"] = rewrite_report
        poly_model = reference.load_graph(args.voice, threads, poly_graph)
        variants["lite_poly_ort"] = Variant("lite_poly_ort", poly_model, "onnxruntime", "cpu",
                                            poly_model.num_parameters / 1e6, file_size_mb(poly_graph))

    int8_settings = Int8OrtSettings(calibration_sentences=args.calibration_sentences)
    # (name, int8_onnxruntime.build's polyphase_conv_transpose, settings): the pipeline's lite_int8 and
    # lite_poly_int8 exactly as compress/stages.py builds them, and lite_poly_int8 with the duration
    # rule off (blocks that move a phoneme's duration, the encoder's, may go int8 if their MCD
    # passes): what that rule costs in speed and what dropping it costs in quality. The last two
    # share one work dir: the same calibration ranges and block table.
    int8_candidates = (
        ("lite_int8", False, int8_settings, "lite_int8"),
        ("lite_poly_int8", True, int8_settings, "lite_poly_int8"),
        ("lite_poly_int8_durations_free", True, dataclasses.replace(int8_settings, keep_fp32_if_durations_change=False),
         "lite_poly_int8"),
    )
    for name, polyphase, settings, stage_dir in int8_candidates:
        if not wanted(name):
            continue
        start = time.perf_counter()
        variants[name] = int8_onnxruntime.build(variants["lite_ort"], settings, context(stage_dir), variant_name=name,
                                                polyphase_conv_transpose=polyphase)
        # The block table's measurements; which blocks this variant keeps fp32 comes from its own manifest
        # (the table file is shared by the two variants of one work dir and carries the last one's verdicts).
        fp32_blocks = set(variants[name].stage_tags["fp32_blocks"].split(","))
        table = json.loads(Path(variants[name].artifacts["sensitivity_json"]).read_text())["blocks"]
        blocks = [{key: value for key, value in row.items() if key != "fp32_reason"}
                  | {"int8": row["block"] not in fp32_blocks} for row in table]
        notes[name] = {"build_s": time.perf_counter() - start, "stage_metrics": variants[name].stage_metrics,
                       "stage_tags": variants[name].stage_tags, "sensitivity": blocks}
    for name, variant in variants.items():
        if variant.engine == "onnxruntime" and name != "original_onnx":
            notes.setdefault(name, {})["op_counts"] = graph_op_counts(variant.model.graph_path)

    if wanted("lite_torch"):
        variants["lite_torch"] = lite
    bf16 = None
    if wanted("lite_torch_bf16") or (args.torch_compile and wanted("lite_torch_compile_bf16")):
        bf16 = copy.deepcopy(lite.model)
        bf16.replace_part("decoder", bf16_decoder_trunk(bf16.parts()["decoder"]))
    if wanted("lite_torch_bf16"):
        variants["lite_torch_bf16"] = Variant("lite_torch_bf16", bf16, "torch", "cpu", lite.params_m, lite.size_mb)
    if args.torch_compile:  # the decoder through inductor's CPU code generation, fp32 and under bf16 autocast
        for name, model in (("lite_torch_compile", lite.model), ("lite_torch_compile_bf16", bf16)):
            if not wanted(name):
                continue
            compiled = copy.deepcopy(model)
            compiled.replace_part("decoder", torch.compile(compiled.parts()["decoder"], dynamic=True))
            variants[name] = Variant(name, compiled, "torch", "cpu", lite.params_m, lite.size_mb)
    return variants, notes


def quality(variants: dict[str, Variant], requests: list[SynthesisRequest]) -> dict[str, dict]:
    """DNSMOS; MCD, speaker similarity and changed durations of every variant against ``lite_ort``, same noise."""
    references = [variants[QUALITY_REFERENCE].model.synthesize(request) for request in requests]
    rows = {}
    for name, variant in variants.items():
        mcds_db, similarities, mos, duration_changes = [], [], [], 0
        for request, reference in zip(requests, references):
            result = variant.model.synthesize(request)
            length = int(result.audio_lengths[0])
            reference_audio = reference.waveforms()[0]
            mcds_db.append(mel_cepstral_distortion(result.audio[0, :length], reference_audio,
                                                   sample_rate_hz=reference.sample_rate_hz))
            similarities.append(speaker_similarity(result.audio[0, :length], reference_audio,
                                                   reference.sample_rate_hz))
            mos.append(dnsmos_p808(result.audio[0, :length], reference.sample_rate_hz))
            if result.durations.shape == reference.durations.shape:
                duration_changes += int((result.durations != reference.durations).sum())
        rows[name] = {"dnsmos_p808": float(np.mean(mos)), "mcd_db": float(np.mean(mcds_db)), "mcd_max_db": float(np.max(mcds_db)),
                      "spk_sim": float(np.mean(similarities)), "spk_sim_min": float(np.min(similarities)),
                      "duration_changes": duration_changes}
    return rows


def speed(variants: dict[str, Variant], requests: list[SynthesisRequest], rounds: int) -> dict[str, dict]:
    """RTF of every variant, batch 1, interleaved sentence by sentence.

    Each sentence runs on every variant back to back (the order rotating), so a variant and the
    original graph are timed within a second of each other: other work on the shared cores swings
    the machine's speed by up to 4x over tens of seconds, and a ratio of adjacent runs cancels it.
    Per variant: the median over rounds of the RTF (compute over audio seconds, its own audio),
    the RTF from each sentence's fastest run (the least disturbed), and the speedup over
    ``original_onnx`` as the median of the per-sentence, per-round RTF ratios.
    """
    names = list(variants)
    for name in names:
        for _ in range(2):  # warm-up: first-run allocations, torch.compile's code generation
            variants[name].model.synthesize(requests[0])
    seconds = {name: np.zeros((rounds, len(requests))) for name in names}
    audio_s = {name: np.zeros(len(requests)) for name in names}
    for round_index in range(rounds):
        for index, request in enumerate(requests):
            shift = (round_index * len(requests) + index) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                result = variants[name].model.synthesize(request)
                seconds[name][round_index, index] = time.perf_counter() - start
                audio_s[name][index] = float(result.audio_lengths.sum()) / result.sample_rate_hz
    rtf = {name: seconds[name] / audio_s[name] for name in names}  # (rounds, sentences)
    rows = {}
    for name in names:
        per_round = (seconds[name].sum(axis=1) / audio_s[name].sum()).tolist()
        ratios = rtf["original_onnx"] / rtf[name]
        fastest = seconds[name].min(axis=0).sum() / audio_s[name].sum()
        rows[name] = {"rtf_cpu_b1": statistics.median(per_round), "rtf_per_round": per_round,
                      "rtf_cpu_b1_fastest": float(fastest),
                      "speedup_vs_original_onnx": float(np.median(ratios)),
                      "speedup_quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
                      "seconds": seconds[name].round(6).tolist(),  # (rounds, sentences): the raw timings
                      "audio_s": audio_s[name].round(6).tolist()}
    for name in names:
        fastest = rows[name]["rtf_cpu_b1_fastest"]
        rows[name]["speedup_of_fastest"] = rows["original_onnx"]["rtf_cpu_b1_fastest"] / fastest
    return rows


def paired_speedup(rows: dict[str, dict], baseline: str, candidate: str) -> dict[str, float]:
    """How much faster ``candidate`` runs than ``baseline``: RTF ratios of adjacent runs (same round,
    same sentence, same speed phase), median and quartiles."""
    def rtf(name: str) -> np.ndarray:  # (rounds, sentences)
        return np.asarray(rows[name]["seconds"]) / np.asarray(rows[name]["audio_s"])

    ratios = rtf(baseline) / rtf(candidate)
    return {"median": float(np.median(ratios)), "quartiles": [float(q) for q in np.percentile(ratios, [25, 75])],
            "faster_fraction": float((ratios > 1).mean())}


def machine() -> dict:
    flags = set(Path("/proc/cpuinfo").read_text().split())
    model_name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                       if line.startswith("model name")), platform.processor())
    return {"cpu": model_name, "cores": os.cpu_count(),
            "isa": sorted(flags & {"avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}),
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "git_revision": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                           text=True, check=False).stdout.strip()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python scripts/bench_lite_cpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "outputs" / "bench_lite_cpu")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tts-compress")
    parser.add_argument("--voice", default="bundled:joe")
    parser.add_argument("--threads", type=int, default=2)  # the project's CPU figures use 2 threads
    parser.add_argument("--calibration-sentences", type=int, default=32)
    parser.add_argument("--quality-sentences", type=int, default=8)
    parser.add_argument("--speed-sentences", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)  # onnxruntime phase: about 5 s a round
    parser.add_argument("--torch-rounds", type=int, default=5)  # torch phase: slower, and far noisier on shared cores
    parser.add_argument("--torch-compile", action="store_true", help="also time the decoder through torch.compile")
    parser.add_argument("--duration-student", type=Path,
                        help="a NoiseAffineDurationPredictor (models/piper/training/duration_training.py): adds lite_fastdur_ort")
    parser.add_argument("--candidates", nargs="+", choices=OPTIONAL_CANDIDATES,
                        help="build and time only these (with original_onnx and lite_ort)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    family = get_family("piper")
    loadavg = {"start": os.getloadavg()}
    started = time.perf_counter()

    reference_voice = family.reference.load(args.voice, args.threads)
    calibration = [u for text in load_sentences("calibration") for u in reference_voice.text_to_utterances(text)]
    eval_sequences = [reference_voice.text_to_utterances(text)[0] for text in load_sentences("eval")]
    variants, notes = build_candidates(args, family, calibration)
    loadavg["after_build"] = os.getloadavg()

    quality_requests = [SynthesisRequest.from_utterances([s], sampling=family.sampling(seed=i))
                        for i, s in enumerate(eval_sequences[: args.quality_sentences])]
    quality_rows = quality(variants, quality_requests)
    loadavg["after_quality"] = os.getloadavg()
    speed_requests = [SynthesisRequest.from_utterances([s], sampling=family.sampling(seed=i))
                      for i, s in enumerate(eval_sequences[: args.speed_sentences])]
    # Two phases, each with the original graph as yardstick: onnxruntime's and torch's thread pools
    # both spin-wait after a call, and on two shared cores one engine's spinning threads slow the
    # other's next call, so the onnxruntime candidates are compared among themselves without torch.
    # The torch phase times the pipeline's INT8 Lite graph again, as the cross-engine yardstick.
    phases = {"onnxruntime": [name for name, v in variants.items() if v.engine == "onnxruntime"]}
    torch_candidates = [name for name, v in variants.items() if v.engine == "torch"]
    if torch_candidates:
        phases["torch"] = ["original_onnx", *(["lite_poly_int8"] if "lite_poly_int8" in variants else []),
                           *torch_candidates]
    speed_rows = {}
    for phase, names in phases.items():
        rows = speed({name: variants[name] for name in names}, speed_requests,
                     args.rounds if phase == "onnxruntime" else args.torch_rounds)
        loadavg[f"after_speed_{phase}"] = os.getloadavg()
        for name, row in rows.items():
            key = name if name not in speed_rows else f"{name}{TORCH_PHASE_SUFFIX}"  # a yardstick, timed again
            speed_rows[key] = {**row, "speed_phase": phase}

    table = {}
    for key, row in speed_rows.items():
        name = key.removesuffix(TORCH_PHASE_SUFFIX)
        table[key] = {**row, **quality_rows[name], "size_mb": variants[name].size_mb, "engine": variants[name].engine}
    result = {
        "what": "Lite student CPU paths vs the original Piper ONNX (scripts/bench_lite_cpu.py)",
        "settings": {"threads": args.threads, "batch": 1, "eval_set": "eval",
                     "quality_sentences": args.quality_sentences,
                     "speed_sentences": args.speed_sentences, "rounds": args.rounds,
                     "torch_rounds": args.torch_rounds,
                     "calibration_set": "calibration", "calibration_sentences": args.calibration_sentences,
                     "quality_reference": QUALITY_REFERENCE, "checkpoint": CHECKPOINT},
        "machine": machine(), "loadavg": loadavg, "seconds": time.perf_counter() - started,
        "onnxruntime_bf16_probe": onnxruntime_bf16_probe(),
        "variants": table, "notes": notes,
        "paired_speedups": {f"{candidate} vs {baseline}": paired_speedup(speed_rows, baseline, candidate)
                            for baseline, candidate in PAIRS if {baseline, candidate} <= set(speed_rows)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1, default=str))
    print(f"{'variant':30s} {'rtf':>7s} {'fastest':>7s} {'x orig':>6s} {'x fast':>6s} {'mcd dB':>6s} {'spk':>6s} dur")
    for name, row in table.items():
        print(f"{name:30s} {row['rtf_cpu_b1']:7.4f} {row['rtf_cpu_b1_fastest']:7.4f} "
              f"{row['speedup_vs_original_onnx']:6.2f} {row['speedup_of_fastest']:6.2f} {row['mcd_db']:6.3f} "
              f"{row['spk_sim']:6.3f} {row['duration_changes']:3d}")
    for pair, row in result["paired_speedups"].items():
        print(f"{pair:45s} x{row['median']:.3f} (quartiles {row['quartiles'][0]:.3f}-{row['quartiles'][1]:.3f}, "
              f"faster in {100 * row['faster_fraction']:.0f}% of pairs)")
    print("loadavg", loadavg)


if __name__ == "__main__":
    main()
