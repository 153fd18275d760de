"""Every quality metric on the teacher's audio, clean and under controlled degradations.

Shows on a real sentence set (not only in the tests) that each metric ranks the degradations
the right way, and how far a clean teacher sits from 10 dB SNR. The teacher is a registered
family's PyTorch model (models/registry.py), its default voice unless ``--voice`` names another:

    python -m evaluate.metric_validity --eval-set harvard --sentences 60 --out outputs/metric_validity.json
    python -m evaluate.metric_validity --family <family> --voice <one of its voices> --out outputs/metric_validity.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from evaluate.degradations import STANDARD_DEGRADATIONS
from evaluate.dnsmos import DNSMOSP808, DNSMOSP835
from core.atomic_io import write_text_atomic
from core.publishing import add_allow_dirty_argument, publication_or_exit
from evaluate.asr import build_recognizer, error_rate_metric
from evaluate.settings import default_whisper_model
from evaluate.mcd import MelCepstralDistortion
from evaluate.speaker import SpeakerSimilarity
from models.interface import SynthesisRequest, TTSModel
from models.registry import FAMILIES, family_of, get_family
from texts import load_sentences
from core.paths import DEFAULT_CACHE_DIR, REPO_ROOT




def score_conditions(voice: TTSModel, sentences: list[str], language: str = "en",
                     recognizer_kind: str = "whisper") -> dict[str, dict[str, float]]:
    """Condition -> metric -> value over ``sentences`` spoken by ``voice``, utterance i with seed i."""
    family = family_of(voice)
    sequences = [seq for sentence in sentences for seq in voice.text_to_utterances(sentence)]
    clean = [
        voice.synthesize(SynthesisRequest.from_utterances([seq], sampling=family.sampling(seed=i))).waveforms()[0]
        for i, seq in enumerate(tqdm(sequences, desc="teacher"))
    ]
    texts = [seq.text for seq in sequences]
    recognizer = build_recognizer(recognizer_kind, default_whisper_model(language), language, 2, texts)
    rate = voice.sample_rate_hz
    table = {}
    for condition, degrade in STANDARD_DEGRADATIONS.items():
        p808, p835 = DNSMOSP808(), DNSMOSP835()
        error_name, error_rate = error_rate_metric(recognizer)
        mcd, similarity = MelCepstralDistortion(), SpeakerSimilarity()
        for i, (wave, text) in enumerate(tqdm(list(zip(clean, texts)), desc=condition)):
            degraded = degrade(wave, rate, i)  # (T,)
            p808.update(degraded, rate)
            p835.update(degraded, rate)
            error_rate.update(degraded, rate, text)
            mcd.update(degraded, wave, rate)
            similarity.update(degraded, wave, rate)
        table[condition] = {"dnsmos_p808": float(p808.compute()),
                            **{f"dnsmos_{k}": float(v) for k, v in p835.compute().items()},
                            error_name: float(error_rate.compute()), "mcd_db": float(mcd.compute()),
                            "spk_sim": float(similarity.compute())}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-set", default="eval")
    parser.add_argument("--sentences", type=int, default=60)
    parser.add_argument("--family", default=next(iter(FAMILIES)), choices=sorted(FAMILIES),
                        help="a registered model family (default: %(default)s, the first registered)")
    parser.add_argument("--voice", default=None, help="one of the family's voices (default: its default voice)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="converted teacher weights")
    parser.add_argument("--language", default="en", help="what the voice speaks; zh and ja are scored by CER")
    parser.add_argument("--recognizer", default="whisper", choices=("whisper", "pocketsphinx_domain"))
    parser.add_argument("--out", required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    if args.sentences < 1:
        parser.error(f"--sentences must be >= 1, got {args.sentences}")
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)  # a dirty tree refused before the run
    family = get_family(args.family)
    voice = args.voice or family.default_voice
    torch.manual_seed(0)
    table = score_conditions(family.load_teacher(voice, args.cache_dir), load_sentences(args.eval_set)[: args.sentences],
                             args.language, args.recognizer)
    payload = {"family": family.name, "voice": voice, "eval_set": args.eval_set, "sentences": args.sentences,
               "recognizer": args.recognizer, "language": args.language, "conditions": table}
    payload["provenance"] = origin
    write_text_atomic(Path(args.out), json.dumps(payload, indent=2))
    print("condition".ljust(18) + "".join(m.rjust(12) for m in next(iter(table.values()))))
    for condition, metrics in table.items():
        print(condition.ljust(18) + "".join(f"{v:12.3f}" for v in metrics.values()))


if __name__ == "__main__":
    main()
