"""Quality of Kokoro's frame stage in half precision, on the real voice: what FP16 or BF16 in the
decoder costs in sound, measured the way the variants are scored, so that a GPU engine in half
precision can be judged on more than waveform SNR (which a phase shift alone drives down).

    PYTHONPATH=. python scripts/kokoro_frame_precision_quality.py --sentences 8 \
        --out docs/results/cpu_23_kokoro_frame_precision.json
    PYTHONPATH=. python scripts/kokoro_frame_precision_quality.py --sentences 8 --dtypes float32 \
        --stats32-dtypes float32 --out docs/results/cpu_32_kokoro_statistics_dtype.json

Each sentence of texts/eval_sentences_ja.txt (never the calibration or training texts) runs through
models/kokoro/engines.py's BucketedEngine without CUDA graphs, once per frame dtype. The text stage is
FP32 in all of them, so the durations are the same and the audio lines up sample for sample.
``--stats32-dtypes`` adds, for each dtype named, the engine with its AdaIN statistics in float32
instead of the model's float64 (``<dtype>_stats32``). Against
the FP32 engine's audio: waveform SNR, STFT-magnitude SNR (phase-blind), mel-cepstral distortion,
speaker similarity; for every dtype, FP32 included: DNSMOS P.808 and the character error rate of
Whisper base in Japanese against the sentence. Half precision on this CPU is slow (minutes per dtype);
the sound it gives is the same arithmetic a GPU runs, up to the kernels' summation order.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from evaluate.asr import CharacterErrorRate, WhisperRecognizer
from evaluate.dnsmos import dnsmos_p808
from evaluate.mcd import mel_cepstral_distortion
from evaluate.speaker import speaker_similarity
from models.kokoro.engines import BucketedEngine
from models.kokoro.family import load_teacher
from texts import load_sentences

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STFT_FFT, STFT_HOP = 1024, 256  # the magnitude SNR's frames: 43 ms at 24 kHz


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    noise = float(np.sum((reference - estimate) ** 2))
    return 10 * np.log10(float(np.sum(reference ** 2)) / max(noise, 1e-20))


def magnitude_snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """SNR of the STFT magnitudes (F, frames): blind to phase, which the generator's sin() moves."""
    window = torch.hann_window(STFT_FFT)
    spectra = [torch.stft(torch.from_numpy(x), STFT_FFT, STFT_HOP, window=window, return_complex=True).abs().numpy()
               for x in (reference, estimate)]
    return snr_db(*spectra)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--stats32-dtypes", nargs="*", default=[], choices=list(DTYPES),
                        help="also these dtypes with float32 AdaIN statistics (the model's are float64)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recognizer", default="base", help="Whisper model for the character error rate")
    parser.add_argument("--out", type=Path, default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    if "float32" not in args.dtypes:
        parser.error("--dtypes must include float32: the other dtypes are compared with it")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    voice = load_teacher(args.voice, DEFAULT_CACHE_DIR)
    rate = voice.sample_rate_hz
    sentences = load_sentences("eval_ja")[: args.sentences]
    items = [(sentence, utterance) for sentence in sentences for utterance in voice.text_to_utterances(sentence)]

    # variant -> (frame dtype, AdaIN statistics dtype)
    variants = {name: (DTYPES[name], torch.float64) for name in args.dtypes}
    variants |= {f"{name}_stats32": (DTYPES[name], torch.float32) for name in args.stats32_dtypes}
    audio: dict[str, list[np.ndarray]] = {name: [] for name in variants}
    seconds: dict[str, float] = {}
    for name, (frame_dtype, statistics_dtype) in variants.items():
        engine = BucketedEngine(voice.model, graphs=False, frame_dtype=frame_dtype, statistics_dtype=statistics_dtype)
        start = time.perf_counter()
        for _, utterance in items:
            ids = torch.tensor([utterance.phoneme_ids])  # (1, T) with the boundary pads
            out = engine.synthesize(ids, voice.style_row(len(utterance.phoneme_ids) - 2))
            audio[name].append(out["audio"][0, : int(out["audio_lengths"][0])].numpy())
        seconds[name] = time.perf_counter() - start
        print(f"{name}: {len(items)} utterances in {seconds[name]:.0f} s", flush=True)

    recognizer = WhisperRecognizer(args.recognizer, language="ja", threads=args.threads)
    results: dict = {}
    for name in variants:
        cer = CharacterErrorRate(recognizer)
        for (sentence, _), clip in zip(items, audio[name]):
            cer.update(clip, rate, sentence)
        row = {"dnsmos_p808": statistics.mean(dnsmos_p808(clip, rate, intra_op_threads=args.threads) for clip in audio[name]),
               "cer": float(cer.compute()), "cpu_seconds_eager": seconds[name]}
        if name != "float32":
            pairs = list(zip(audio["float32"], audio[name]))
            if any(len(r) != len(e) for r, e in pairs):
                raise RuntimeError(f"{name}: lengths differ from float32 although the text stage is FP32 in both")
            waveform = [snr_db(r, e) for r, e in pairs]
            magnitude = [magnitude_snr_db(r, e) for r, e in pairs]
            row |= {"waveform_snr_db_min": min(waveform), "waveform_snr_db_median": statistics.median(waveform),
                    "magnitude_snr_db_min": min(magnitude), "magnitude_snr_db_median": statistics.median(magnitude),
                    "mcd_db_vs_float32": statistics.mean(mel_cepstral_distortion(e, r, rate) for r, e in pairs),
                    "spk_sim_vs_float32": statistics.mean(speaker_similarity(e, r, rate) for r, e in pairs)}
        results[name] = row
        print(name, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)

    report = {"voice": args.voice, "weights": "real (recovered from the shipped int8 graph)",
              "sentences": len(sentences), "utterances": len(items),
              "audio_seconds": sum(len(clip) for clip in audio["float32"]) / rate,
              "recognizer": f"whisper {args.recognizer} (ja)", "threads": args.threads,
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "origin": origin, "frame_dtypes": results,
              "statistics_dtypes": {name: str(statistics_dtype) for name, (_, statistics_dtype) in variants.items()}}
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
