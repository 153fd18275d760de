"""GPU figures for a Piper voice: the PyTorch teacher on CUDA beside the original ONNX, one run.

Runs on a bare GPU machine with torch + numpy (+ onnx/onnxruntime, which the H200 image has):
phoneme ids are prepared here, where espeak-ng lives, and travel as JSON.

    # here: phonemize the evaluation sentences
    python -m evaluate.gpu_benchmark prepare --eval-set harvard --out .device/bench_inputs.json
    # on the GPU machine (see docs/benchmarks.md for the device call)
    python -m evaluate.gpu_benchmark run --voice .device/voice/en_US-joe-medium.onnx \
        --inputs .device/bench_inputs.json --out $OUT/gpu_results.json
    # here: merge into the MLflow run and the table
    python -m compress +experiment=baseline data=harvard evaluate.gpu_results=docs/results/h200_baseline.json

Metric names match evaluate/runner.py: rtf_cuda_b1, rtf_cuda_b16, vram_peak_mib,
latency_first_audio_ms_cuda; figures on the GPU host's CPU carry ``hostcpu`` in their name.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np
import torch

from evaluate.rtf import measure_batch1, measure_batched
from models.interface import NoiseControl, PhonemeSequence, SynthesisRequest, SynthesisResult

MIB = 1024 * 1024


def prepare(eval_set: str, out: str, seed: int) -> None:
    from models.piper.voice_files import PiperVoiceFiles
    from models.text.espeak_frontend import EspeakFrontend
    from texts import load_sentences

    config = PiperVoiceFiles.resolve("bundled:joe").config()
    frontend = EspeakFrontend(config["espeak"]["voice"], config["phoneme_id_map"])
    sequences = [seq for sentence in load_sentences(eval_set) for seq in frontend(sentence)]
    payload = {"eval_set": eval_set, "seed": seed, "sample_rate_hz": config["audio"]["sample_rate"],
               "utterances": [{"text": s.text, "phoneme_ids": list(s.phoneme_ids)} for s in sequences]}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(payload, handle)
    os.replace(out + ".tmp", out)
    print(f"{len(sequences)} utterances -> {out}")


class TorchVitsOnDevice:
    """A PiperVits module behind the synthesize(request) call that evaluate.rtf times."""

    def __init__(self, model, sample_rate_hz: int, device: str):
        self.model, self.sample_rate_hz, self.device = model, sample_rate_hz, device

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        noise = request.noise
        batch, length = request.phoneme_ids.shape
        duration_noise, prior_noise = noise.draw(batch, length, self.model.hp.latent_channels)
        audio, audio_lengths, durations = self.model(
            request.phoneme_ids.to(self.device), request.phoneme_lengths.to(self.device),
            duration_noise.to(self.device), prior_noise.to(self.device),
            noise.noise_scale, noise.length_scale, noise.noise_scale_w,
        )
        return SynthesisResult(audio, audio_lengths, durations, self.sample_rate_hz)


def _sequences(payload: dict) -> list[PhonemeSequence]:
    return [PhonemeSequence(u["text"], (), tuple(u["phoneme_ids"])) for u in payload["utterances"]]


def run(voice_onnx: str, inputs: str, out: str, warm_runs: int, host_cpu_sentences: int,
        device: str = "cuda") -> dict:
    """``device="cpu"`` runs the same code path without a GPU (a smoke test); names then say cpu."""
    import onnx

    from export.piper_onnx_runtime import PiperOnnxRuntimeVoice
    from models.piper.importer import onnx_to_state_dict
    from models.piper.vits import PiperVits

    with open(inputs, encoding="utf-8") as handle:
        payload = json.load(handle)
    sequences = _sequences(payload)
    noises = [NoiseControl(seed=payload["seed"] + i) for i in range(len(sequences))]
    sample_rate_hz = int(payload["sample_rate_hz"])
    hp, state = onnx_to_state_dict(onnx.load(voice_onnx))
    model = PiperVits(hp)
    model.load_state_dict(state, strict=True)
    model.eval()
    # The teacher is the fp32 reference: no TF32 in convolutions or matmuls.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    results: dict[str, dict[str, float]] = {"teacher": {}, "original_onnx": {}}

    # Teacher, fp32 eager: batch 1 over the whole set, then batches of 16.
    on_cuda = device.startswith("cuda")
    kind = "cuda" if on_cuda else "cpu"
    cuda_model = TorchVitsOnDevice(model.to(device), sample_rate_hz, device)
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        results["teacher"]["vram_weights_mib"] = torch.cuda.memory_allocated() / MIB
    speed, cuda_outputs = measure_batch1(cuda_model.synthesize, sequences, noises, warm_runs, 2, device)
    if on_cuda:
        results["teacher"]["vram_peak_mib"] = torch.cuda.max_memory_allocated() / MIB
        torch.cuda.reset_peak_memory_stats()
    rtf_b16 = measure_batched(cuda_model.synthesize, sequences, 16, noises[0], warm_runs, 2, device)
    if on_cuda:
        results["teacher"]["vram_peak_mib_b16"] = torch.cuda.max_memory_allocated() / MIB
    results["teacher"].update({
        f"rtf_{kind}_b1": speed.rtf_b1, f"rtf_{kind}_b1_median_utterance": speed.rtf_b1_median_utterance,
        f"rtf_{kind}_b16": rtf_b16, f"latency_first_audio_ms_{kind}": speed.latency_first_audio_ms,
    })

    # Same machine, same run: the original ONNX in onnxruntime (CPU build only on that image)
    # and the teacher on the host CPU, over the first sentences.
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    subset, subset_noises = sequences[:host_cpu_sentences], noises[:host_cpu_sentences]
    original = PiperOnnxRuntimeVoice(voice_onnx, threads=threads)
    ort_speed, ort_outputs = measure_batch1(original.synthesize, subset, subset_noises, warm_runs, 1, "cpu")
    cpu_model = TorchVitsOnDevice(model.to("cpu"), sample_rate_hz, "cpu")
    cpu_speed, _ = measure_batch1(cpu_model.synthesize, subset, subset_noises, warm_runs, 1, "cpu")
    results["original_onnx"].update(rtf_hostcpu_b1=ort_speed.rtf_b1,
                                    latency_first_audio_ms_hostcpu=ort_speed.latency_first_audio_ms)
    results["teacher"].update(rtf_hostcpu_b1=cpu_speed.rtf_b1,
                              latency_first_audio_ms_hostcpu=cpu_speed.latency_first_audio_ms)

    # CUDA teacher vs original ONNX on identical noise: durations, then waveforms where they agree.
    # (A ceil() at a rounding boundary can flip one phoneme's duration; that is counted, not hidden.)
    matched, max_rel_diff = 0, 0.0
    for cuda_out, ort_out in zip(cuda_outputs, ort_outputs):
        if not torch.equal(cuda_out.durations.cpu(), ort_out.durations):
            continue
        matched += 1
        n = int(ort_out.audio_lengths[0])
        diff = (cuda_out.audio[0, :n].cpu() - ort_out.audio[0, :n]).abs().max() / ort_out.audio[0, :n].abs().max()
        max_rel_diff = max(max_rel_diff, float(diff))
    results["teacher"].update(cuda_vs_onnx_max_diff_rel_peak=max_rel_diff,
                              cuda_vs_onnx_same_durations_fraction=matched / len(ort_outputs))

    report = {
        "machine": {"gpu": torch.cuda.get_device_name(0) if on_cuda else "none", "torch": torch.__version__,
                    "cuda": torch.version.cuda, "host_cpu_threads": threads, "python": platform.python_version(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "eval_set": payload["eval_set"], "utterances": len(sequences),
        "host_cpu_utterances": len(subset), "warm_runs": warm_runs,
        "audio_seconds": sum(t.audio_s for t in speed.per_utterance),
        "variants": results,
    }
    with open(out + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    os.replace(out + ".tmp", out)
    print(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="phonemize an evaluation set into a JSON the GPU machine reads")
    prep.add_argument("--eval-set", default="harvard")
    prep.add_argument("--out", required=True)
    prep.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser("run", help="time the teacher on CUDA beside the original ONNX")
    bench.add_argument("--voice", required=True, help="the original Piper .onnx (with .onnx.json beside it)")
    bench.add_argument("--inputs", required=True)
    bench.add_argument("--out", required=True)
    bench.add_argument("--warm-runs", type=int, default=5)
    bench.add_argument("--host-cpu-sentences", type=int, default=60)
    bench.add_argument("--device", default="cuda", help="cuda[:N]; cpu only for a smoke test")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.eval_set, args.out, args.seed)
    else:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            parser.error("--device cuda needs a CUDA GPU: torch.cuda.is_available() is False")
        run(args.voice, args.inputs, args.out, args.warm_runs, args.host_cpu_sentences, args.device)


if __name__ == "__main__":
    main()
