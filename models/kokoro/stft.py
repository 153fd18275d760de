"""STFT and inverse STFT as (transposed) convolutions with fixed DFT bases: TensorRT has no
STFT/DFT op, and a conv graph is the same on every runtime.

Two variants reproduce the two official paths of Kokoro's generator:

* ``"torch"`` equals ``torch.stft``/``torch.istft`` (center, reflect padding, periodic Hann,
  inverse normalised by the window envelope, DC and Nyquist counted once);
* ``"custom"`` equals the official ``CustomSTFT`` (``disable_complex=True``): replicate padding, an
  inverse without envelope normalisation that weights every bin once, so its level differs.

Padded batches: ``lengths`` pads each item at its own end (reflect or replicate, as alone) and
``frame_mask`` keeps frames past an item's end out of its overlap-add and window envelope.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

STFT_VARIANTS = ("torch", "custom")
ENVELOPE_FLOOR = 1e-11  # torch.istft refuses envelopes below this; a lone item never has one in its span


class ConvStft(nn.Module):
    def __init__(self, n_fft: int, hop_length: int, variant: str = "torch", phase_floor: float = 0.0):
        """``phase_floor``: real and imaginary parts below it count as zero for the phase (not the
        magnitude), so a bin that carries no signal, or lies on the real axis (the edge frames of a
        reflect-padded signal are symmetric), gets phase 0 or pi whatever the rounding noise."""
        super().__init__()
        if variant not in STFT_VARIANTS:
            raise ValueError(f"STFT variant {variant!r}: use one of {list(STFT_VARIANTS)}")
        if phase_floor < 0:
            raise ValueError(f"phase_floor={phase_floor}: use a value >= 0")
        self.n_fft, self.hop_length, self.variant, self.phase_floor = n_fft, hop_length, variant, phase_floor
        bins = n_fft // 2 + 1
        n = torch.arange(n_fft, dtype=torch.float64)
        k = torch.arange(bins, dtype=torch.float64)
        angle = 2 * math.pi * k.unsqueeze(1) * n.unsqueeze(0) / n_fft  # (bins, n_fft)
        cosine, sine = torch.cos(angle), torch.sin(angle)
        if variant == "torch":
            # Exact zeros where the basis is zero (sin at multiples of pi: the DC and Nyquist bins of
            # a real signal are real, as torch.stft's FFT makes them). The official CustomSTFT keeps
            # the float residues of 1e-16, and with them the sign its Nyquist phase takes.
            cosine, sine = cosine.masked_fill(cosine.abs() < 1e-12, 0.0), sine.masked_fill(sine.abs() < 1e-12, 0.0)
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        forward_basis = torch.cat([cosine * window, -sine * window])  # (2 bins, n_fft)
        if variant == "torch":
            # A one-sided inverse real DFT counts the bins other than DC and Nyquist twice.
            weight = torch.full((bins, 1), 2.0, dtype=torch.float64)
            weight[0] = 1.0
            if n_fft % 2 == 0:
                weight[-1] = 1.0
        else:
            weight = torch.ones(bins, 1, dtype=torch.float64)
        inverse_basis = torch.cat([cosine, -sine]) * torch.cat([weight, weight]) * window / n_fft
        # Buffers are rebuilt from (n_fft, hop): never part of a checkpoint.
        self.register_buffer("forward_basis", forward_basis.to(torch.float32).unsqueeze(1), persistent=False)
        self.register_buffer("inverse_basis", inverse_basis.to(torch.float32).unsqueeze(1), persistent=False)
        self.register_buffer("window_squared", (window ** 2).to(torch.float32).view(1, 1, -1), persistent=False)

    def _pad_each_item(self, waveform: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (B, 1, L + n_fft): item b padded at 0 and at lengths[b] as it would be alone."""
        pad = self.n_fft // 2
        source = torch.arange(waveform.shape[1] + 2 * pad, device=waveform.device).unsqueeze(0) - pad  # (1, L + n_fft)
        last = (lengths.to(source.device) - 1).unsqueeze(1)  # (B, 1)
        if self.variant == "torch":
            source = source.abs()
            source = torch.where(source > last, 2 * last - source, source)  # mirror at the item's last sample
        source = torch.minimum(source.clamp(min=0), last).expand(waveform.shape[0], -1)  # (B, L + n_fft)
        return torch.gather(waveform, 1, source).unsqueeze(1)

    def transform(self, waveform: torch.Tensor,
                  lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) -> (magnitude, phase), each (B, n_fft/2 + 1, L/hop + 1); ``lengths`` (B,) valid
        samples per item (frames past an item's own are not zeroed here: see ``inverse``)."""
        pad = self.n_fft // 2
        if lengths is None:
            mode = "reflect" if self.variant == "torch" else "replicate"
            padded = F.pad(waveform.unsqueeze(1), (pad, pad), mode=mode)  # (B, 1, L + n_fft)
        else:
            padded = self._pad_each_item(waveform, lengths)
        spectrum = F.conv1d(padded, self.forward_basis, stride=self.hop_length)  # (B, 2 bins, frames)
        real, imag = spectrum.chunk(2, dim=1)
        if self.variant == "torch":
            magnitude = torch.sqrt(real * real + imag * imag)
        else:
            magnitude = torch.sqrt(real * real + imag * imag + 1e-14)
        if self.phase_floor > 0:
            real = torch.where(real.abs() < self.phase_floor, torch.zeros_like(real), real)
            imag = torch.where(imag.abs() < self.phase_floor, torch.zeros_like(imag), imag)
        # A real bin with a negative value has phase +pi (torch.angle), whatever the sign of its zero imaginary part.
        phase = torch.where((imag == 0) & (real < 0), torch.full_like(real, math.pi), torch.atan2(imag, real))
        return magnitude, phase

    def inverse(self, magnitude: torch.Tensor, phase: torch.Tensor,
                frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, bins, frames) magnitude and phase -> (B, 1, hop * (frames - 1)) waveform;
        ``frame_mask`` (B, 1, frames) 1 on each item's frames."""
        if frame_mask is not None:
            magnitude = magnitude * frame_mask
        spectrum = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)  # (B, 2 bins, frames)
        frames_out = F.conv_transpose1d(spectrum, self.inverse_basis, stride=self.hop_length)  # (B, 1, L + n_fft)
        if self.variant == "torch":
            present = torch.ones_like(magnitude[:, :1, :]) if frame_mask is None else frame_mask  # (B, 1, frames)
            envelope = F.conv_transpose1d(present, self.window_squared, stride=self.hop_length)
            # Past an item's end the envelope is 0 and so is the overlap-add: keep those samples 0, not NaN.
            frames_out = frames_out / envelope.clamp(min=ENVELOPE_FLOOR)
        pad = self.n_fft // 2
        return frames_out[..., pad:-pad]
