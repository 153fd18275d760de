"""How a family samples, made explicit so two variants of one model compare sample for sample.

Every family shares the seed and the pace (``Sampling``). A family declares its own subclass as
``sampling_type`` in its registry entry and capabilities, and generic code builds one with
``family.sampling_type(seed=..., length_scale=..., **family_options)``:

* ``VitsSampling``: the noise scales of VITS-style models (prior and duration-predictor noise),
  and the standard-normal tensors they scale, drawn from the seed or given explicitly;
* ``AutoregressiveSampling``: top-k / top-p / temperature / repetition penalty of a
  text-to-token model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Sampling:
    """What every family's sampling shares."""

    seed: int | None = 0  # None: the global RNG (not reproducible)
    length_scale: float = 1.0  # > 1 speaks slower; an API's speed is 1 / length_scale

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The family-specific fields a config or a request may set, besides seed and pace."""
        shared = {f.name for f in fields(Sampling)}
        return tuple(f.name for f in fields(cls) if f.name not in shared and f.init and f.type in ("float", "int"))

    @classmethod
    def of(cls, sampling: "Sampling") -> "Sampling":
        """``sampling`` as this kind: kept when it already is one; the shared ``Sampling`` (seed and
        pace only) gets this kind's defaults for the rest; another kind is refused."""
        if isinstance(sampling, cls):
            return sampling
        if type(sampling) is Sampling:
            return cls(seed=sampling.seed, length_scale=sampling.length_scale)
        raise ValueError(f"this model samples with {cls.__name__}, got {type(sampling).__name__}")

    @classmethod
    def deterministic(cls, **values) -> "Sampling":
        """Sampling with every random choice off: the same text gives the same audio on any batch."""
        return cls(**values)


@dataclass(frozen=True)
class VitsSampling(Sampling):
    """Noise of VITS-style synthesis. ``draw`` gives the standard-normal tensors a model scales and
    consumes: from the seed (a CPU generator by default, identical on every device and engine;
    ``device=`` draws on that device's generator instead, identical across engines on that device),
    from explicit tensors, or from the global RNG when ``seed`` is None. Scales of 0 make
    synthesis deterministic.
    """

    noise_scale: float = 0.667  # prior noise; the VITS inference default
    noise_scale_w: float = 0.8  # duration-predictor noise; the VITS inference default
    duration_noise: torch.Tensor | None = None  # (B, 2, T_text)
    prior_noise: torch.Tensor | None = None  # (B, C_latent, T_frames_cap)
    # Frames one phoneme id may take at length_scale 1; bounds the prior noise drawn up front
    # because the frame count is only known after duration prediction.
    max_frames_per_phoneme_id: int = 16

    @classmethod
    def deterministic(cls, **values) -> "VitsSampling":
        return cls(**{"noise_scale": 0.0, "noise_scale_w": 0.0, **values})

    def draw(self, batch: int, text_length: int, latent_channels: int,
             device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(duration_noise (B, 2, T_text), prior_noise (B, C_latent, T_frames_cap)) on ``device``.

        Why a device: the prior noise is ~16 frames x 192 channels per phoneme, millions of draws
        for a batch; on a GPU engine drawing them on the host costs more than synthesis itself.
        Explicit tensors are moved to ``device`` as given.
        """
        if self.duration_noise is not None and self.prior_noise is not None:
            return self.duration_noise.to(device), self.prior_noise.to(device)
        generator = None if self.seed is None else torch.Generator(device=device).manual_seed(self.seed)
        frames_cap = int(math.ceil(text_length * self.max_frames_per_phoneme_id * max(1.0, self.length_scale)))
        duration_noise = torch.randn((batch, 2, text_length), generator=generator, device=device)
        prior_noise = torch.randn((batch, latent_channels, frames_cap), generator=generator, device=device)
        return duration_noise, prior_noise


@dataclass(frozen=True)
class AutoregressiveSampling(Sampling):
    """Decoding of a text-to-token model. The order the distribution is cut and sharpened in is the
    family's (GPT-SoVITS v2: repetition penalty, top-p, temperature, top-k, as its official decoder
    does; the order changes the draw when top_p < 1 and temperature != 1)."""

    top_k: int = 15
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35
    max_tokens: int = 1500  # a stop without EOS

    @classmethod
    def deterministic(cls, **values) -> "AutoregressiveSampling":
        return cls(**{"top_k": 1, **values})

    def __post_init__(self):
        if self.top_k < 1 or not 0 < self.top_p <= 1 or self.temperature <= 0 or self.repetition_penalty <= 0:
            raise ValueError(f"{self}: need top_k >= 1, 0 < top_p <= 1, temperature > 0, repetition_penalty > 0")
