r"""Engines for the PyTorch variants on CUDA, side by side in one call: eager, CUDA graphs with
static shape buckets, and torch.compile. Torch + numpy + safetensors only (the GPU machine).

    # here: phoneme ids (python -m evaluate.gpu_benchmark prepare ...) and the teacher's weights
    #       (python -m compress.distil prepare ... --out .device/distil)
    # there:
    python -m evaluate.gpu_engines --bundle .device/distil --inputs .device/bench_inputs.json \
        --lite models/checkpoints/lite_joe_medium.safetensors --utterances 100 --out $OUT/engines.json

Why buckets: Piper's frame count depends on the predicted durations, so one utterance's shapes
are known only halfway through. The bucketed engine splits synthesis at that point into two
static-shape stages, each captured once per bucket as a CUDA graph (one launch replays
hundreds of kernels):

    text stage     (B, T_text_bucket):                encoder + duration predictor -> durations, prior
    acoustic stage (B, T_text_bucket, T_frame_bucket): alignment, prior sample, flow, decoder -> audio

with one device-to-host copy of the frame count between them. Padding frames are masked zeros
in the flow; the decoder sees its own bias past the end, which moves the last few samples
slightly: the JSON reports the SNR of each engine against eager.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import time

import torch
from safetensors.torch import load_file

from evaluate.rtf import measure_batch1, measure_batched
from models.interface import NoiseControl, PhonemeSequence, SynthesisRequest, SynthesisResult
from models.piper.vits import PiperVits, durations_to_alignment, sequence_mask
from models.precision import to_half_precision

MIB = 1024 * 1024
TEXT_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512)  # phonemes; a batch pads to the next one
FRAME_BUCKET = 64  # frames round up to a multiple of this (0.74 s of audio at hop 256)


def _bucket(value: int, buckets: tuple[int, ...]) -> int:
    for size in buckets:
        if value <= size:
            return size
    raise ValueError(f"{value} phonemes: longer than the largest text bucket {buckets[-1]}")


class EagerEngine:
    """The model's own forward; outputs copied to the host (as a server would send them)."""

    def __init__(self, model: PiperVits, sample_rate_hz: int):
        self.model, self.sample_rate_hz = model, sample_rate_hz
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        noise = request.noise
        batch, length = request.phoneme_ids.shape
        duration_noise, prior_noise = noise.draw(batch, length, self.model.hp.latent_channels)
        audio, audio_lengths, durations = self.model(
            request.phoneme_ids.to(self.device), request.phoneme_lengths.to(self.device),
            duration_noise.to(self.device), prior_noise.to(self.device),
            noise.noise_scale, noise.length_scale, noise.noise_scale_w)
        return SynthesisResult(audio.float().cpu(), audio_lengths.cpu(), durations.cpu(), self.sample_rate_hz)


class BucketedEngine:
    """Two static-shape stages per bucket (see the module docstring); CUDA graphs when ``graphs``.

    ``compile_mode`` wraps each stage in torch.compile (dynamic=False: one compile per bucket).
    Noise scales are fixed per engine (the evaluation's defaults), as a serving config would be.
    """

    def __init__(self, model: PiperVits, sample_rate_hz: int, noise: NoiseControl, graphs: bool = True,
                 compile_mode: str | None = None):
        self.model, self.sample_rate_hz, self.noise, self.graphs = model, sample_rate_hz, noise, graphs
        self.device = next(model.parameters()).device
        parts = model.parts()
        self.encoder, self.flow, self.decoder = parts["encoder"], parts["flow"], parts["decoder"]
        self.hop = model.hp.hop_length
        self.text_stage_fn, self.acoustic_stage_fn = self._text_stage, self._acoustic_stage
        if compile_mode:
            self.text_stage_fn = torch.compile(self._text_stage, mode=compile_mode, dynamic=False)
            self.acoustic_stage_fn = torch.compile(self._acoustic_stage, mode=compile_mode, dynamic=False)
        self.captured: dict[tuple, tuple] = {}  # shape key -> (graph, static inputs, static outputs)
        self.pool = torch.cuda.graph_pool_handle() if graphs else None

    def _text_stage(self, phoneme_ids, phoneme_lengths, duration_noise):
        hidden, prior_mean, prior_log_std, text_mask = self.encoder(phoneme_ids, phoneme_lengths)
        durations = self.model.predict_durations(hidden, text_mask, duration_noise * self.noise.noise_scale_w,
                                                 self.noise.length_scale)  # (B, T_text)
        return durations, prior_mean, prior_log_std

    def _acoustic_stage(self, durations, prior_mean, prior_log_std, frame_lengths, prior_noise):
        frame_mask = sequence_mask(frame_lengths, prior_noise.shape[-1]).to(prior_mean.dtype)  # (B, F)
        alignment = durations_to_alignment(durations, frame_mask)  # (B, T_text, F)
        z = prior_mean @ alignment + prior_noise * torch.exp(prior_log_std @ alignment) * self.noise.noise_scale
        mask = frame_mask.unsqueeze(1)  # (B, 1, F)
        z = self.flow.reverse(z, mask) * mask
        return self.decoder(z)[:, 0]  # (B, F * hop)

    def _run(self, key: tuple, fn, inputs: tuple[torch.Tensor, ...]):
        if not self.graphs:
            return fn(*inputs)
        if key not in self.captured:
            static_inputs = tuple(t.clone() for t in inputs)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (cuDNN picks its kernels here)
                    fn(*static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static_outputs = fn(*static_inputs)
            self.captured[key] = (graph, static_inputs, static_outputs)
        graph, static_inputs, static_outputs = self.captured[key]
        for static, value in zip(static_inputs, inputs):
            static.copy_(value)
        graph.replay()
        return static_outputs

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        batch, length = request.phoneme_ids.shape
        text_bucket = _bucket(length, TEXT_BUCKETS)
        duration_noise, prior_noise = request.noise.draw(batch, length, self.model.hp.latent_channels)
        phoneme_ids = torch.zeros(batch, text_bucket, dtype=torch.long)
        phoneme_ids[:, :length] = request.phoneme_ids
        padded_duration_noise = torch.zeros(batch, 2, text_bucket)
        padded_duration_noise[:, :, :length] = duration_noise
        inputs = (phoneme_ids.to(self.device), request.phoneme_lengths.to(self.device),
                  padded_duration_noise.to(self.device))
        durations, prior_mean, prior_log_std = self._run(("text", batch, text_bucket), self.text_stage_fn, inputs)
        frame_lengths = durations.sum(dim=1).clamp_min(1).long()  # (B,)
        frames = int(frame_lengths.max())  # the one host sync
        frame_bucket = math.ceil(frames / FRAME_BUCKET) * FRAME_BUCKET
        noise = torch.zeros(batch, prior_noise.shape[1], frame_bucket)
        noise[:, :, : min(frames, prior_noise.shape[-1])] = prior_noise[:, :, :frames]
        audio = self._run(("acoustic", batch, text_bucket, frame_bucket), self.acoustic_stage_fn,
                          (durations, prior_mean, prior_log_std, frame_lengths, noise.to(self.device)))
        audio_lengths = frame_lengths * self.hop
        return SynthesisResult(audio[:, : frames * self.hop].float().cpu(), audio_lengths.cpu(),
                               durations[:, :length].long().cpu(), self.sample_rate_hz)


def _snr_db(reference: list[SynthesisResult], candidate: list[SynthesisResult]) -> float:
    signal = error = 0.0
    for ref, cand in zip(reference, candidate):
        n = int(min(ref.audio_lengths[0], cand.audio_lengths[0]))
        a, b = ref.audio[0, :n].double(), cand.audio[0, :n].double()
        signal += float((a**2).sum())
        error += float(((a - b) ** 2).sum())
    return 10 * math.log10(signal / max(error, 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="folder from `python -m compress.distil prepare`")
    parser.add_argument("--inputs", required=True, help="JSON from `python -m evaluate.gpu_benchmark prepare`")
    parser.add_argument("--lite", required=True, help="Lite student weights (safetensors)")
    parser.add_argument("--utterances", type=int, default=100)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--compile-seconds", type=float, default=120, help="skip torch.compile past this budget")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    from compress.decoder_training import hyperparams_from_dict
    from compress.distil import STUDENT_PARTS, load_student

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here: TF32 would flatter the teacher
    bundle = json.loads(open(f"{args.bundle}/bundle.json", encoding="utf-8").read())
    hp = hyperparams_from_dict(bundle["hyperparams"])
    teacher = PiperVits(hp)
    teacher.load_state_dict({k: v.float() for k, v in load_file(f"{args.bundle}/teacher.safetensors").items()})
    teacher.eval()
    lite = copy.deepcopy(teacher)
    parts, _ = load_student(hp, args.lite)
    for role in STUDENT_PARTS:
        lite.replace_part(role, parts[role])
    inputs = json.loads(open(args.inputs, encoding="utf-8").read())
    utterances = inputs["utterances"][: args.utterances]
    sequences = [PhonemeSequence(u["text"], (), tuple(u["phoneme_ids"])) for u in utterances]
    noises = [NoiseControl(seed=inputs["seed"] + i) for i in range(len(sequences))]
    sample_rate_hz = bundle["sample_rate_hz"]
    half = lambda model: to_half_precision(model, torch.float16, keep_fp32=("encoder", "duration"))  # a copy

    candidates = [  # (variant, engine, model factory, engine factory)
        ("teacher", "eager", lambda: teacher, EagerEngine),
        ("teacher", "cuda_graphs", lambda: teacher, BucketedEngine),
        ("fp16", "eager", lambda: half(teacher), EagerEngine),
        ("fp16", "cuda_graphs", lambda: half(teacher), BucketedEngine),
        ("lite", "eager", lambda: lite, EagerEngine),
        ("lite", "cuda_graphs", lambda: lite, BucketedEngine),
        ("lite_fp16", "eager", lambda: half(lite), EagerEngine),
        ("lite_fp16", "cuda_graphs", lambda: half(lite), BucketedEngine),
        ("lite_fp16", "compile_cuda_graphs", lambda: half(lite), "compile"),
    ]
    results: dict[str, dict] = {}
    eager_outputs: dict[str, list[SynthesisResult]] = {}
    for variant, engine_name, make_model, make_engine in candidates:
        key = f"{variant}/{engine_name}"
        try:
            model = make_model().to(args.device)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            if make_engine == "compile":
                engine = BucketedEngine(model, sample_rate_hz, NoiseControl(), graphs=True,
                                        compile_mode="max-autotune-no-cudagraphs")
            elif make_engine is BucketedEngine:
                engine = BucketedEngine(model, sample_rate_hz, NoiseControl())
            else:
                engine = EagerEngine(model, sample_rate_hz)
            # First pass over every utterance: captures/compiles each bucket once (reported), then timed.
            for sequence, noise in zip(sequences, noises):
                engine.synthesize(SynthesisRequest.from_sequences([sequence], noise=noise))
                if make_engine == "compile" and time.perf_counter() - started > args.compile_seconds:
                    raise TimeoutError(f"compile budget {args.compile_seconds} s spent before every bucket compiled")
            setup_s = time.perf_counter() - started
            speed, outputs = measure_batch1(engine.synthesize, sequences, noises, args.warm_runs, 1, args.device)
            vram_b1 = torch.cuda.max_memory_allocated() / MIB
            rtf_b16 = measure_batched(engine.synthesize, sequences, 16, noises[0], args.warm_runs, 1, args.device)
            row = {"rtf_cuda_b1": speed.rtf_b1, "rtf_cuda_b16": rtf_b16, "latency_first_audio_ms_cuda":
                   speed.latency_first_audio_ms, "vram_peak_mib": vram_b1,
                   "vram_peak_mib_b16": torch.cuda.max_memory_allocated() / MIB, "setup_s": setup_s}
            if engine_name == "eager":
                eager_outputs[variant] = outputs
            elif variant in eager_outputs:
                row["snr_db_vs_eager"] = _snr_db(eager_outputs[variant], outputs)
                row["durations_equal_vs_eager"] = float(all(
                    torch.equal(a.durations, b.durations) for a, b in zip(eager_outputs[variant], outputs)))
            results[key] = row
            print(key, json.dumps(row), flush=True)
            del engine, model
        except Exception as error:  # one engine failing must not lose the others' figures
            results[key] = {"error": f"{type(error).__name__}: {error}"[:500]}
            print(key, "failed:", results[key]["error"], flush=True)
        _write_report(args, results, len(sequences), inputs["eval_set"])  # after each engine: a timeout keeps the rest


def _write_report(args: argparse.Namespace, results: dict[str, dict], utterances: int, eval_set: str) -> None:
    baseline = results.get("teacher/eager", {}).get("rtf_cuda_b1")
    for row in results.values():
        if baseline and "rtf_cuda_b1" in row:
            row["speedup_b1_vs_teacher_eager"] = baseline / row["rtf_cuda_b1"]
    report = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "date": datetime.date.today().isoformat()},
              "utterances": utterances, "eval_set": eval_set, "warm_runs": args.warm_runs, "engines": results}
    with open(args.out + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
