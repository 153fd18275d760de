"""Quality of Kokoro Lite students against our FP32 port, in PyTorch, without the speed bench: the
same 4 eval_ja sentences, noise off, and the same measures as scripts/bench_kokoro_cpu.py (DNSMOS
P.835 and P.808, resemblyzer speaker similarity, waveform SNR), and the band levels against our
port (evaluate/band_levels.py). A minute a student on this CPU against the bench's ten, so a
training run's checkpoints can be compared before one is benched.

    PYTHONPATH=. python scripts/eval_kokoro_lite_quality.py <student>.safetensors <trainer checkpoint>.pt ... \
        --out docs/results/cpu_NN_kokoro_lite_quality.json

A student is a Lite generator file (models/kokoro/generator_student.py) or a trainer checkpoint
(its ``model`` entry: the packed generator's weights, widths read from their shapes). Speed is not
measured here: the bench is the only source of speed figures. The PyTorch path scores within 0.002
of the bench's onnxruntime graph (the H200 student: P.808 3.654 / spk_sim 0.933 here, 3.652 / 0.932
in docs/results/cpu_28_kokoro_cpu_lite.json).
"""
from __future__ import annotations

import argparse
import hashlib
import platform
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT
from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from evaluate.band_levels import DEFAULT_BAND_EDGES_HZ, band_level_difference_db
from models.interface import SynthesisRequest
from models.kokoro.family import load_teacher
from models.kokoro.generator_student import load_student_generator, student_from_checkpoint
from models.kokoro.voice import KokoroVoice
from scripts.bench_kokoro_cpu import QUIET, quality, with_generator
from texts import load_sentences


def load_student(voice: KokoroVoice, path: Path) -> tuple[nn.Module, int | None]:
    """The student generator of a Lite generator file or a trainer checkpoint, and the step a checkpoint holds."""
    if path.suffix == ".pt":
        return student_from_checkpoint(voice.model.decoder.generator, path)
    return load_student_generator(voice.model.config, path)[0], None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", type=Path, nargs="+", help="Lite generator files or trainer checkpoints (.pt)")
    parser.add_argument("--voice", default="jf_alpha")
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.students if not path.is_file()]
    if missing:
        parser.error(f"no such student file: {', '.join(missing)}")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    torch.set_num_threads(args.threads)
    voice = load_teacher(args.voice, DEFAULT_CACHE_DIR)
    utterances = [u for s in load_sentences("eval_ja")[: args.sentences] for u in voice.text_to_utterances(s)]

    def synthesize(v: KokoroVoice) -> list[np.ndarray]:
        with torch.no_grad():
            return [v.synthesize(SynthesisRequest.from_utterances([u], sampling=QUIET)).waveforms()[0].numpy()
                    for u in utterances]

    references = synthesize(voice)
    scored = []
    for path in args.students:
        generator, step = load_student(voice, path)
        audio = synthesize(with_generator(voice, generator))
        scores = quality(audio, references, voice.sample_rate_hz, compare_waveform=True)
        scores["band_level_db_vs_fp32_port"] = np.mean(
            [band_level_difference_db(a, r, voice.sample_rate_hz) for a, r in zip(audio, references)], axis=0
        ).round(2).tolist()
        scored.append({"student": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                       "step": step, "stage_channels": list(generator.stage_channels), **scores})
        print(f"{path}: P.808 {scores['dnsmos_p808']:.3f}  spk_sim {scores['speaker_similarity_vs_fp32_port']:.4f}",
              flush=True)
    print_and_save_report({
        "what": "Kokoro Lite students in PyTorch against our FP32 port (noise off): quality only, no speed",
        "command": "PYTHONPATH=. python scripts/eval_kokoro_lite_quality.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": platform.node(), "provenance": origin, "torch": torch.__version__, "threads": args.threads,
        "sentences": [u.text for u in utterances], "band_edges_hz": list(DEFAULT_BAND_EDGES_HZ),
        "fp32_port": quality(references, references, voice.sample_rate_hz, compare_waveform=False),
        "students": scored,
    }, args.out)


if __name__ == "__main__":
    main()
