"""EmotiVoice's generator hyperparameters, read from the official config layout.

The official `config/joint/config.yaml` (yacs) holds the audio settings at the top level and the
network sizes under `model:`; the vocabulary and speaker-table sizes are not in it (the official
code counts the lines of `tokenlist` and `speaker2`), so they are taken from the checkpoint's own
embedding tables or from the user's data folder.

    config = GeneratorConfig.from_dict(yaml.safe_load(open("config.yaml")), n_vocab=502, n_speaker=2014)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GeneratorConfig:
    """Every size the acoustic model and the HiFi-GAN generator are built from."""

    n_vocab: int  # rows of the phoneme embedding: lines of `tokenlist`
    n_speaker: int  # rows of the speaker table: lines of `speaker2`
    n_mels: int
    sample_rate_hz: int
    hop_length: int
    encoder_n_layers: int
    encoder_n_heads: int
    encoder_n_hidden: int
    encoder_kernel_size: int  # the feed-forward convolutions' kernel (`encoder_kernel_size_conv_mod`)
    decoder_n_layers: int
    decoder_n_heads: int
    decoder_n_hidden: int
    decoder_kernel_size: int
    variance_n_hidden: int
    variance_n_layers: int
    variance_kernel_size: int
    variance_embed_kernel_size: int
    duration_n_layers: int
    duration_kernel_size: int
    bert_embedding: int  # width of the style and content embeddings (the BERT pooler output)
    initial_channel: int  # HiFi-GAN input channels; must equal n_mels
    upsample_initial_channel: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        if self.decoder_n_hidden != self.encoder_n_hidden:
            raise ValueError(f"decoder_n_hidden {self.decoder_n_hidden} != encoder_n_hidden {self.encoder_n_hidden}: "
                             "EmotiVoice has no projection between encoder and decoder, the widths must match")
        if self.initial_channel != self.n_mels:
            raise ValueError(f"model.initial_channel {self.initial_channel} != n_mels {self.n_mels}: "
                             "the vocoder reads the acoustic model's mel frames")
        if any(len(d) != 3 for d in self.resblock_dilation_sizes):
            raise ValueError(f"resblock_dilation_sizes {self.resblock_dilation_sizes}: ResBlock1 takes 3 dilations each")
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise ValueError(f"upsample_rates {self.upsample_rates} and upsample_kernel_sizes "
                             f"{self.upsample_kernel_sizes} must have one entry per stage")

    @property
    def upsample_factor(self) -> int:
        """Waveform samples per mel frame."""
        factor = 1
        for rate in self.upsample_rates:
            factor *= rate
        return factor

    @classmethod
    def from_dict(cls, config: dict, n_vocab: int, n_speaker: int) -> "GeneratorConfig":
        """From the official yaml's content (top level + ``model``)."""
        model = config["model"]
        if str(model.get("resblock", "1")) != "1":
            raise ValueError(f"model.resblock={model['resblock']!r}: the released vocoder uses ResBlock1 ('1') only")
        return cls(
            n_vocab=int(n_vocab), n_speaker=int(n_speaker), n_mels=int(config["n_mels"]),
            sample_rate_hz=int(config["sr"]), hop_length=int(config["hop_length"]),
            encoder_n_layers=model["encoder_n_layers"], encoder_n_heads=model["encoder_n_heads"],
            encoder_n_hidden=model["encoder_n_hidden"], encoder_kernel_size=model["encoder_kernel_size_conv_mod"],
            decoder_n_layers=model["decoder_n_layers"], decoder_n_heads=model["decoder_n_heads"],
            decoder_n_hidden=model["decoder_n_hidden"], decoder_kernel_size=model["decoder_kernel_size_conv_mod"],
            variance_n_hidden=model["variance_n_hidden"], variance_n_layers=model["variance_n_layers"],
            variance_kernel_size=model["variance_kernel_size"],
            variance_embed_kernel_size=model["variance_embed_kernel_size"],
            duration_n_layers=model["duration_n_layers"], duration_kernel_size=model["duration_kernel_size"],
            bert_embedding=model["bert_embedding"], initial_channel=model["initial_channel"],
            upsample_initial_channel=model["upsample_initial_channel"],
            upsample_rates=tuple(model["upsample_rates"]), upsample_kernel_sizes=tuple(model["upsample_kernel_sizes"]),
            resblock_kernel_sizes=tuple(model["resblock_kernel_sizes"]),
            resblock_dilation_sizes=tuple(tuple(d) for d in model["resblock_dilation_sizes"]),
        )
