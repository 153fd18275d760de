r"""Where Kokoro's bucketed engine spends a batch on the GPU: the text stage and the frame stage as
timed on the device, the rest of a synthesis call (the host sync, the audio's copy to the host) as
wall time minus both, and the frame stage split into its parts, each compiled and replayed alone as
a CUDA graph at the engine's shapes.

Why: the Lite generator does 3.2x fewer FLOPs than the teacher's, yet the compiled FP16 engine at
batch 16 gained only 1.4x from it (docs/benchmarks.md, session 28). Which part holds the rest of
the time is a measurement, not a guess.

    # GPU machine: full-size random weights, forced durations (speed is real, sound is not)
    PYTHONPATH=. python3 scripts/profile_kokoro_engine_stages.py --stage-channels 144 72 --batch 16 \
        --sentences 2 --variants ncw channels_last --kernels-dir $OUT --out $OUT/kokoro_stages.json

Parts of the frame stage (the engine's FrameStage, cut where its code has seams):

    prosody        alignment, the frame-rate BiLSTM, the F0 and energy blocks     (B, F) -> (B, 2F) curves
    shared_lstm    the frame-rate BiLSTM alone (F sequential steps each way)
    decoder_body   the decoder's encode and decode AdaIN blocks                   -> (B, 512, 2F)
    source         the harmonic source and its STFT                               -> (B, n_fft + 2, L / hop + 1)
    generator      the whole generator: source, upsampling stages, iSTFT          -> (B, L)

prosody, decoder_body and generator cover the stage (shared_lstm lies inside prosody, source inside
generator). The parts are timed for the first of ``--variants`` only (each costs a compile). They
are compiled one by one, so the compiler cannot fuse across their seams as in the whole stage,
which is timed beside them (at batch 16 on the H200 the three covering parts summed to 50.2 ms
against the stage's 50.9).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.revision import provenance
from models.cuda_graphs import GraphCache, StageTimer, replay_times_ms
from models.kokoro.engines import BucketedEngine
from models.kokoro.generator_student import slice_generator
from scripts.bench_kokoro import fixed_durations, official_config, profile_kernels, random_inputs, snr_db, token_ids

VARIANTS = {"ncw": {}, "channels_last": {"conv_layout": "channels_last"},
            "ncw_pageable": {"pinned_output": False}, "ncw_fused_bilstm": {"fused_bilstm": True},
            "ncw_text_tf32": {"text_tf32": True}, "ncw_all": {"fused_bilstm": True, "text_tf32": True},
            "ncw_autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
            "ncw_folded": {"fold_dilation": True}, "channels_last_folded": {"conv_layout": "channels_last", "fold_dilation": True},
            "ncw_folded_text_tf32": {"fold_dilation": True, "text_tf32": True},
            "ncw_aligned32": {"align_channels": 32}, "ncw_aligned32_text_tf32": {"align_channels": 32, "text_tf32": True},
            "ncw_stats32": {"statistics_dtype": torch.float32},
            "ncw_stats32_text_tf32": {"statistics_dtype": torch.float32, "text_tf32": True},
            "ncw_aligned32_stats32_text_tf32": {"align_channels": 32, "statistics_dtype": torch.float32,
                                                "text_tf32": True},
            "ncw_stats32_text_tf32_stacked": {"statistics_dtype": torch.float32, "text_tf32": True,
                                              "stacked_projections": True},
            "channels_last_stats32_text_tf32_stacked": {"conv_layout": "channels_last", "text_tf32": True,
                                                        "statistics_dtype": torch.float32, "stacked_projections": True},
            "ncw_stats32_text_tf32_stacked_fused_lstms": {"statistics_dtype": torch.float32, "text_tf32": True,
                                                          "stacked_projections": True, "fused_text_lstms": True,
                                                          "fused_bilstm": True},
            "channels_last_stats32_text_tf32_stacked_fused_lstms": {"conv_layout": "channels_last", "text_tf32": True,
                                                                    "statistics_dtype": torch.float32,
                                                                    "stacked_projections": True,
                                                                    "fused_text_lstms": True, "fused_bilstm": True}}
# The variants above without "stacked" in their names run the AdaINs' own projections, as they did
# when they were first timed (the engine now stacks them by default).
UNSTACKED = {"stacked_projections": False}


class Part(nn.Module):
    """A function of the frame model run under the frame stage's autocast, as FrameStage runs it."""

    def __init__(self, frame_model: nn.Module, function):
        super().__init__()
        self.frame_model, self.function = frame_model, function
        self.dtype = frame_model.bert_encoder.weight.dtype

    def forward(self, *inputs):
        with torch.autocast("cuda", dtype=self.dtype, enabled=self.dtype != torch.float32):
            return self.function(*inputs)


def frame_parts(engine: BucketedEngine, frames: int) -> dict[str, Part]:
    """The frame stage's parts (module docstring) over ``engine``'s frame model at bucket ``frames``."""
    model, shared_lstm = engine.frame_model, engine.shared_lstm
    stage = engine._frame_stage(frames)[1]
    stage = getattr(stage, "_orig_mod", stage)  # the FrameStage under torch.compile's wrapper

    def prosody(d, t_en, frames_per_token, ref_s):
        prosody_style = stage.block_style(ref_s, "prosody")
        en, asr, frame_lengths = stage.frame_features(d, t_en, frames_per_token)
        f0_curve, energy = stage.f0_and_energy(en, prosody_style, frame_lengths)
        return f0_curve, energy, asr, frame_lengths

    def lstm(d, t_en, frames_per_token):
        en, _, frame_lengths = stage.frame_features(d, t_en, frames_per_token)
        return shared_lstm(en.transpose(1, 2), frame_lengths)

    def decoder_body(asr, f0_curve, energy, ref_s, frame_lengths):
        acoustic_style = stage.block_style(ref_s, "decoder")
        return model.decoder.generator_input(asr, f0_curve, energy, acoustic_style, frame_lengths)

    def source(f0_curve, frame_lengths):
        generator = model.decoder.generator
        curve_lengths = 2 * frame_lengths
        excitation = generator.harmonic_source(f0_curve, None, curve_lengths).squeeze(-1)  # (B, L)
        return generator.stft.transform(excitation, curve_lengths * generator.upsample_scale)

    def generator(x, f0_curve, ref_s, frame_lengths):
        acoustic_style = stage.block_style(ref_s, "decoder")
        return model.decoder.generator(x, acoustic_style, f0_curve, None, 2 * frame_lengths)

    return {name: Part(model, function) for name, function in
            (("prosody", prosody), ("shared_lstm", lstm), ("decoder_body", decoder_body), ("source", source),
             ("generator", generator))}


def replay_ms(cache: GraphCache, key: tuple, repeats: int) -> float:
    """Median device milliseconds of one replay of the captured graph ``key``."""
    return statistics.median(replay_times_ms(cache.captured[key][0], repeats))


@torch.inference_mode()
def time_parts(engine: BucketedEngine, input_ids: torch.Tensor, style: torch.Tensor, frames_per_token: torch.Tensor,
               repeats: int) -> dict[str, float]:
    """Each frame-stage part of one batch, compiled, captured and replayed alone (device ms)."""
    speed = torch.ones(1, device=input_ids.device)
    d, t_en, _ = engine.text_stage(input_ids, style, speed)
    d, t_en = d.clone(), t_en.clone()
    frames = int(frames_per_token.sum(dim=-1).max())
    bucket = engine._frame_stage(frames)[0]
    parts = {name: torch.compile(part, dynamic=False) for name, part in frame_parts(engine, bucket).items()}
    cache = GraphCache()
    f0_curve, energy, asr, frame_lengths = (t.clone() for t in
                                            cache.run(("prosody",), parts["prosody"], (d, t_en, frames_per_token, style)))
    cache.run(("shared_lstm",), parts["shared_lstm"], (d, t_en, frames_per_token))
    x, = cache.run(("decoder_body",), parts["decoder_body"], (asr, f0_curve, energy, style, frame_lengths))
    x = x.clone()
    cache.run(("source",), parts["source"], (f0_curve, frame_lengths))
    cache.run(("generator",), parts["generator"], (x, f0_curve, style, frame_lengths))
    result = {name: replay_ms(cache, (name,), repeats) for name in parts}
    result["frame_bucket"] = bucket
    return result


def profile_variant(engine: BucketedEngine, sentences: list[list[int]], style_pack: torch.Tensor, batch: int,
                    sample_rate: int, repeats: int, parts: bool) -> dict:
    timer = StageTimer(engine)
    rows, audio = [], []
    for ids in sentences:
        style = style_pack[len(ids) - 3].unsqueeze(0).expand(batch, -1).cuda()  # (B, 2S)
        input_ids = torch.tensor([ids] * batch, device="cuda")  # (B, T)
        frames_per_token = fixed_durations(len(ids), batch).cuda()
        out = engine.synthesize(input_ids, style, frames_per_token=frames_per_token)  # compile and capture
        audio.append(out["audio"][0])
        timer.take_ms()
        walls, stages = [], []
        for _ in range(repeats):
            torch.cuda.synchronize()
            started = time.perf_counter()
            engine.synthesize(input_ids, style, frames_per_token=frames_per_token)  # ends with the audio on the host
            walls.append((time.perf_counter() - started) * 1e3)
            stages.append(timer.take_ms())
        wall = statistics.median(walls)
        text = statistics.median(s["text"] for s in stages)
        frames = statistics.median(s["frames"] for s in stages)
        row = {"tokens": len(ids), "audio_seconds": float(out["audio_lengths"].sum()) / sample_rate,
               "wall_ms": wall, "text_ms": text, "frames_ms": frames, "host_and_copies_ms": max(wall - text - frames, 0.0),
               "parts_ms": time_parts(engine, input_ids, style, frames_per_token, repeats) if parts else {}}
        rows.append(row)
    totals = {key: sum(row[key] for row in rows) for key in ("audio_seconds", "wall_ms", "text_ms", "frames_ms",
                                                           "host_and_copies_ms")}
    totals["rtf"] = totals["wall_ms"] / 1e3 / totals["audio_seconds"]
    if parts:
        part_names = [name for name in rows[0]["parts_ms"] if name != "frame_bucket"]
        totals["parts_ms"] = {name: sum(row["parts_ms"][name] for row in rows) for name in part_names}
    return {"totals": totals, "sentences": rows, "audio": audio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage-channels", type=int, nargs="+", default=None,
                        help="the generator sliced to these widths (the Lite decoder's); default: the teacher's")
    parser.add_argument("--variants", nargs="+", default=["ncw"], choices=sorted(VARIANTS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--kernels-dir", type=Path, default=None, help="each variant's CUDA kernel table, written here")
    parser.add_argument("--no-parts", action="store_true", help="skip the parts of the first variant (a compile each)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("this script times CUDA graphs: it needs a CUDA device")
    torch.backends.cudnn.benchmark = True  # as scripts/bench_kokoro.py: fixed shapes per bucket
    config = official_config()
    model, style_pack = random_inputs(config)
    if args.stage_channels:
        model.decoder.generator = slice_generator(model.decoder.generator, args.stage_channels).eval()
    model = model.cuda().eval()
    sentences = token_ids(config)[: args.sentences]
    report = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__},
              "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
              "weights": "random (timing only), forced durations", "variants": {},
              "provenance": provenance(REPO_ROOT, sys.argv)}
    first_audio: list[torch.Tensor] = []  # the first variant's audio per sentence (row 0)
    for index, name in enumerate(args.variants):
        engine = BucketedEngine(model, graphs=True, frame_dtype=torch.float16, compile_stages=True,
                                **{**UNSTACKED, **VARIANTS[name]})
        started = time.perf_counter()
        report["variants"][name] = profile_variant(engine, sentences, style_pack, args.batch, config.sample_rate_hz,
                                                   args.repeats, parts=index == 0 and not args.no_parts)
        if args.kernels_dir is not None:
            report["variants"][name]["kernels"] = profile_kernels(
                engine, style_pack, config, args.batch, args.sentences, True, "cuda",
                args.kernels_dir / f"kokoro_kernels_{name}_b{args.batch}.json")
        report["variants"][name]["seconds_with_compiles"] = time.perf_counter() - started
        # Random weights make no sound worth scoring, but two variants of one computation must agree.
        audio = report["variants"][name].pop("audio")
        first_audio = first_audio or audio
        report["variants"][name]["snr_db_vs_first_variant"] = [snr_db(a, b) for a, b in zip(first_audio, audio)]
        print(json.dumps({name: report["variants"][name]["totals"]}, indent=1), flush=True)
        # After every variant: a call cut short by its time limit keeps the variants it finished.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
