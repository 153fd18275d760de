"""Every quality metric on the teacher's audio, clean and under controlled degradations.

Shows on a real sentence set (not only in the tests) that each metric ranks the degradations
the right way, and how far a clean teacher sits from 10 dB SNR:

    python -m evaluate.metric_validity --eval-set harvard --sentences 60 --out outputs/metric_validity.json
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from tqdm import tqdm

from evaluate.degradations import STANDARD_DEGRADATIONS
from evaluate.dnsmos import DNSMOSP808, DNSMOSP835
from evaluate.intelligibility import DomainRecognizer, WordErrorRate
from evaluate.mcd import MelCepstralDistortion
from evaluate.speaker import SpeakerSimilarity
from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from models.piper.voice import PiperVoice
from texts import load_sentences


def score_conditions(voice: PiperVoice, sentences: list[str]) -> dict[str, dict[str, float]]:
    sequences = [seq for sentence in sentences for seq in voice.text_to_utterances(sentence)]
    clean = [
        voice.synthesize(SynthesisRequest.from_utterances([seq], sampling=VitsSampling(seed=i))).waveforms()[0]
        for i, seq in enumerate(tqdm(sequences, desc="teacher"))
    ]
    texts = [seq.text for seq in sequences]
    recognizer = DomainRecognizer.from_sentences(texts)
    rate = voice.sample_rate_hz
    table = {}
    for condition, degrade in STANDARD_DEGRADATIONS.items():
        p808, p835, wer = DNSMOSP808(), DNSMOSP835(), WordErrorRate(recognizer)
        mcd, similarity = MelCepstralDistortion(), SpeakerSimilarity()
        for i, (wave, text) in enumerate(tqdm(list(zip(clean, texts)), desc=condition)):
            degraded = degrade(wave, rate, i)  # (T,)
            p808.update(degraded, rate)
            p835.update(degraded, rate)
            wer.update(degraded, rate, text)
            mcd.update(degraded, wave, rate)
            similarity.update(degraded, wave, rate)
        table[condition] = {"dnsmos_p808": float(p808.compute()),
                            **{f"dnsmos_{k}": float(v) for k, v in p835.compute().items()},
                            "wer": float(wer.compute()), "mcd_db": float(mcd.compute()),
                            "spk_sim": float(similarity.compute())}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-set", default="eval")
    parser.add_argument("--sentences", type=int, default=60)
    parser.add_argument("--voice", default="bundled:joe")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.sentences < 1:
        parser.error(f"--sentences must be >= 1, got {args.sentences}")
    torch.manual_seed(0)
    table = score_conditions(PiperVoice.load(args.voice), load_sentences(args.eval_set)[: args.sentences])
    payload = {"eval_set": args.eval_set, "sentences": args.sentences, "conditions": table}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
    os.replace(args.out + ".tmp", args.out)
    print("condition".ljust(18) + "".join(m.rjust(12) for m in next(iter(table.values()))))
    for condition, metrics in table.items():
        print(condition.ljust(18) + "".join(f"{v:12.3f}" for v in metrics.values()))


if __name__ == "__main__":
    main()
