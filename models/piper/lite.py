"""The Lite student for Piper voices: a slim flow and an iSTFT-head decoder.

Where the teacher spends its time (medium voice, per second of audio, multiply-accumulates):
the HiFi-GAN decoder about 1.95 G (its last stage alone, 32 channels at 22 kHz, 0.77 G), the
residual-coupling flow about 0.61 G, the text encoder and duration predictor about 0.1 G.
The Lite student keeps the teacher's encoder and duration predictor, and replaces

* the flow by the same coupling structure with a narrower WaveNet (``flow_hidden_channels``,
  ``flow_wn_layers``): about 0.08 G;
* the decoder by two upsampling stages instead of three, ending in an inverse-STFT head (as in
  iSTFTNet): the network predicts a magnitude and a phase per bin of a short STFT (``n_fft`` 16,
  hop 4), and a fixed transposed convolution turns them into samples. Stages run narrower
  (192 -> 96 -> 48 channels) with two residual-block kernels instead of three: about 0.5 G.

The inverse STFT is a ``ConvTranspose1d`` with a constant real-DFT basis, not a DFT operator, so
the exported graph stays in ops every engine runs (TensorRT has no DFT).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from dataclasses import dataclass

import torch
from torch import nn
from safetensors import safe_open
from safetensors.torch import load_file
from torch.nn import functional as F

from models.piper.vits import LRELU_SLOPE, ResBlock, ResidualCouplingFlow, VitsHyperParams


STUDENT_PARTS = ("flow", "decoder")  # the parts the Lite student replaces; weights keyed "<part>.<param>"
LITE_CONFIG_METADATA_KEY = "lite_student_config"  # safetensors metadata: the student's LiteStudentConfig as JSON


@dataclass(frozen=True)
class LiteStudentConfig:
    """Shapes of the Lite student's flow and decoder; JSON-able (stored beside its weights)."""

    decoder_initial_channels: int = 192  # teacher: 256
    upsample_rates: tuple[int, ...] = (8, 8)  # x64 in the network; the iSTFT hop gives the last x4
    upsample_kernel_sizes: tuple[int, ...] = (16, 16)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7)  # teacher: (3, 5, 7)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6))
    n_fft: int = 16  # iSTFTNet's C8C8I setting: 9 bins
    istft_hop: int = 4
    flow_hidden_channels: int = 96  # teacher: 192
    flow_wn_layers: int = 2  # teacher: 4

    def __post_init__(self):
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise ValueError(f"upsample_rates {self.upsample_rates} and upsample_kernel_sizes "
                             f"{self.upsample_kernel_sizes} must have the same length")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilations):
            raise ValueError("resblock_kernel_sizes and resblock_dilations must have the same length")
        if self.n_fft % 2 or self.n_fft % self.istft_hop or self.istft_hop < 1:
            raise ValueError(f"n_fft={self.n_fft}, istft_hop={self.istft_hop}: need an even n_fft that the hop divides")
        channels = self.decoder_initial_channels // 2 ** len(self.upsample_rates)
        if channels < 1 or min(self.flow_hidden_channels, self.flow_wn_layers) < 1:
            raise ValueError(f"{self}: channel counts and layers must stay >= 1")

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates) * self.istft_hop

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "LiteStudentConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"Lite student config: unknown keys {unknown}; accepted: {sorted(known)}")

        def as_tuples(value):  # JSON lists back to tuples
            return tuple(as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value

        return cls(**{name: as_tuples(value) for name, value in fields.items()})


def inverse_stft_basis(n_fft: int, hop: int) -> torch.Tensor:
    """(2 * (n_fft // 2 + 1), 1, n_fft) transposed-convolution weights of a windowed inverse real DFT.

    Rows 0..K-1 take the real parts, rows K..2K-1 the imaginary parts. Each frame is windowed
    (periodic Hann) and divided by the overlap-added squared window, which is constant away from
    the edges when the hop divides n_fft / 2, so the overlap-add of frames is the inverse STFT.
    """
    bins = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(bins, dtype=torch.float64).unsqueeze(1)  # (K, 1)
    angle = 2 * math.pi * k * n / n_fft  # (K, N)
    bin_weight = torch.full((bins, 1), 2.0, dtype=torch.float64)  # Hermitian symmetry doubles inner bins
    bin_weight[0] = bin_weight[-1] = 1.0
    window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)  # (N,)
    overlap = (window**2).sum() / hop  # overlap-added squared window, constant in steady state
    scale = window / (n_fft * overlap)  # (N,)
    real = bin_weight * torch.cos(angle) * scale  # (K, N)
    imaginary = -bin_weight * torch.sin(angle) * scale
    return torch.cat([real, imaginary]).unsqueeze(1).float()  # (2K, 1, N)


class InverseStftHead(nn.Module):
    """(B, 2K, T_spec) log-magnitude and phase logits -> (B, 1, T_spec * hop) waveform."""

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop, self.bins = n_fft, hop, n_fft // 2 + 1
        self.register_buffer("basis", inverse_stft_basis(n_fft, hop), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        magnitude = torch.exp(x[:, : self.bins])  # (B, K, T_spec)
        phase = math.pi * torch.sin(x[:, self.bins :])  # iSTFTNet's bounded phase
        spectrum = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)  # (B, 2K, T)
        frames = spectrum.shape[-1]
        audio = F.conv_transpose1d(spectrum, self.basis, stride=self.hop)  # (B, 1, (T - 1) * hop + n_fft)
        start = self.n_fft // 2  # frame t is centred on sample t * hop, as torch.stft(center=True) frames it
        return audio[:, :, start : start + frames * self.hop]


class IstftGenerator(nn.Module):
    """Latent frames (B, C_lat, T_frames) -> waveform (B, 1, T_frames * hop_length); the decoder's signature."""

    def __init__(self, latent_channels: int, config: LiteStudentConfig, speaker_channels: int = 0):
        super().__init__()
        ch = config.decoder_initial_channels
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(latent_channels, ch, 7, padding=3)
        self.cond = nn.Conv1d(speaker_channels, ch, 1) if speaker_channels else None
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes)):
            out_ch = ch // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(out_ch * 2, out_ch, kernel, rate, padding=(kernel - rate) // 2))
            for k, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilations):
                self.resblocks.append(ResBlock(out_ch, k, dilations, "2"))
        self.conv_post = nn.Conv1d(out_ch, 2 * (config.n_fft // 2 + 1), 7, padding=3)
        self.head = InverseStftHead(config.n_fft, config.istft_hop)

    def forward(self, z: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        x = self.conv_pre(z)  # (B, C0, T)
        if g is not None and self.cond is not None:
            x = x + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))  # (B, C_i, T * prod(rates[:i+1]))
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = sum(block(x) for block in blocks) / self.num_kernels
        return self.head(self.conv_post(F.leaky_relu(x)))  # (B, 1, T * hop_length)


def build_lite_parts(teacher_hp: VitsHyperParams, config: LiteStudentConfig) -> dict[str, nn.Module]:
    """The Lite student's replacement parts for a voice with ``teacher_hp``: {"flow", "decoder"}.

    The flow's output projections start at zero, so an untrained flow is the identity (up to the
    channel flips) and training starts from "decoder input = prior sample".
    """
    if config.hop_length != teacher_hp.hop_length:
        raise ValueError(f"Lite student hop {config.hop_length} != the voice's hop {teacher_hp.hop_length}: "
                         "choose upsample_rates and istft_hop whose product matches")
    flow_hp = dataclasses.replace(teacher_hp, hidden_channels=config.flow_hidden_channels,
                                  flow_wn_layers=config.flow_wn_layers)
    flow = ResidualCouplingFlow(flow_hp)
    for coupling in flow.couplings:
        nn.init.zeros_(coupling.post.weight)
        nn.init.zeros_(coupling.post.bias)
    speaker_channels = teacher_hp.speaker_channels if teacher_hp.num_speakers > 1 else 0
    decoder = IstftGenerator(teacher_hp.latent_channels, config, speaker_channels)
    return {"flow": flow, "decoder": decoder}


class LiteStudent(nn.Module):
    """The trainable parts: prior sample -> flow -> latent segment -> decoder -> audio segment."""

    def __init__(self, flow: nn.Module, decoder: nn.Module):
        super().__init__()
        self.flow = flow
        self.decoder = decoder

    def forward(self, z_prior: torch.Tensor, mask: torch.Tensor, starts: torch.Tensor,
                segment_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.flow.reverse(z_prior, mask) * mask  # (B, C_lat, T_frames)
        segments = slice_segments(z, starts, segment_frames)  # (B, C_lat, S)
        return z, self.decoder(segments)[:, 0]  # (B, S * hop)


def slice_segments(z: torch.Tensor, starts: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, C, T) -> (B, C, frames) starting at ``starts`` (B,); zero past the end."""
    padded = nn.functional.pad(z, (0, frames))
    index = (starts.view(-1, 1) + torch.arange(frames, device=z.device)).unsqueeze(1)  # (B, 1, S)
    return torch.gather(padded, 2, index.expand(-1, z.shape[1], -1))


def load_student(teacher_hp: VitsHyperParams, weights_path: Path) -> tuple[dict[str, nn.Module], LiteStudentConfig]:
    """The Lite parts from a safetensors file whose metadata holds their LiteStudentConfig."""
    with safe_open(str(weights_path), framework="pt") as handle:
        config = LiteStudentConfig.from_dict(json.loads(handle.metadata()[LITE_CONFIG_METADATA_KEY]))
    parts = build_lite_parts(teacher_hp, config)
    student = LiteStudent(parts["flow"], parts["decoder"])
    student.load_state_dict(load_file(str(weights_path)), strict=True)
    return {"flow": student.flow.eval(), "decoder": student.decoder.eval()}, config
