"""Kokoro-82M in PyTorch: phoneme ids and a 256-d voice style vector -> 24 kHz audio and durations.

Sub-modules carry the official attribute names (bert, bert_encoder, predictor, text_encoder,
decoder), so a state dict maps one to one onto the official checkpoint (models/kokoro/checkpoint.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AlbertConfig, AlbertModel

from models.kokoro.config import KokoroConfig
from models.kokoro.decoder import Decoder, SourceNoise
from models.kokoro.prosody import (
    ProsodyPredictor,
    TextEncoder,
    alignment_matrix,
    durations_from_logits,
)


@dataclass
class KokoroOutput:
    audio: torch.Tensor  # (B, L) float
    frames_per_token: torch.Tensor  # (B, T) int64
    intermediates: dict[str, torch.Tensor]


def albert_config(config: KokoroConfig) -> AlbertConfig:
    plbert = config.plbert
    return AlbertConfig(
        vocab_size=config.n_token, hidden_size=plbert.hidden_size, num_attention_heads=plbert.num_attention_heads,
        intermediate_size=plbert.intermediate_size, max_position_embeddings=plbert.max_position_embeddings,
        num_hidden_layers=plbert.num_hidden_layers, embedding_size=plbert.embedding_size,
    )  # AlbertConfig's defaults (gelu_new, LayerNorm eps 1e-12, one shared layer) are PL-BERT's


class KokoroModel(nn.Module):
    def __init__(self, config: KokoroConfig, stft_variant: str = "torch"):
        super().__init__()
        self.config = config
        # The pooler is never used by Kokoro (and pruned from the int8 release), so it is not built.
        self.bert = AlbertModel(albert_config(config), add_pooling_layer=False)
        self.bert_encoder = nn.Linear(config.plbert.hidden_size, config.hidden_dim)
        self.predictor = ProsodyPredictor(config.style_dim, config.hidden_dim, config.n_layer, config.max_dur)
        self.text_encoder = TextEncoder(config.hidden_dim, config.text_encoder_kernel_size, config.n_layer,
                                        config.n_token)
        self.decoder = Decoder(config, stft_variant)
        self.eval()

    def split_style(self, ref_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 2S) voice row -> (acoustic style for the decoder, prosody style for the predictor)."""
        return ref_s[:, : self.config.style_dim], ref_s[:, self.config.style_dim:]

    def prosody_features(self, input_ids: torch.Tensor, prosody_style: torch.Tensor,
                         lengths: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Everything before the durations are rounded: bert_dur, d_en, d, duration logits."""
        pad_mask = self.pad_mask(input_ids, lengths)
        bert_dur = self.bert(input_ids, attention_mask=(~pad_mask).to(torch.int64)).last_hidden_state  # (B, T, Hb)
        d_en = self.bert_encoder(bert_dur).transpose(-1, -2)  # (B, H, T)
        d = self.predictor.text_encoder(d_en, prosody_style, lengths, pad_mask)  # (B, T, H + S)
        return {"bert_dur": bert_dur, "d_en": d_en, "d": d, "duration_logits": self.predictor.duration_logits(d, lengths)}

    @staticmethod
    def pad_mask(input_ids: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """(B, T) True at padding; all False when ``lengths`` is None (every item fills T)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        if lengths is None:
            return torch.zeros_like(input_ids, dtype=torch.bool)
        return positions >= lengths.to(input_ids.device).unsqueeze(1)

    def predict(self, input_ids: torch.Tensor, ref_s: torch.Tensor, speed: float | torch.Tensor = 1.0,
                frames_per_token: torch.Tensor | None = None,
                lengths: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Everything up to the decoder: durations, F0/N curves and frame-aligned text features.
        input_ids (B, T) with the 0 pads at both ends of each item; ref_s (B, 2S), one style per item.
        ``lengths`` (B,) ids per item, pads included (None: every item fills T): a padded item is
        predicted as it would be alone, its padding gets 0 frames, and ``frame_lengths`` (B,) counts
        its frames. ``frames_per_token`` (B, T) forces durations (for parity with another runtime)."""
        _, prosody_style = self.split_style(ref_s)
        if lengths is None:
            lengths = torch.full((input_ids.shape[0],), input_ids.shape[1], dtype=torch.long, device=input_ids.device)
        features = self.prosody_features(input_ids, prosody_style, lengths)
        duration_float, predicted = durations_from_logits(features["duration_logits"], speed)
        pad_mask = self.pad_mask(input_ids, lengths)
        frames = predicted if frames_per_token is None else frames_per_token
        frames = frames.masked_fill(pad_mask, 0)  # (B, T)
        frame_lengths = frames.sum(dim=1)  # (B,)
        alignment = alignment_matrix(frames)  # (B, T, F)
        en = features["d"].transpose(-1, -2) @ alignment  # (B, H + S, F), zero past each item's frames
        f0_curve, energy = self.predictor.F0Ntrain(en, prosody_style, frame_lengths)  # (B, 2F) each
        t_en = self.text_encoder(input_ids, lengths, pad_mask)  # (B, H, T)
        return {**features, "duration_float": duration_float, "frames_per_token": frames, "F0_pred": f0_curve,
                "N_pred": energy, "t_en": t_en, "asr": t_en @ alignment, "frame_lengths": frame_lengths}

    def decode(self, prediction: dict[str, torch.Tensor], ref_s: torch.Tensor,
               noise: SourceNoise | None = None) -> torch.Tensor:
        """(B, L) audio from ``predict``'s output; L = frames * samples_per_frame, item b zero past
        frame_lengths[b] * samples_per_frame."""
        acoustic_style, _ = self.split_style(ref_s)
        audio = self.decoder(prediction["asr"], prediction["F0_pred"], prediction["N_pred"], acoustic_style, noise,
                             prediction["frame_lengths"])
        return audio.squeeze(1)

    def forward_with_tokens(self, input_ids: torch.Tensor, ref_s: torch.Tensor, speed: float | torch.Tensor = 1.0,
                            noise: SourceNoise | None = None, frames_per_token: torch.Tensor | None = None,
                            lengths: torch.Tensor | None = None) -> KokoroOutput:
        """The official ``KModel.forward_with_tokens`` with its random draws as an input."""
        prediction = self.predict(input_ids, ref_s, speed, frames_per_token, lengths)
        audio = self.decode(prediction, ref_s, noise)
        return KokoroOutput(audio, prediction["frames_per_token"], prediction)
