"""The adversarial step's discriminator calls: one stacked call equals two, frozen weights change no
generator gradient and collect none."""
from __future__ import annotations

import pytest
import torch

from models.training.discriminators import (HifiGanDiscriminator, discriminate_pair, discriminator_loss,
                                            generator_losses, generator_side_outputs)

SAMPLES = 2048  # (B, T) waveforms: long enough for every period and scale's strided stack


@pytest.fixture
def discriminator() -> HifiGanDiscriminator:
    torch.manual_seed(0)
    return HifiGanDiscriminator.compact().double()


@pytest.fixture
def waveforms() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    real = 0.3 * torch.randn(3, SAMPLES, generator=generator, dtype=torch.float64)
    fake = 0.3 * torch.randn(3, SAMPLES, generator=generator, dtype=torch.float64)
    return real, fake


def _flat(outputs) -> list[torch.Tensor]:
    return [tensor for scores, maps in outputs for tensor in (scores, *maps)]


def test_stacked_call_equals_two_calls_and_their_gradients(discriminator, waveforms):
    real, fake = waveforms
    stacked = discriminate_pair(discriminator, real, fake)
    for pair, separate in zip(stacked, (discriminator(real), discriminator(fake))):
        for a, b in zip(_flat(pair), _flat(separate), strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    weights = list(discriminator.parameters())
    stacked_grads = torch.autograd.grad(discriminator_loss(*stacked), weights)
    separate_grads = torch.autograd.grad(discriminator_loss(discriminator(real), discriminator(fake)), weights)
    for a, b in zip(stacked_grads, separate_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_pair_of_different_shapes_is_refused(discriminator, waveforms):
    real, fake = waveforms
    with pytest.raises(ValueError, match=r"real \(3, 2048\) and fake \(3, 2047\) differ"):
        discriminate_pair(discriminator, real, fake[:, :-1])


def test_frozen_discriminator_gives_the_generator_the_same_gradient_and_keeps_none(discriminator, waveforms):
    real, fake = waveforms
    fake = fake.clone().requires_grad_(True)
    adversarial, matching = generator_losses(*generator_side_outputs(discriminator, real, fake))
    (frozen_grad,) = torch.autograd.grad(adversarial + 2 * matching, fake, retain_graph=True)
    assert all(p.requires_grad for p in discriminator.parameters())  # unfrozen again for its own step
    (adversarial + 2 * matching).backward()  # a recorded graph stays without the weights
    assert all(p.grad is None for p in discriminator.parameters())

    with torch.no_grad():
        real_outputs = discriminator(real)
    adversarial, matching = generator_losses(real_outputs, discriminator(fake))
    (reference_grad,) = torch.autograd.grad(adversarial + 2 * matching, fake)
    assert frozen_grad.abs().max() > 0
    torch.testing.assert_close(frozen_grad, reference_grad, rtol=1e-10, atol=1e-14)
