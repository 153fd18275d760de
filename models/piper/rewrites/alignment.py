"""Hard monotonic alignment from integer durations: a data-dependent reference and the cumsum form we export.

The reference writes ones phoneme by phoneme with ``repeat_interleave`` + scatter, the shape the
training code has: its ONNX needs NonZero/ScatterND and output sizes known only at run time.
``models.piper.vits.durations_to_alignment`` builds the same (B, T_text, T_frames) mask from
cumulative sums and comparisons, which TensorRT imports with the frame count as the only
dynamic dimension.
"""
from __future__ import annotations

import torch

from models.piper.vits import durations_to_alignment


def scatter_alignment(durations: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """Reference. durations: (B, T_text) int64; frame_mask: (B, T_frames). Returns (B, T_text, T_frames)."""
    batch, text_length = durations.shape
    alignment = torch.zeros(batch, text_length, frame_mask.shape[1], dtype=frame_mask.dtype)
    for item in range(batch):
        phoneme_of_frame = torch.repeat_interleave(torch.arange(text_length), durations[item].long())  # (frames_i,)
        frames = torch.arange(phoneme_of_frame.numel())
        keep = frames < frame_mask.shape[1]
        alignment[item].index_put_((phoneme_of_frame[keep], frames[keep]), torch.ones(int(keep.sum())))
    return alignment * frame_mask.unsqueeze(1)


cumsum_alignment = durations_to_alignment
