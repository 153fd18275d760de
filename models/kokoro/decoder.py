"""Kokoro's decoder: AdaIN residual blocks on frame-aligned text features, F0 and energy, then an
iSTFTNet generator excited by a harmonic-plus-noise source (NSF) built from F0.

Randomness is an input: ``SourceNoise`` holds the two draws the official SineGen makes (initial
phases of the overtones, additive noise). None means no noise, which is what the shipped int8
ONNX graph computes.

Padded batches: ``frame_lengths`` (B,) counts each item's duration frames; every stage masks its
AdaIN statistics and zeroes what lies past an item's end, pads the source's STFT at each item's own
end and interpolates the phase up to each item's last frame, so an item decodes as it would alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.kokoro.config import KokoroConfig
from models.kokoro.layers import AdainResBlk1d, AdaINResBlock1
from models.kokoro.lstm import length_mask
from models.kokoro.stft import ConvStft

HARMONICS = 9  # official Generator: SourceModuleHnNSF(harmonic_num=8) -> fundamental + 8 overtones
SINE_AMPLITUDE = 0.1
VOICED_NOISE_STD = 0.003
VOICED_THRESHOLD_HZ = 10.0
# The source is tanh-bounded; its STFT's float32 rounding noise is ~1e-7. Parts below this floor
# are read as zero for the phase the generator takes in (ConvStft), so an unvoiced stretch (a
# constant source, every bin but DC empty) or a symmetric edge frame (real bins) gets the same
# phase in any batch, instead of the sign of rounding noise (a 2 pi jump).
SOURCE_PHASE_FLOOR = 1e-6


@dataclass
class SourceNoise:
    """The official SineGen's two random draws, made explicit."""

    initial_phase: torch.Tensor  # (B, HARMONICS) in [0, 1) cycles; column 0 (the fundamental) is ignored
    additive: torch.Tensor  # (B, L_samples, HARMONICS) standard normal

    @classmethod
    def draw(cls, batch: int, samples: int, generator: torch.Generator | None = None,
             device: str | torch.device = "cpu") -> SourceNoise:
        return cls(torch.rand(batch, HARMONICS, generator=generator, device=device),
                   torch.randn(batch, samples, HARMONICS, generator=generator, device=device))


class HarmonicSource(nn.Module):
    """F0 (B, L, 1) at the sample rate -> merged harmonic excitation (B, L, 1) (SourceModuleHnNSF)."""

    def __init__(self, sample_rate_hz: int, upsample_scale: int):
        super().__init__()
        self.sample_rate_hz = sample_rate_hz
        self.upsample_scale = upsample_scale
        self.l_linear = nn.Linear(HARMONICS, 1)
        self.register_buffer("harmonic_numbers", torch.arange(1, HARMONICS + 1, dtype=torch.float32), persistent=False)

    def forward(self, f0: torch.Tensor, noise: SourceNoise | None,
                frame_counts: torch.Tensor | None = None) -> torch.Tensor:
        """``frame_counts`` (B,): each item's F0 values (L / upsample_scale when None)."""
        cycles = (f0 * self.harmonic_numbers / self.sample_rate_hz) % 1  # (B, L, H) cycles per sample
        if noise is not None:
            initial = torch.cat([torch.zeros_like(noise.initial_phase[:, :1]), noise.initial_phase[:, 1:]], dim=1)
            cycles = torch.cat([cycles[:, :1] + initial.unsqueeze(1), cycles[:, 1:]], dim=1)
        # The phase is integrated at the frame rate and interpolated back, as the official SineGen
        # does: summing per sample in float32 would drift over a long utterance.
        per_frame = downsample_linear(cycles.transpose(1, 2), self.upsample_scale)  # (B, H, L / scale)
        phase = torch.cumsum(per_frame, dim=2) * 2 * math.pi
        frames = per_frame.shape[-1]
        if frame_counts is None:
            frame_counts = torch.full((f0.shape[0],), frames, dtype=torch.long, device=f0.device)
        phase = upsample_linear(phase * self.upsample_scale, self.upsample_scale, frame_counts)  # (B, H, L)
        sines = torch.sin(phase.transpose(1, 2)) * SINE_AMPLITUDE  # (B, L, H)
        voiced = (f0 > VOICED_THRESHOLD_HZ).to(torch.float32)  # (B, L, 1)
        sines = sines * voiced
        if noise is not None:
            noise_std = voiced * VOICED_NOISE_STD + (1 - voiced) * SINE_AMPLITUDE / 3
            sines = sines + noise_std * samples_of(noise.additive, f0.shape[1])
        return torch.tanh(self.l_linear(sines))  # (B, L, 1)


def samples_of(additive: torch.Tensor, samples: int) -> torch.Tensor:
    """(B, L_drawn, H) noise -> (B, samples, H): cut when drawn longer, zero-extended when shorter
    (a draw sized before the durations are known; zero-extended, an item gets no noise there)."""
    zeros = torch.zeros(additive.shape[0], samples, additive.shape[2], dtype=additive.dtype, device=additive.device)
    return torch.cat([additive, zeros], dim=1)[:, :samples]


def downsample_linear(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, C, n * scale) -> (B, C, n): F.interpolate(scale_factor=1/scale, mode="linear") written
    as a reshape, which exports for any length: output j lies at input j * scale + (scale - 1) / 2."""
    blocks = x.reshape(x.shape[0], x.shape[1], -1, scale)  # (B, C, n, scale)
    if scale % 2:
        return blocks[..., scale // 2]
    return 0.5 * blocks[..., scale // 2 - 1] + 0.5 * blocks[..., scale // 2]


def upsample_linear(x: torch.Tensor, scale: int, frame_counts: torch.Tensor) -> torch.Tensor:
    """(B, C, n) -> (B, C, n * scale): F.interpolate(scale_factor=scale, mode="linear") where item b
    ends at frame frame_counts[b] - 1, with the CPU kernel's arithmetic written out: the source
    position and the blend are each rounded once (fused multiply-adds there, float64 here, exact
    before the one rounding), so this equals the official code to the bit on a phase of thousands
    of radians, where one float32 ulp is already 5e-4 rad. An exported graph computes in float32
    (TensorRT has no float64), within an ulp of that."""
    wide = torch.float32 if torch.compiler.is_exporting() else torch.float64
    ratio = torch.tensor(1.0 / scale, dtype=torch.float32).to(wide)  # the kernel's float32 1/scale
    position = torch.arange(x.shape[-1] * scale, device=x.device).to(wide)  # (L,)
    source = (ratio * (position + 0.5) - 0.5).to(torch.float32).clamp(min=0)  # (L,)
    last = (frame_counts.to(x.device) - 1).unsqueeze(1)  # (B, 1)
    left = torch.minimum(source.floor().long().unsqueeze(0), last)  # (B, L)
    right = torch.minimum(left + 1, last)  # interpolate holds a sequence's last frame
    weight = (source.unsqueeze(0) - left.to(torch.float32)).clamp(0, 1).unsqueeze(1)  # (B, 1, L)
    channels = x.shape[1]
    left_value = torch.gather(x, 2, left.unsqueeze(1).expand(-1, channels, -1))  # (B, C, L)
    right_value = torch.gather(x, 2, right.unsqueeze(1).expand(-1, channels, -1))
    blended = (right_value * weight).to(wide) + left_value.to(wide) * (1 - weight).to(wide)
    return blended.to(x.dtype)


def official_stage_channels(config: KokoroConfig) -> tuple[int, ...]:
    """The official generator's width after each upsampling: halved at every stage."""
    net = config.istftnet
    return tuple(net.upsample_initial_channel // 2 ** (i + 1) for i in range(len(net.upsample_rates)))


class Generator(nn.Module):
    """``stage_channels``: the width after each upsampling (None: the official halving). A narrower
    generator (models/kokoro/generator_student.py) takes the same input, the decoder's
    ``upsample_initial_channel`` channels, and returns the same spectrum."""

    def __init__(self, config: KokoroConfig, stft_variant: str = "torch",
                 stage_channels: tuple[int, ...] | None = None):
        super().__init__()
        net, style_dim = config.istftnet, config.style_dim
        self.num_kernels = len(net.resblock_kernel_sizes)
        self.num_upsamples = len(net.upsample_rates)
        self.stage_channels = tuple(stage_channels or official_stage_channels(config))
        if len(self.stage_channels) != self.num_upsamples or min(self.stage_channels) < 1:
            raise ValueError(f"stage_channels {self.stage_channels}: need {self.num_upsamples} positive widths, "
                             "one per upsampling")
        self.n_fft = net.n_fft
        self.upsample_scale = math.prod(net.upsample_rates) * net.hop_length  # samples per F0 value
        self.m_source = HarmonicSource(config.sample_rate_hz, self.upsample_scale)
        self.ups, self.resblocks = nn.ModuleList(), nn.ModuleList()
        self.noise_convs, self.noise_res = nn.ModuleList(), nn.ModuleList()
        channels_in = net.upsample_initial_channel
        for i, (rate, kernel) in enumerate(zip(net.upsample_rates, net.upsample_kernel_sizes)):
            channels = self.stage_channels[i]
            self.ups.append(nn.ConvTranspose1d(channels_in, channels, kernel, rate, padding=(kernel - rate) // 2))
            for res_kernel, dilations in zip(net.resblock_kernel_sizes, net.resblock_dilation_sizes):
                self.resblocks.append(AdaINResBlock1(channels, res_kernel, dilations, style_dim))
            if i + 1 < self.num_upsamples:
                stride = math.prod(net.upsample_rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(self.n_fft + 2, channels, 2 * stride, stride, padding=(stride + 1) // 2))
                self.noise_res.append(AdaINResBlock1(channels, 7, (1, 3, 5), style_dim))
            else:
                self.noise_convs.append(nn.Conv1d(self.n_fft + 2, channels, 1))
                self.noise_res.append(AdaINResBlock1(channels, 11, (1, 3, 5), style_dim))
            channels_in = channels
        self.conv_post = nn.Conv1d(channels, self.n_fft + 2, 7, 1, padding=3)
        # The "custom" variant reproduces the official CustomSTFT, rounding-noise phases included.
        self.stft = ConvStft(self.n_fft, net.hop_length, stft_variant,
                             SOURCE_PHASE_FLOOR if stft_variant == "torch" else 0.0)

    def harmonic_source(self, f0_curve: torch.Tensor, noise: SourceNoise | None,
                        curve_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """(B, 2F) F0 in Hz -> (B, L, 1) excitation at the output sample rate."""
        f0 = f0_curve.unsqueeze(-1).repeat_interleave(self.upsample_scale, dim=1)  # (B, L, 1), nearest upsampling
        return self.m_source(f0, noise, curve_lengths)

    def spectrum_logits(self, x: torch.Tensor, style: torch.Tensor, f0_curve: torch.Tensor,
                        noise: SourceNoise | None, curve_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Generator input (B, C, 2F) -> conv_post output (B, n_fft + 2, L / hop + 1). With
        ``curve_lengths`` (B,) (each item's 2F) every stage is zero past an item's end."""
        source = self.harmonic_source(f0_curve, noise, curve_lengths).squeeze(-1)  # (B, L)
        source_lengths = None if curve_lengths is None else curve_lengths * self.upsample_scale
        source_magnitude, source_phase = self.stft.transform(source, source_lengths)
        source_spectrum = torch.cat([source_magnitude, source_phase], dim=1)  # (B, n_fft + 2, frames)
        stage_lengths = curve_lengths
        if curve_lengths is not None:
            # The centred STFT has one frame more than hops; the last stage's reflect pad meets it.
            spectrum_mask = length_mask(source_lengths // self.stft.hop_length + 1, source_spectrum.shape[-1])
            source_spectrum = source_spectrum * spectrum_mask
        mask = None
        for i in range(self.num_upsamples):
            x = F.leaky_relu(x, 0.1)
            x = self.ups[i](x)
            if i == self.num_upsamples - 1:
                x = F.pad(x, (1, 0), mode="reflect")  # one frame more, to meet the source's frame count
            if stage_lengths is not None:
                stage_lengths = stage_lengths * self.ups[i].stride[0] + (1 if i == self.num_upsamples - 1 else 0)
                mask = length_mask(stage_lengths, x.shape[-1])  # (B, 1, frames of this stage)
            x_source = self.noise_res[i](self.noise_convs[i](source_spectrum), style, mask)
            x = x + x_source
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            x = sum(block(x, style, mask) for block in blocks) / self.num_kernels
        return self.conv_post(F.leaky_relu(x, 0.01))

    def forward(self, x: torch.Tensor, style: torch.Tensor, f0_curve: torch.Tensor,
                noise: SourceNoise | None = None, curve_lengths: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.spectrum_logits(x, style, f0_curve, noise, curve_lengths)
        bins = self.n_fft // 2 + 1
        magnitude = torch.exp(logits[:, :bins])
        phase = torch.sin(logits[:, bins:])  # the official model bounds its phase output with sin
        frame_mask = None
        if curve_lengths is not None:
            samples = curve_lengths * self.upsample_scale
            frame_mask = length_mask(samples // self.stft.hop_length + 1, logits.shape[-1])
            return self.stft.inverse(magnitude, phase, frame_mask) * length_mask(samples, x.shape[-1] * self.upsample_scale)
        return self.stft.inverse(magnitude, phase)  # (B, 1, L)


class Decoder(nn.Module):
    """(asr (B, C, F), F0 (B, 2F), N (B, 2F), acoustic style (B, S)) -> audio (B, 1, L)."""

    def __init__(self, config: KokoroConfig, stft_variant: str = "torch"):
        super().__init__()
        hidden, asr_res, style_dim = config.decoder_hidden, config.decoder_asr_res, config.style_dim
        self.encode = AdainResBlk1d(config.hidden_dim + 2, hidden, style_dim)
        self.decode = nn.ModuleList([AdainResBlk1d(hidden + 2 + asr_res, hidden, style_dim) for _ in range(3)])
        self.decode.append(AdainResBlk1d(hidden + 2 + asr_res, config.istftnet.upsample_initial_channel, style_dim,
                                         upsample=True))
        self.F0_conv = nn.Conv1d(1, 1, 3, stride=2, padding=1)
        self.N_conv = nn.Conv1d(1, 1, 3, stride=2, padding=1)
        self.asr_res = nn.Sequential(nn.Conv1d(config.hidden_dim, asr_res, 1))
        self.generator = Generator(config, stft_variant)

    def generator_input(self, asr: torch.Tensor, f0_curve: torch.Tensor, energy: torch.Tensor,
                        style: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs zero past each item's end when ``frame_lengths`` (B,) is given (as predict makes them)."""
        mask = None if frame_lengths is None else length_mask(frame_lengths, asr.shape[-1])  # (B, 1, F)
        f0 = self.F0_conv(f0_curve.unsqueeze(1))  # (B, 1, F)
        energy = self.N_conv(energy.unsqueeze(1))
        asr_res = self.asr_res(asr)
        if mask is not None:
            f0, energy, asr_res = f0 * mask, energy * mask, asr_res * mask  # the convs' biases past the end
        x = self.encode(torch.cat([asr, f0, energy], dim=1), style, mask)  # (B, D, F)
        for block in self.decode:  # every block, the upsampling one included, sees the inputs again
            x = block(torch.cat([x, asr_res, f0, energy], dim=1), style, mask)
        return x  # (B, U, 2F)

    def forward(self, asr: torch.Tensor, f0_curve: torch.Tensor, energy: torch.Tensor, style: torch.Tensor,
                noise: SourceNoise | None = None, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        x = self.generator_input(asr, f0_curve, energy, style, frame_lengths)
        curve_lengths = None if frame_lengths is None else 2 * frame_lengths
        return self.generator(x, style, f0_curve, noise, curve_lengths)
