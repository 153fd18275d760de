"""The port with recovered weights against the shipped int8 graph on real Japanese text:

    python -m models.kokoro.parity --voice jf_alpha

* durations: the share of tokens whose rounded frame count equals the graph's (int8 rounding moves
  a float duration by a few hundredths, so a token near x.5 may flip);
* decoder SNR: our decoder (no noise, as the graph) on the graph's own frame-aligned text features,
  F0 and N, against the graph's audio divided by its 1.5x iSTFT gain.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
import torch

from models.interface import Utterance
from models.kokoro.frontend import KokoroFrontend
from models.kokoro.model import KokoroModel
from models.kokoro.onnx_runtime import GRAPH_AUDIO_GAIN, Int8Graph
from models.kokoro.release import int8_graph_path, load_recovered_model, voice_pack

PARITY_SENTENCES_JA = (
    "今日はとても良い天気ですね。",
    "散歩に行きましょう。",
    "駅の前に新しい本屋ができたそうです。",
    "明日の会議は午後三時から始まります。",
    "この川の水はとても冷たくて、きれいです。",
    "子供たちは公園で楽しそうに遊んでいました。",
)


@dataclass
class ParityResult:
    tokens: int
    tokens_equal: int
    decoder_snr_db: list[float]

    @property
    def duration_agreement(self) -> float:
        return self.tokens_equal / self.tokens


def snr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    length = min(reference.size, estimate.size)
    reference, estimate = reference[:length].astype(np.float64), estimate[:length].astype(np.float64)
    return 10 * math.log10(float(np.sum(reference ** 2)) / max(float(np.sum((reference - estimate) ** 2)), 1e-30))


@torch.no_grad()
def int8_parity(model: KokoroModel, graph: Int8Graph, utterances: list[Utterance], voice: str) -> ParityResult:
    pack = voice_pack(voice)
    tokens = equal = 0
    snrs = []
    for utterance in utterances:
        ids = torch.tensor([utterance.phoneme_ids])
        style = pack[len(utterance.phoneme_ids) - 3].unsqueeze(0)  # row = phoneme count - 1
        graph_out = graph.run(ids.numpy(), style.numpy())
        ours = model.predict(ids, style)
        graph_frames = torch.from_numpy(graph_out["frames_per_token"]).long().reshape(-1)
        tokens += graph_frames.numel()
        equal += int((ours["frames_per_token"].reshape(-1) == graph_frames).sum())
        acoustic_style, _ = model.split_style(style)
        audio = model.decoder(torch.from_numpy(graph_out["asr"]), torch.from_numpy(graph_out["F0_pred"]).squeeze(1),
                              torch.from_numpy(graph_out["N_pred"]).squeeze(1), acoustic_style).reshape(-1)
        snrs.append(snr_db(graph_out["audio"] / GRAPH_AUDIO_GAIN, audio.numpy()))
    return ParityResult(tokens, equal, snrs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voice", default="jf_alpha")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_recovered_model()
    frontend = KokoroFrontend(model.config.vocab, "ja")
    utterances = [u for sentence in PARITY_SENTENCES_JA for u in frontend(sentence)]
    result = int8_parity(model, Int8Graph(int8_graph_path(), threads=1, internals=True), utterances, args.voice)
    print(f"durations equal on {result.tokens_equal} of {result.tokens} tokens ({100 * result.duration_agreement:.2f} %)")
    print("decoder SNR dB per sentence: " + ", ".join(f"{snr:.1f}" for snr in result.decoder_snr_db)
          + f"; mean {np.mean(result.decoder_snr_db):.2f}, min {min(result.decoder_snr_db):.2f}")


if __name__ == "__main__":
    main()
