"""Quality of the audio the GPU benchmark saved: DNSMOS, WER, MCD and speaker similarity per variant.

``python -m evaluate.gpu_benchmark run`` writes ``audio_<variant>.npz`` (the first utterances of
the evaluation set, float16) beside its results; the GPU machine has no espeak-ng, pocketsphinx or
DNSMOS models, so the audio is scored here, with the same evaluate modules and the same metric
names as the pipeline (evaluate/runner.py):

    python -m evaluate.score_gpu_audio --npz results/audio_teacher.npz results/audio_fp16.npz \
        results/audio_bf16.npz --reference-variant teacher --out results/gpu_audio_quality.json

Word error rate comes from Whisper tiny.en, base for other languages (``--recognizer``;
evaluate/asr.py), as in the pipeline, and MCD and speaker similarity compare each variant with the
reference variant's audio of the same utterance and noise. ``wer_vs_teacher`` is a variant's WER minus the reference's.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import torch

from evaluate.dnsmos import DNSMOSP808, DNSMOSP835
from core.atomic_io import write_text_atomic
from core.paths import REPO_ROOT
from core.publishing import add_allow_dirty_argument, publication_or_exit
from evaluate.asr import build_recognizer, error_rate_metric
from evaluate.settings import RecognizerSettings
from evaluate.mcd import MelCepstralDistortion
from evaluate.speaker import SpeakerSimilarity



def load_audio(path: str) -> tuple[str, int, list[str], list[torch.Tensor]]:
    """(variant, sample_rate_hz, texts, float32 waveforms (T_i,)) from one gpu_benchmark npz."""
    with np.load(path, allow_pickle=False) as archive:
        texts = [str(text) for text in archive["texts"]]
        waveforms = [torch.from_numpy(archive[f"waveform_{i:04d}"].astype(np.float32)) for i in range(len(texts))]
        return str(archive["variant"]), int(archive["sample_rate_hz"]), texts, waveforms


def score(npz_paths: list[str], reference_variant: str, cpu_threads: int, recognizer_kind: str = "whisper",
          whisper_model: str | None = None, language: str = "en") -> dict:
    """``whisper_model`` None: chosen by ``language`` as the pipeline chooses (RecognizerSettings)."""
    loaded = {}
    for path in npz_paths:
        variant, sample_rate_hz, texts, waveforms = load_audio(path)
        if variant in loaded:
            raise ValueError(f"{path}: variant {variant!r} is already given by {loaded[variant]['path']}")
        loaded[variant] = {"path": path, "sample_rate_hz": sample_rate_hz, "texts": texts, "waveforms": waveforms}
    if reference_variant not in loaded:
        raise ValueError(f"--reference-variant {reference_variant!r} is not among the files' variants {sorted(loaded)}")
    reference = loaded[reference_variant]
    for variant, audio in loaded.items():
        # Files saved under the 16 MiB cap may hold fewer utterances; compare the common prefix.
        shared = min(len(audio["texts"]), len(reference["texts"]))
        if audio["texts"][:shared] != reference["texts"][:shared] or audio["sample_rate_hz"] != reference["sample_rate_hz"]:
            raise ValueError(f"{audio['path']} ({variant}) holds other utterances or another sample rate than "
                             f"{reference['path']} ({reference_variant}): they must come from one benchmark run")
    utterances = min(len(audio["texts"]) for audio in loaded.values())
    texts = reference["texts"][:utterances]
    sample_rate_hz = reference["sample_rate_hz"]
    settings = RecognizerSettings(recognizer_kind, whisper_model)  # tiny.en for another language fails here
    model = settings.whisper_model(language) if recognizer_kind == "whisper" else None
    recognizer = build_recognizer(recognizer_kind, model, language, cpu_threads, texts)

    results: dict[str, dict[str, float]] = {}
    for variant in [reference_variant] + sorted(set(loaded) - {reference_variant}):
        waveforms = loaded[variant]["waveforms"][:utterances]
        print(f"{variant}: scoring {utterances} utterances", flush=True)
        p808, p835 = DNSMOSP808(intra_op_threads=cpu_threads), DNSMOSP835(intra_op_threads=cpu_threads)
        error_name, error_rate = error_rate_metric(recognizer)
        for waveform, text in zip(waveforms, texts):
            p808.update(waveform, sample_rate_hz)
            p835.update(waveform, sample_rate_hz)
            error_rate.update(waveform, sample_rate_hz, text)
        metrics = {"dnsmos_p808": float(p808.compute()),
                   **{f"dnsmos_{name}": float(value) for name, value in p835.compute().items()},
                   error_name: float(error_rate.compute())}
        if variant != reference_variant:
            mcd, similarity = MelCepstralDistortion(), SpeakerSimilarity()
            for waveform, reference_waveform in zip(waveforms, reference["waveforms"]):
                mcd.update(waveform, reference_waveform, sample_rate_hz)
                similarity.update(waveform, reference_waveform, sample_rate_hz)
            metrics.update(mcd_db=float(mcd.compute()), spk_sim=float(similarity.compute()),
                           **{f"{error_name}_vs_teacher": metrics[error_name] - results[reference_variant][error_name]})
        results[variant] = metrics
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sources": {variant: audio["path"] for variant, audio in loaded.items()},
        "reference_variant": reference_variant, "utterances": utterances, "sample_rate_hz": sample_rate_hz,
        "variants": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", nargs="+", required=True, help="audio_<variant>.npz files of one gpu_benchmark run")
    parser.add_argument("--reference-variant", default="teacher")
    parser.add_argument("--out", required=True, help="JSON with the metrics per variant")
    parser.add_argument("--cpu-threads", type=int, default=2, help="onnxruntime threads for DNSMOS")
    parser.add_argument("--recognizer", default="whisper", choices=("whisper", "pocketsphinx_domain"))
    parser.add_argument("--whisper-model", default=None, choices=("tiny.en", "base"),
                        help="default: tiny.en for an English --language, base otherwise")
    parser.add_argument("--language", default="en", help="what the voice speaks; zh and ja are scored by CER")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)  # a dirty tree refused before scoring
    report = score(args.npz, args.reference_variant, args.cpu_threads, args.recognizer, args.whisper_model,
                   args.language)
    report["provenance"] = origin
    write_text_atomic(Path(args.out), json.dumps(report, indent=2))
    print(json.dumps(report["variants"], indent=2))


if __name__ == "__main__":
    main()
