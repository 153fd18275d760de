"""The synthesizer split at the durations, for TensorRT: text -> durations, then durations -> audio.

In one graph the frame count is a value (the sum of predicted durations) that becomes a shape:
onnxruntime takes that, TensorRT does not. Its shape tensors are computed from input shapes and
integer inputs only, so it refuses the graph at the frame ``Range`` ("Network input scales is a
shape tensor and must have type Int32 or Int64": the frame count descends from the float
``scales``). Split at the durations, each graph's shapes come from its inputs' shapes:

* ``TextToDurations``: phoneme ids -> frames per phoneme (the ``Ceil``) and the prior's mean and
  log-std per phoneme;
* ``DurationsToAudio``: those, plus ``prior_noise`` cut by the caller to the utterance's frame
  count (``models.piper.onnx_contract.frame_feeds``), -> audio. The frame count is the noise's
  length, a shape; the alignment is built inside from the durations as PiperVits builds it.

Run in turn, the pair computes what ``PiperVits.forward`` computes, op for op.
"""
from __future__ import annotations

import torch
from torch import nn

from models.piper.vits import PiperVits, durations_to_alignment, sequence_mask


def _speaker_embedding(vits: PiperVits, sid: torch.Tensor | None) -> torch.Tensor | None:
    return vits.emb_g(sid).unsqueeze(-1) if vits.emb_g is not None else None  # (B, C_g, 1)


class TextToDurations(nn.Module):
    """(input, input_lengths, scales, duration_noise[, sid]) -> durations (B, 1, T_text) float,
    prior_mean and prior_log_std (B, C_lat, T_text), zero past each item's text length."""

    def __init__(self, vits: PiperVits):
        super().__init__()
        self.vits = vits

    def forward(self, input, input_lengths, scales, duration_noise, sid=None):  # Piper names its input "input"
        hidden, prior_mean, prior_log_std, text_mask = self.vits.enc_p(input, input_lengths)
        g = _speaker_embedding(self.vits, sid)
        durations = self.vits.predict_durations(hidden, text_mask, duration_noise * scales[2], scales[1], g)
        return durations.unsqueeze(1), prior_mean, prior_log_std  # (B, 1, T_text), 2 x (B, C_lat, T_text)


class DurationsToAudio(nn.Module):
    """(durations, prior_mean, prior_log_std, prior_noise, scales[, sid]) -> audio (B, 1, 1, T_audio).

    ``prior_noise`` (B, C_lat, T_frames) sets the frame count; frames past an item's duration sum
    are masked, as padded items of a batch are in PiperVits.
    """

    def __init__(self, vits: PiperVits):
        super().__init__()
        self.vits = vits

    def forward(self, durations, prior_mean, prior_log_std, prior_noise, scales, sid=None):
        g = _speaker_embedding(self.vits, sid)
        frame_durations = durations[:, 0]  # (B, T_text)
        frame_lengths = frame_durations.sum(dim=1).clamp_min(1).long()  # (B,)
        frame_mask = sequence_mask(frame_lengths, prior_noise.shape[-1]).to(prior_mean.dtype)  # (B, T_frames)
        alignment = durations_to_alignment(frame_durations, frame_mask)  # (B, T_text, T_frames)
        frame_mean = prior_mean @ alignment  # (B, C_lat, T_frames)
        frame_log_std = prior_log_std @ alignment
        z_prior = frame_mean + prior_noise * torch.exp(frame_log_std) * scales[0]
        z = self.vits.flow.reverse(z_prior, frame_mask.unsqueeze(1), g)
        audio = self.vits.dec(z * frame_mask.unsqueeze(1), g)  # (B, 1, T_audio)
        return audio.unsqueeze(1)  # (B, 1, 1, T_audio), Piper's output shape
