"""Kokoro's text side below ALBERT: the acoustic text encoder (CNN + BiLSTM) and the prosody
predictor (duration encoder, duration head, F0 and energy curves).

Padded batches: BiLSTMs run by length (models/kokoro/lstm.py), so the reverse direction starts at
each item's real end, and padded positions are written back as zeros, exactly as the official
modules do; the frame-level blocks mask their AdaIN statistics to each item's frames.
"""
from __future__ import annotations

import torch
from torch import nn

from models.kokoro.layers import AdainResBlk1d, AdaLayerNorm
from models.kokoro.lstm import length_mask, run_bilstm
from models.layers import ChannelLayerNorm


class TextEncoder(nn.Module):
    """Phoneme ids -> acoustic text features t_en (B, C, T) aligned to frames by the durations."""

    def __init__(self, channels: int, kernel_size: int, depth: int, n_symbols: int):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, channels)
        self.cnn = nn.ModuleList(
            nn.Sequential(nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2),
                          ChannelLayerNorm(channels), nn.LeakyReLU(0.2))
            for _ in range(depth))
        self.lstm = nn.LSTM(channels, channels // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor | None, pad_mask: torch.Tensor) -> torch.Tensor:
        keep = (~pad_mask).unsqueeze(1).to(torch.float32)  # (B, 1, T): 0 at padding
        x = self.embedding(input_ids).transpose(1, 2) * keep  # (B, C, T)
        for block in self.cnn:
            x = block(x) * keep
        x = run_bilstm(self.lstm, x.transpose(1, 2), lengths).transpose(1, 2)  # (B, C, T)
        return x * keep


class DurationEncoder(nn.Module):
    """BiLSTMs alternating with style-conditioned LayerNorms; the style is concatenated to every
    layer's input. Returns d (B, T, H + S)."""

    def __init__(self, style_dim: int, hidden_dim: int, n_layers: int):
        super().__init__()
        self.lstms = nn.ModuleList()
        for _ in range(n_layers):
            self.lstms.append(nn.LSTM(hidden_dim + style_dim, hidden_dim // 2, 1, batch_first=True, bidirectional=True))
            self.lstms.append(AdaLayerNorm(style_dim, hidden_dim))

    def forward(self, d_en: torch.Tensor, style: torch.Tensor, lengths: torch.Tensor | None,
                pad_mask: torch.Tensor) -> torch.Tensor:
        keep = (~pad_mask).unsqueeze(-1).to(torch.float32)  # (B, T, 1)
        style_frames = style.unsqueeze(1).expand(-1, d_en.shape[-1], -1)  # (B, T, S)
        x = torch.cat([d_en.transpose(1, 2), style_frames], dim=-1) * keep  # (B, T, H + S)
        for block in self.lstms:
            if isinstance(block, AdaLayerNorm):
                x = torch.cat([block(x, style), style_frames], dim=-1) * keep  # (B, T, H + S)
            else:
                x = run_bilstm(block, x, lengths)  # (B, T, H)
        return x


class ProsodyPredictor(nn.Module):
    """Durations (sigmoid bins summed) per token; F0 and energy (N) curves at twice the frame rate."""

    def __init__(self, style_dim: int, hidden_dim: int, n_layers: int, max_dur: int):
        super().__init__()
        self.text_encoder = DurationEncoder(style_dim, hidden_dim, n_layers)
        self.lstm = nn.LSTM(hidden_dim + style_dim, hidden_dim // 2, 1, batch_first=True, bidirectional=True)
        self.duration_proj = nn.ModuleDict({"linear_layer": nn.Linear(hidden_dim, max_dur)})
        self.shared = nn.LSTM(hidden_dim + style_dim, hidden_dim // 2, 1, batch_first=True, bidirectional=True)
        half = hidden_dim // 2
        self.F0 = nn.ModuleList([AdainResBlk1d(hidden_dim, hidden_dim, style_dim),
                                 AdainResBlk1d(hidden_dim, half, style_dim, upsample=True),
                                 AdainResBlk1d(half, half, style_dim)])
        self.N = nn.ModuleList([AdainResBlk1d(hidden_dim, hidden_dim, style_dim),
                                AdainResBlk1d(hidden_dim, half, style_dim, upsample=True),
                                AdainResBlk1d(half, half, style_dim)])
        self.F0_proj = nn.Conv1d(half, 1, 1)
        self.N_proj = nn.Conv1d(half, 1, 1)

    def duration_logits(self, d: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """d (B, T, H + S) -> logits (B, T, max_dur). The official inference runs this LSTM unpacked
        at batch 1, which equals running it over each item's ``lengths`` (B,)."""
        return self.duration_proj["linear_layer"](run_bilstm(self.lstm, d, lengths))

    def F0Ntrain(self, en: torch.Tensor, style: torch.Tensor,
                 frame_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """en (B, H + S, F) frame-aligned prosody features -> (F0 Hz, N), each (B, 2F); with
        ``frame_lengths`` (B,) both are zero past 2 * frame_lengths."""
        shared = run_bilstm(self.shared, en.transpose(1, 2), frame_lengths).transpose(1, 2)  # (B, H, F)
        mask = None if frame_lengths is None else length_mask(frame_lengths, en.shape[-1])  # (B, 1, F)
        f0_curve = self._curve(self.F0, self.F0_proj, shared, style, mask)
        energy = self._curve(self.N, self.N_proj, shared, style, mask)
        return f0_curve, energy

    @staticmethod
    def _curve(blocks: nn.ModuleList, projection: nn.Conv1d, x: torch.Tensor, style: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """(B, H, F) -> (B, 2F) through one branch (F0 or N), zero past each item's 2F when masked."""
        for block in blocks:
            x = block(x, style, mask)
            if block.upsample and mask is not None:
                mask = mask.repeat_interleave(2, dim=-1)  # (B, 1, 2F)
        curve = projection(x)  # (B, 1, 2F)
        return (curve if mask is None else curve * mask).squeeze(1)


def durations_from_logits(logits: torch.Tensor, speed: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float durations (B, T), frames per token (B, T) int64 >= 1): each of the max_dur sigmoid bins
    adds up to one frame; speed > 1 shortens."""
    duration = torch.sigmoid(logits).sum(dim=-1) / speed
    return duration, torch.round(duration).clamp(min=1).long()


def alignment_matrix(frames_per_token: torch.Tensor, total_frames: int | None = None) -> torch.Tensor:
    """(B, T) frames per token -> (B, T, F) 0/1 alignment where token t covers frames
    [start_t, end_t); built from cumulative sums so the graph has no NonZero/ScatterND."""
    ends = frames_per_token.cumsum(dim=1)  # (B, T)
    starts = ends - frames_per_token
    if total_frames is None:
        # A data-dependent length: eager gets a Python int, torch.export an unbacked symbol.
        total_frames = ends[:, -1].max().item()
        torch._check(total_frames >= 1)
    frame = torch.arange(total_frames, device=frames_per_token.device).view(1, 1, -1)  # (1, 1, F)
    covered = (frame >= starts.unsqueeze(-1)) & (frame < ends.unsqueeze(-1))
    return covered.to(torch.float32)  # (B, T, F)


