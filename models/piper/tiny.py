"""Piper's architecture with tiny random weights: the family contract test and export tests run on
it in seconds instead of loading the 63 MB voice. The frontend and sample rate are the bundled
voice's (its JSON config only), so text goes through real espeak-ng phonemes."""
from __future__ import annotations

import torch

from models.piper.vits import PiperVits, VitsHyperParams
from models.piper.voice import PiperVoice
from models.piper.voice_files import PiperVoiceFiles
from models.text.espeak_frontend import EspeakFrontend


def tiny_vits(num_speakers: int = 1, num_symbols: int = 30, seed: int = 0) -> PiperVits:
    torch.manual_seed(seed)
    hp = VitsHyperParams(
        num_symbols=num_symbols, hidden_channels=16, filter_channels=32, n_layers=2, latent_channels=8,
        flow_layers=2, flow_wn_layers=2, dp_filter_channels=16, upsample_initial_channel=16, upsample_rates=(4, 2),
        upsample_kernel_sizes=(8, 4), resblock_kernel_sizes=(3,), resblock_dilations=((1, 2),),
        num_speakers=num_speakers, speaker_channels=8 if num_speakers > 1 else 0,
    )
    return PiperVits(hp).eval()


def tiny_voice(seed: int = 0, voice: str = "bundled:joe") -> PiperVoice:
    """A PiperVoice with ``voice``'s frontend and tiny random weights (hop 8 instead of 256)."""
    config = PiperVoiceFiles.resolve(voice).config()
    id_map = config["phoneme_id_map"]
    num_symbols = 1 + max(i for ids in id_map.values() for i in ids)
    frontend = EspeakFrontend(config["espeak"]["voice"], id_map)
    return PiperVoice(tiny_vits(num_symbols=num_symbols, seed=seed), frontend, int(config["audio"]["sample_rate"]))
