"""HiFi-GAN's adversarial terms for a student vocoder: multi-period and multi-scale discriminators.

Spectral losses alone leave a student's audio slightly buzzy and smeared (DNSMOS 3.28 against the
teacher's 3.94 on 12 eval sentences after 9,300 steps); a short adversarial fine-tune is the
standard cure. The teacher's audio is the "real" side, so the student learns the teacher's sound.

    discriminator = HifiGanDiscriminator()
    d_loss = discriminator_loss(*discriminate_pair(discriminator, real, fake.detach()))
    adv, fm = generator_losses(*generator_side_outputs(discriminator, real, fake))

or, in a training loop, one discriminator update and the generator's terms of that step:

    parts = adversarial_terms(discriminator, d_optimizer, settings, step, real, fake)
    loss = spectral_loss + settings.generator_loss(parts) if "adv" in parts else spectral_loss

Shapes follow HiFi-GAN (periods 2, 3, 5, 7, 11; three scales) with half its channel counts:
the student is small. ``HifiGanDiscriminator.compact()`` narrows them further (1.4 M parameters
instead of 15.7 M) so that a chunked GPU run's whole state (student, discriminator, both
optimizers) comes back from one call: 15.7 M parameters with Adam's two moments are 188 MB, over
the 64 MiB a call returns.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

SLOPE = 0.1


def _score(convs: nn.ModuleList, post: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(flattened scores, every layer's feature map) of a conv stack; the maps feed feature matching."""
    features = []
    for conv in convs:
        x = F.leaky_relu(conv(x), SLOPE)
        features.append(x)
    x = post(x)
    features.append(x)
    return x.flatten(1), features


class PeriodDiscriminator(nn.Module):
    """Folds (B, 1, T) into (B, 1, T / p, p) and convolves along time only, so each column is one phase."""

    def __init__(self, period: int, channels: tuple[int, ...] = (16, 64, 256, 512, 512)):
        super().__init__()
        self.period = period
        layers, previous = [], 1
        for i, ch in enumerate(channels):
            stride = 3 if i < len(channels) - 1 else 1
            layers.append(nn.utils.parametrizations.weight_norm(nn.Conv2d(previous, ch, (5, 1), (stride, 1), (2, 0))))
            previous = ch
        self.convs = nn.ModuleList(layers)
        self.post = nn.utils.parametrizations.weight_norm(nn.Conv2d(previous, 1, (3, 1), 1, (1, 0)))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, _, length = audio.shape
        pad = (-length) % self.period
        x = F.pad(audio, (0, pad), mode="reflect").view(batch, 1, (length + pad) // self.period, self.period)
        return _score(self.convs, self.post, x)


class ScaleDiscriminator(nn.Module):
    """Grouped 1-D convolutions over the waveform at one (average-pooled) scale.

    ``width_divisor`` divides every channel count (the groups stay, so each must still divide).
    """

    def __init__(self, width_divisor: int = 1):
        super().__init__()
        specs = [(1, 64, 15, 1, 1), (64, 64, 41, 4, 4), (64, 128, 41, 4, 16), (128, 256, 41, 4, 16),
                 (256, 512, 41, 4, 16), (512, 512, 5, 1, 1)]  # (in, out, kernel, stride, groups)
        narrow = lambda ch: ch if ch == 1 else ch // width_divisor  # noqa: E731
        self.convs = nn.ModuleList(
            nn.utils.parametrizations.weight_norm(nn.Conv1d(narrow(i), narrow(o), k, s, groups=g, padding=k // 2))
            for i, o, k, s, g in specs
        )
        self.post = nn.utils.parametrizations.weight_norm(nn.Conv1d(narrow(512), 1, 3, 1, padding=1))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return _score(self.convs, self.post, audio)


class HifiGanDiscriminator(nn.Module):
    """All sub-discriminators: (B, T) waveform -> list of (score, feature maps)."""

    def __init__(self, periods: tuple[int, ...] = (2, 3, 5, 7, 11), scales: int = 3,
                 period_channels: tuple[int, ...] = (16, 64, 256, 512, 512), scale_width_divisor: int = 1):
        super().__init__()
        self.period_discriminators = nn.ModuleList(PeriodDiscriminator(p, period_channels) for p in periods)
        self.scale_discriminators = nn.ModuleList(ScaleDiscriminator(scale_width_divisor) for _ in range(scales))

    @classmethod
    def compact(cls) -> "HifiGanDiscriminator":
        """Same periods and scales, 1.4 M parameters: period stacks (16, 64, 128, 128, 128), scales at 1/4 width."""
        return cls(period_channels=(16, 64, 128, 128, 128), scale_width_divisor=4)

    def forward(self, audio: torch.Tensor) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        x = audio.unsqueeze(1)  # (B, 1, T)
        outputs = [d(x) for d in self.period_discriminators]
        for i, d in enumerate(self.scale_discriminators):
            outputs.append(d(x if i == 0 else F.avg_pool1d(x, 4 * i, 2 * i, padding=2 * i)))
        return outputs


Outputs = list[tuple[torch.Tensor, list[torch.Tensor]]]  # per sub-discriminator: (scores, feature maps)


def _rows(outputs: Outputs, rows: slice) -> Outputs:
    return [(scores[rows], [features[rows] for features in maps]) for scores, maps in outputs]


def discriminate_pair(discriminator: HifiGanDiscriminator, real: torch.Tensor,
                      fake: torch.Tensor) -> tuple[Outputs, Outputs]:
    """(real outputs, fake outputs) from one call on the two (B, T) batches stacked.

    Every layer acts on each sample alone (weight-normed convolutions, padding, pooling, leaky ReLU:
    no batch statistics), so the outputs equal two calls'. A layer with state updated per call
    (spectral norm's power iteration) would break that. One call launches about half the kernels
    (not counted yet), and the adversarial step on the H200 is bound by the host launching them
    (docs/results/lite_gan/h200_profile_gan_step.json).
    """
    if real.shape != fake.shape:
        raise ValueError(f"discriminate_pair: real {tuple(real.shape)} and fake {tuple(fake.shape)} differ")
    outputs = discriminator(torch.cat([real, fake]))  # (2B, T) in
    rows = real.shape[0]
    return _rows(outputs, slice(None, rows)), _rows(outputs, slice(rows, None))


@contextmanager
def _frozen(module: nn.Module) -> Iterator[None]:
    flags = [parameter.requires_grad for parameter in module.parameters()]
    module.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in zip(module.parameters(), flags):
            parameter.requires_grad_(flag)


def generator_side_outputs(discriminator: HifiGanDiscriminator, real: torch.Tensor,
                           fake: torch.Tensor) -> tuple[Outputs, Outputs]:
    """(real outputs without gradient, fake outputs) for the generator's losses.

    Only the discriminator's own loss updates it, so gradients of the generator's losses with
    respect to its weights would be thrown away: the weights are frozen while these outputs are
    recorded, and the backward pass skips every weight gradient. Each weight-normed weight is
    computed once for both calls: the cache is filled in the real call, under no_grad, which is right
    only because the weights are frozen. ``fake`` keeps its graph: the generator learns through it.
    """
    with _frozen(discriminator), parametrize.cached():
        with torch.no_grad():
            real_outputs = discriminator(real)
        return real_outputs, discriminator(fake)


def discriminator_loss(real: list, fake: list) -> torch.Tensor:
    """Least-squares GAN: real scores toward 1, fake toward 0."""
    return sum(torch.mean((1 - r) ** 2) + torch.mean(f**2) for (r, _), (f, _) in zip(real, fake))


def generator_losses(real: list, fake: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(adversarial, feature matching): fake scores toward 1; L1 between feature maps (real detached)."""
    adversarial = sum(torch.mean((1 - f) ** 2) for f, _ in fake)
    matching = sum(F.l1_loss(fm, rm.detach()) for (_, r_maps), (_, f_maps) in zip(real, fake)
                   for rm, fm in zip(r_maps, f_maps))
    return adversarial, matching


@dataclass(frozen=True)
class AdversarialSettings:
    """HiFi-GAN's balance: L_adv + 2 L_feature_matching + 45 L_mel (the mel weight is the spectral loss's).

    For ``discriminator_warmup_steps`` the discriminator learns alone: a fresh discriminator's
    gradients are noise, and a student that already sounds close to the teacher only loses from
    them (a Piper run without warm-up fell from DNSMOS 3.28 to 3.15 in its first 2,000 steps).
    """

    adversarial: float = 1.0
    feature_matching: float = 2.0
    discriminator_warmup_steps: int = 1000

    def __post_init__(self):
        if min(self.adversarial, self.feature_matching) < 0 or self.discriminator_warmup_steps < 0:
            raise ValueError(f"{self}: need weights >= 0 and discriminator_warmup_steps >= 0")

    def generator_loss(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The weighted generator terms of ``adversarial_terms``' parts (only once they hold "adv")."""
        return self.adversarial * parts["adv"] + self.feature_matching * parts["fm"]


def adversarial_terms(discriminator: HifiGanDiscriminator, optimizer: torch.optim.Optimizer,
                      settings: AdversarialSettings, adversarial_step: int, real: torch.Tensor,
                      fake: torch.Tensor) -> dict[str, torch.Tensor]:
    """One discriminator update on (B, T) ``real`` against ``fake`` (detached), then, once
    ``adversarial_step`` (steps since the discriminator joined) is past the warm-up, the generator's
    terms: {"disc"[, "adv", "fm"]}. ``fake`` keeps its graph, so the caller's backward of
    ``settings.generator_loss(parts)`` reaches the generator."""
    parts = {"disc": discriminator_loss(*discriminate_pair(discriminator, real, fake.detach()))}
    optimizer.zero_grad(set_to_none=True)
    parts["disc"].backward()
    optimizer.step()
    if adversarial_step >= settings.discriminator_warmup_steps:
        parts["adv"], parts["fm"] = generator_losses(*generator_side_outputs(discriminator, real, fake))
    return parts
