"""The released ``JETSGenerator`` as one module: acoustic model (``am``) + HiFi-GAN (``generator``),
so the checkpoint's ``{'generator': state_dict}`` keys land on it as they are.

    out = EmotiVoiceGenerator(config)(phoneme_ids, lengths, speaker_ids, style, content)
    out["audio"]  # (B, T_feats_max * hop), right-padded; out["audio_lengths"] (B,)
"""
from __future__ import annotations

import torch
from torch import nn

from models.emotivoice.acoustic import AcousticModel
from models.emotivoice.config import GeneratorConfig
from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.vocoder_student import plain_vocoder


class EmotiVoiceGenerator(nn.Module):
    def __init__(self, config: GeneratorConfig):
        super().__init__()
        self.config = config
        self.am = AcousticModel(config)
        self.generator = HifiganGenerator(config)

    def inference_copy(self) -> EmotiVoiceGenerator:
        """A separate copy with weight norm folded into plain weights (same outputs, fewer kernels).
        Built afresh rather than deep-copied: torch's parametrized modules share a generated class
        with their deep copies, and folding a copy would strip the original's weights. The vocoder
        keeps its own shapes (a pruned or Lite vocoder in place of the teacher's)."""
        copy = EmotiVoiceGenerator(self.config)
        copy.am.load_state_dict(self.am.state_dict())
        copy.generator = plain_vocoder(self.generator)  # the teacher's, or a pruned or Lite one, with its shapes
        return copy.to(next(self.parameters()).device).eval()

    def forward(self, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor, speaker_ids: torch.Tensor,
                style_embedding: torch.Tensor, content_embedding: torch.Tensor, masked: bool = True,
                length_scale: float = 1.0) -> dict:
        """The acoustic model's outputs (models/emotivoice/acoustic.py) plus ``audio`` (B, T_audio) in
        [-1, 1] and ``audio_lengths`` (B,). ``masked=False`` reproduces the official batch behaviour."""
        out = self.am(phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding, masked=masked,
                      length_scale=length_scale)
        frame_lengths = out["frame_lengths"] if masked else None
        audio = self.generator(out["mel"].transpose(1, 2), frame_lengths)  # (B, 1, T_audio)
        out["audio"] = audio.squeeze(1)
        out["audio_lengths"] = out["frame_lengths"] * self.config.upsample_factor
        return out
