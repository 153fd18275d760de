"""Kokoro's hyperparameters, read from the official ``config.json`` schema (hexgrad/Kokoro-82M).

The official decoder hard-codes three widths (1024-wide ``encode``/``decode`` blocks, a 64-channel
``asr_res`` projection); the fixture schema names them ``fixture_decoder_widths`` so a tiny model
can shrink them. Absent, they take the official values.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class AlbertSize:
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    num_hidden_layers: int
    embedding_size: int = 128  # transformers' AlbertConfig default, which the official config relies on


@dataclass(frozen=True)
class IstftNetSize:
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    n_fft: int
    hop_length: int


@dataclass(frozen=True)
class KokoroConfig:
    n_token: int
    hidden_dim: int
    style_dim: int
    n_layer: int
    max_dur: int
    text_encoder_kernel_size: int
    plbert: AlbertSize
    istftnet: IstftNetSize
    vocab: dict[str, int] = field(default_factory=dict)
    decoder_hidden: int = 1024  # official Decoder: encode/decode blocks are 1024 wide
    decoder_asr_res: int = 64  # official Decoder: asr_res is a 512 -> 64 conv
    sample_rate_hz: int = 24000  # official Generator: SourceModuleHnNSF(sampling_rate=24000)

    @classmethod
    def from_dict(cls, raw: dict) -> KokoroConfig:
        istft = raw["istftnet"]
        plbert = raw["plbert"]
        widths = raw.get("fixture_decoder_widths", {})
        return cls(
            n_token=int(raw["n_token"]), hidden_dim=int(raw["hidden_dim"]), style_dim=int(raw["style_dim"]),
            n_layer=int(raw["n_layer"]), max_dur=int(raw["max_dur"]),
            text_encoder_kernel_size=int(raw["text_encoder_kernel_size"]),
            plbert=AlbertSize(
                hidden_size=int(plbert["hidden_size"]), num_attention_heads=int(plbert["num_attention_heads"]),
                intermediate_size=int(plbert["intermediate_size"]),
                max_position_embeddings=int(plbert["max_position_embeddings"]),
                num_hidden_layers=int(plbert["num_hidden_layers"]),
                embedding_size=int(plbert.get("embedding_size", 128)),
            ),
            istftnet=IstftNetSize(
                upsample_rates=tuple(istft["upsample_rates"]),
                upsample_kernel_sizes=tuple(istft["upsample_kernel_sizes"]),
                upsample_initial_channel=int(istft["upsample_initial_channel"]),
                resblock_kernel_sizes=tuple(istft["resblock_kernel_sizes"]),
                resblock_dilation_sizes=tuple(tuple(d) for d in istft["resblock_dilation_sizes"]),
                n_fft=int(istft["gen_istft_n_fft"]), hop_length=int(istft["gen_istft_hop_size"]),
            ),
            vocab=dict(raw.get("vocab", {})),
            decoder_hidden=int(widths.get("hidden", 1024)),
            decoder_asr_res=int(widths.get("asr_res", 64)),
        )

    def to_dict(self) -> dict:
        """The official config.json layout ``from_dict`` reads (widths that file lacks included)."""
        net, plbert = self.istftnet, self.plbert
        return {"n_token": self.n_token, "hidden_dim": self.hidden_dim, "style_dim": self.style_dim,
                "n_layer": self.n_layer, "max_dur": self.max_dur, "text_encoder_kernel_size": self.text_encoder_kernel_size,
                "plbert": {"hidden_size": plbert.hidden_size, "num_attention_heads": plbert.num_attention_heads,
                           "intermediate_size": plbert.intermediate_size,
                           "max_position_embeddings": plbert.max_position_embeddings,
                           "num_hidden_layers": plbert.num_hidden_layers, "embedding_size": plbert.embedding_size},
                "istftnet": {"upsample_rates": list(net.upsample_rates),
                             "upsample_kernel_sizes": list(net.upsample_kernel_sizes),
                             "upsample_initial_channel": net.upsample_initial_channel,
                             "resblock_kernel_sizes": list(net.resblock_kernel_sizes),
                             "resblock_dilation_sizes": [list(d) for d in net.resblock_dilation_sizes],
                             "gen_istft_n_fft": net.n_fft, "gen_istft_hop_size": net.hop_length},
                "vocab": dict(self.vocab),
                "fixture_decoder_widths": {"hidden": self.decoder_hidden, "asr_res": self.decoder_asr_res}}

    @classmethod
    def from_json(cls, path: Path) -> KokoroConfig:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @property
    def samples_per_frame(self) -> int:
        """Output samples per predicted-duration frame: F0 runs at 2x the frame rate, then the
        generator upsamples by prod(upsample_rates) and the iSTFT by its hop."""
        upsampling = 1
        for rate in self.istftnet.upsample_rates:
            upsampling *= rate
        return 2 * upsampling * self.istftnet.hop_length
