"""GPU figures for a registered family's voice: its PyTorch teacher and FP16/BF16 variants on CUDA,
beside the graph the family ships (its reference runtime), in one run.

Runs on a bare GPU machine with torch, numpy, safetensors, onnx and onnxruntime (the CPU build
is enough): phoneme ids are prepared here, where the text frontend (espeak-ng) lives, and travel
as JSON with the family's name.

    # here: phonemize the evaluation sentences (and the calibration sentences the sensitivity table uses)
    python -m evaluate.gpu_benchmark prepare --eval-set harvard --out .device/bench_inputs.json
    # on the GPU machine, with the voice file and the inputs copied there
    python -m evaluate.gpu_benchmark run --voice .device/voice/en_US-joe-medium.onnx \
        --inputs .device/bench_inputs.json --out $OUT/gpu_results.json --variants teacher,fp16,bf16
    # here: score the saved audio of each variant with the pipeline's quality metrics
    python -m evaluate.score_gpu_audio --npz results/audio_teacher.npz results/audio_fp16.npz \
        results/audio_bf16.npz --reference-variant teacher --out results/gpu_audio_quality.json
    # here: merge into the MLflow run and the table
    python -m compress +experiment=baseline data=harvard evaluate.gpu_results=docs/results/h200_baseline.json

Each variant is built on the device from the same teacher (``family.load_teacher``): ``teacher``
is the FP32 model; ``fp16``/``bf16`` run every part in half precision except ``--keep-fp32``
(models/precision.py, the code the compress stage uses). One at a time, each is timed at batch 1
and 16 with its own VRAM peaks, compared with the teacher's outputs (durations, SNR), and the
first ``--audio-utterances`` waveforms are saved as float16 in ``audio_<variant>.npz`` beside
``--out``. For each half dtype, ``part_sensitivity`` (each part alone in half precision) runs on
the calibration sentences; MCD joins it only where librosa is installed.

Metric names match evaluate/runner.py: rtf_cuda_b1, rtf_cuda_b16, vram_peak_mib,
latency_first_audio_ms_cuda; figures on the GPU host's CPU carry ``hostcpu`` in their name.
``vram_peak_mib`` (batch 1) includes the outputs of every utterance, which the timing loop keeps
on the GPU (tens of MiB of float32 audio for a few hundred sentences), alike for each variant.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

from core.atomic_io import write_text_atomic
from core.publishing import UnpublishableTreeError, add_allow_dirty_argument, publication_provenance
from evaluate.rtf import measure_batch1, measure_batched
from models.family import Family
from models.interface import SynthesisRequest, SynthesisResult, TTSModel, Utterance
from models.precision import VARIANT_NAMES, compare_outputs, part_sensitivity, to_half_precision
from models.registry import FAMILIES, get_family
from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT

MIB = 1024 * 1024
HALF_VARIANTS = {name: dtype for dtype, name in VARIANT_NAMES.items()}  # fp16 -> float16, bf16 -> bfloat16
# Alone in half precision, the text encoder and the duration predictor change phoneme durations
# (the ceil() after them flips at rounding boundaries); the flow and the decoder, which hold most
# of the compute, leave durations alone. The run's part_sensitivity table shows it on the device.
DEFAULT_KEEP_FP32 = ("encoder", "duration")
# Files come back from the GPU machine up to 16 MiB each; the waveforms leave room for the zip and texts.
AUDIO_WAVEFORM_BYTES_MAX = 15 * MIB



def prepare(eval_set: str, out: str, seed: int, family_name: str | None = None, voice: str | None = None,
            cache_dir: Path = DEFAULT_CACHE_DIR) -> None:
    """Phoneme ids of ``eval_set`` and of the calibration sentences, by the teacher's own frontend.

    ``family_name``: a registered family (default: the first registered); ``voice``: one of its
    voices (default: the family's default voice).
    """
    from texts import load_sentences

    family = get_family(family_name or next(iter(FAMILIES)))
    voice = voice or family.default_voice
    teacher = family.load_teacher(voice, Path(cache_dir))

    def utterances(sentences: list[str]) -> list[dict]:
        sequences = [seq for sentence in sentences for seq in teacher.text_to_utterances(sentence)]
        return [{"text": s.text, "phoneme_ids": list(s.phoneme_ids)} for s in sequences]

    payload = {"family": family.name, "voice": voice, "eval_set": eval_set, "seed": seed,
               "sample_rate_hz": teacher.sample_rate_hz,
               "utterances": utterances(load_sentences(eval_set)),
               # The half-precision sensitivity table is measured on these, never on the evaluation set.
               "calibration_utterances": utterances(load_sentences("calibration"))}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(payload, handle)
    os.replace(out + ".tmp", out)
    print(f"{len(payload['utterances'])} utterances, {len(payload['calibration_utterances'])} calibration -> {out}")


def sequences_from_inputs(utterances: list[dict]) -> list[Utterance]:
    """The utterances of a prepared inputs file (``prepare`` above) as the models take them."""
    return [Utterance(u["text"], (), tuple(u["phoneme_ids"])) for u in utterances]


def _to_cpu(results: list[SynthesisResult]) -> list[SynthesisResult]:
    return [SynthesisResult(r.audio.float().cpu(), r.audio_lengths.cpu(), r.sample_rate_hz,
                            durations=None if r.durations is None else r.durations.cpu())
            for r in results]


def _measure_on_device(synthesizer: TTSModel, sequences, noises, warm_runs: int, device: str):
    """Speed and VRAM of one variant, alone on the device.

    Returns (figures, batch-1 outputs on the CPU, seconds of audio synthesized at batch 1).
    """
    on_cuda = device.startswith("cuda")
    kind = "cuda" if on_cuda else "cpu"
    figures: dict[str, float] = {}
    synthesizer.to(device)
    if on_cuda:
        # Only this variant's weights are on the device now: earlier variants were deleted and
        # their outputs copied to the CPU; empty_cache drops the blocks they left behind.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        figures["vram_weights_mib"] = torch.cuda.memory_allocated() / MIB
    speed, outputs = measure_batch1(synthesizer.synthesize, sequences, noises, warm_runs, 2, device)
    if on_cuda:
        figures["vram_peak_mib"] = torch.cuda.max_memory_allocated() / MIB
        torch.cuda.reset_peak_memory_stats()
    rtf_b16 = measure_batched(synthesizer.synthesize, sequences, 16, noises[0], warm_runs, 2, device)
    if on_cuda:
        figures["vram_peak_mib_b16"] = torch.cuda.max_memory_allocated() / MIB
    figures.update({
        f"rtf_{kind}_b1": speed.rtf_b1, f"rtf_{kind}_b1_median_utterance": speed.rtf_b1_median_utterance,
        f"rtf_{kind}_b16": rtf_b16, f"latency_first_audio_ms_{kind}": speed.latency_first_audio_ms,
    })
    return figures, _to_cpu(outputs), sum(t.audio_s for t in speed.per_utterance)


def save_audio(path: str, variant: str, outputs: list[SynthesisResult], texts: list[str], max_utterances: int) -> int:
    """Write the first waveforms as float16 arrays ``waveform_0000``... with ``texts``; returns how many.

    float16 rounding costs about 74 dB of SNR (measured on joe), far below what the quality metrics resolve,
    and halves the file: 40 Harvard utterances take about 4 MB.
    """
    arrays, waveform_bytes = {}, 0
    for index, result in enumerate(outputs[:max_utterances]):
        waveform = result.waveforms()[0].numpy().astype(np.float16)  # (T_audio,)
        if waveform_bytes + waveform.nbytes > AUDIO_WAVEFORM_BYTES_MAX:
            break
        arrays[f"waveform_{index:04d}"] = waveform
        waveform_bytes += waveform.nbytes
    with open(path + ".tmp", "wb") as handle:
        np.savez(handle, variant=np.array(variant), sample_rate_hz=np.array(outputs[0].sample_rate_hz),
                 texts=np.array(texts[: len(arrays)]), **arrays)
    os.replace(path + ".tmp", path)
    return len(arrays)


def _mcd_or_reason():
    """(evaluate.mcd's MCD function, None) where librosa is installed, else (None, why not)."""
    try:
        from evaluate.mcd import mel_cepstral_distortion
    except ImportError as error:
        return None, f"MCD not measured here: {error}"
    return mel_cepstral_distortion, None


def _device_vs_original(device_outputs: list[SynthesisResult], original_outputs: list[SynthesisResult]) -> dict:
    """Device teacher vs the shipped graph on identical noise: durations, then waveforms where they agree.

    A ceil() at a rounding boundary can flip one phoneme's duration; that is counted, not hidden.
    Outputs without durations are compared where their lengths agree.
    """
    matched, max_rel_diff = 0, 0.0
    for device_out, original_out in zip(device_outputs, original_outputs):
        if device_out.durations is None or original_out.durations is None:
            if not torch.equal(device_out.audio_lengths, original_out.audio_lengths):
                continue
        elif not torch.equal(device_out.durations, original_out.durations):
            continue
        matched += 1
        n = int(original_out.audio_lengths[0])
        reference = original_out.audio[0, :n]  # (T,)
        diff = (device_out.audio[0, :n] - reference).abs().max() / reference.abs().max()
        max_rel_diff = max(max_rel_diff, float(diff))
    return {"cuda_vs_onnx_max_diff_rel_peak": max_rel_diff,
            "cuda_vs_onnx_same_durations_fraction": matched / len(original_outputs)}


def _reference_runtime(family: Family, voice: str, threads: int) -> TTSModel | None:
    """The graph ``family`` ships, run as it ships on the host CPU; None for a family that ships none."""
    return None if family.reference is None else family.reference.load(voice, threads)


def run(voice: str, inputs: str, out: str, warm_runs: int, host_cpu_sentences: int,
        device: str = "cuda", variants: tuple[str, ...] = ("teacher",),
        keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32, audio_utterances: int = 40,
        sensitivity_utterances: int = 16, host_cpu_threads: int | None = None,
        cache_dir: Path = DEFAULT_CACHE_DIR, allow_dirty: bool = False) -> dict:
    """``voice`` as the inputs' family loads it (``family.load_teacher``); ``device="cpu"`` runs the
    same code path without a GPU (a smoke test); names then say cpu. An ``out`` under docs/ from a
    dirty tree raises UnpublishableTreeError before any work, unless ``allow_dirty`` (core/publishing.py)."""
    origin = publication_provenance(REPO_ROOT, out, allow_dirty)
    unknown = sorted(set(variants) - {"teacher", *HALF_VARIANTS})
    if unknown or "teacher" not in variants:
        raise ValueError(f"variants {list(variants)}: unknown {unknown}; give teacher (the reference) "
                         f"and any of {sorted(HALF_VARIANTS)}")
    with open(inputs, encoding="utf-8") as handle:
        payload = json.load(handle)
    if "family" not in payload:
        raise ValueError(f"{inputs} names no model family: re-run `python -m evaluate.gpu_benchmark prepare`")
    family = get_family(payload["family"])
    half_variants = [name for name in variants if name in HALF_VARIANTS]
    if half_variants and "calibration_utterances" not in payload:
        raise ValueError(f"{inputs} has no calibration_utterances, which the {half_variants} sensitivity "
                         "table needs: re-run `python -m evaluate.gpu_benchmark prepare`")
    sequences = sequences_from_inputs(payload["utterances"])
    texts = [sequence.text for sequence in sequences]
    noises = [family.sampling(seed=payload["seed"] + i) for i in range(len(sequences))]
    base = family.load_teacher(voice, Path(cache_dir)).eval()  # FP32 on the CPU; every variant is built from it
    if base.sample_rate_hz != int(payload["sample_rate_hz"]):
        raise ValueError(f"--voice {voice} speaks at {base.sample_rate_hz} Hz, the inputs were prepared for "
                         f"{payload['sample_rate_hz']} Hz: prepare them with this voice")
    # The teacher is the fp32 reference: no TF32 in convolutions or matmuls.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    on_cuda = device.startswith("cuda")
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    skipped: dict[str, str] = {}
    audio_files: dict[str, dict] = {}

    # Each variant alone on the device, teacher first: batch 1 over the whole set, then batches of 16.
    teacher_outputs = None
    for name in ["teacher"] + [v for v in variants if v != "teacher"]:
        if name == "teacher":
            synthesizer = copy.deepcopy(base)
        else:
            synthesizer = to_half_precision(base, HALF_VARIANTS[name], keep_fp32).to(device)
            try:  # a build of torch without these half-precision kernels on this device: say so, go on
                synthesizer.synthesize(SynthesisRequest.from_utterances(sequences[:1], sampling=noises[0]))
            except RuntimeError as error:
                skipped[name] = f"{HALF_VARIANTS[name]} on {device}: {error}"
                continue
        figures, outputs, audio_seconds = _measure_on_device(synthesizer, sequences, noises, warm_runs, device)
        del synthesizer
        if name == "teacher":
            teacher_outputs, teacher_audio_seconds = outputs, audio_seconds
        else:
            comparison = compare_outputs(outputs, teacher_outputs)
            figures.update({f"vs_teacher_{key}": value for key, value in comparison.items()
                            if key != "utterances" and value is not None})
        results[name] = figures
        audio_path = os.path.join(out_dir, f"audio_{name}.npz")
        saved = save_audio(audio_path, name, outputs, texts, audio_utterances)
        audio_files[name] = {"file": os.path.basename(audio_path), "utterances": saved}

    # Same machine, same run: the original ONNX in onnxruntime (CPU build only on that image)
    # and the teacher on the host CPU, over the first sentences.
    threads = host_cpu_threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    subset, subset_noises = sequences[:host_cpu_sentences], noises[:host_cpu_sentences]
    cpu_speed, _ = measure_batch1(base.synthesize, subset, subset_noises, warm_runs, 1, "cpu")
    results["teacher"].update(rtf_hostcpu_b1=cpu_speed.rtf_b1,
                              latency_first_audio_ms_hostcpu=cpu_speed.latency_first_audio_ms)
    original = _reference_runtime(family, voice, threads)
    if original is not None:
        ort_speed, ort_outputs = measure_batch1(original.synthesize, subset, subset_noises, warm_runs, 1, "cpu")
        results["original_onnx"] = {"rtf_hostcpu_b1": ort_speed.rtf_b1,
                                    "latency_first_audio_ms_hostcpu": ort_speed.latency_first_audio_ms}
        results["teacher"].update(_device_vs_original(teacher_outputs, ort_outputs))

    # Which parts tolerate half precision, on this device: each part alone, calibration sentences.
    mcd_db, mcd_missing = _mcd_or_reason()
    calibration = sequences_from_inputs(payload.get("calibration_utterances", []))[:sensitivity_utterances]
    sensitivity = {
        HALF_VARIANTS[name]: part_sensitivity(base, calibration, HALF_VARIANTS[name], device, mcd_db=mcd_db)
        for name in half_variants if name not in skipped
    }

    report = {
        "machine": {"gpu": torch.cuda.get_device_name(0) if on_cuda else "none", "torch": torch.__version__,
                    "cuda": torch.version.cuda, "host_cpu_threads": threads, "python": platform.python_version(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "family": family.name, "eval_set": payload["eval_set"], "utterances": len(sequences),
        "host_cpu_utterances": len(subset), "warm_runs": warm_runs,
        "audio_seconds": teacher_audio_seconds, "audio": audio_files,
        "variants": results,
    }
    if half_variants:
        report.update(keep_fp32=list(keep_fp32), skipped_variants=skipped, part_sensitivity=sensitivity,
                      sensitivity_utterances=len(calibration))
        if mcd_missing:
            report["part_sensitivity_note"] = mcd_missing
    report["provenance"] = origin
    write_text_atomic(Path(out), json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="phonemize an evaluation set into a JSON the GPU machine reads")
    prep.add_argument("--eval-set", default="harvard")
    prep.add_argument("--out", required=True)
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--family", default=next(iter(FAMILIES)), choices=sorted(FAMILIES),
                      help="a registered model family (default: %(default)s, the first registered)")
    prep.add_argument("--voice", default=None, help="one of the family's voices (default: its default voice)")
    prep.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="converted teacher weights")
    bench = sub.add_parser("run", help="time the teacher and its half-precision variants on CUDA beside the "
                           "graph the family ships")
    bench.add_argument("--voice", required=True, help="the voice the inputs were prepared with, as the family loads "
                       "it: a voice name or file (a graph with its config beside it)")
    bench.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="converted teacher weights")
    bench.add_argument("--inputs", required=True)
    bench.add_argument("--out", required=True, help="results JSON; audio_<variant>.npz files go beside it")
    bench.add_argument("--warm-runs", type=int, default=5)
    bench.add_argument("--host-cpu-sentences", type=int, default=60)
    bench.add_argument("--host-cpu-threads", type=int, default=None, help="default: every core of the host")
    bench.add_argument("--device", default="cuda", help="cuda[:N]; cpu only for a smoke test")
    bench.add_argument("--variants", default="teacher", help=f"comma list: teacher and any of {sorted(HALF_VARIANTS)}")
    bench.add_argument("--keep-fp32", default=",".join(DEFAULT_KEEP_FP32),
                       help="parts the half variants leave in FP32 (comma list; '' for none)")
    bench.add_argument("--audio-utterances", type=int, default=40, help="waveforms saved per variant")
    bench.add_argument("--sensitivity-utterances", type=int, default=16, help="calibration utterances per table")
    add_allow_dirty_argument(bench)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.eval_set, args.out, args.seed, args.family, args.voice, args.cache_dir)
    else:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            parser.error("--device cuda needs a CUDA GPU: torch.cuda.is_available() is False")
        variants = tuple(name for name in args.variants.split(",") if name)
        keep_fp32 = tuple(role for role in args.keep_fp32.split(",") if role)
        try:
            run(args.voice, args.inputs, args.out, args.warm_runs, args.host_cpu_sentences, args.device,
                variants, keep_fp32, args.audio_utterances, args.sensitivity_utterances, args.host_cpu_threads,
                args.cache_dir, args.allow_dirty)
        except UnpublishableTreeError as error:  # raised before any work
            parser.error(str(error))


if __name__ == "__main__":
    main()
