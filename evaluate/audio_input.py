"""The one check every quality metric applies to its audio input, with errors naming the input."""
from __future__ import annotations

import numpy as np
import torch


def mono_float32(waveform: torch.Tensor | np.ndarray, name: str = "waveform",
                 sample_rate_hz: int | None = None) -> np.ndarray:
    """A finite, non-empty mono waveform as float32 numpy (T,); ``sample_rate_hz`` checked if given."""
    if sample_rate_hz is not None and sample_rate_hz <= 0:
        raise ValueError(f"sample_rate_hz must be a positive number of samples per second, got {sample_rate_hz}")
    audio = waveform.detach().cpu().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
    if audio.ndim != 1:
        raise ValueError(f"{name} must be mono with shape (T,), got shape {tuple(audio.shape)}")
    if audio.size == 0:
        raise ValueError(f"{name} is empty: give at least one sample of audio")
    if not np.isfinite(audio).all():
        raise ValueError(f"{name} contains NaN or infinite samples: only finite values can be scored")
    return audio.astype(np.float32)
