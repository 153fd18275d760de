"""The adversarial step's discriminator calls: one stacked call equals two, frozen weights change no
generator gradient and collect none."""
from __future__ import annotations

import pytest
import torch

from models.training.discriminators import (AdversarialSettings, HifiGanDiscriminator, adversarial_terms,
                                            discriminate_pair, discriminator_loss, generator_losses,
                                            generator_side_outputs)

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


def test_adversarial_terms_update_the_discriminator_and_wait_for_its_warm_up(discriminator, waveforms):
    """Each call moves the discriminator one step; the generator's terms come only after the warm-up,
    and they reach the fake's graph, not the discriminator's weights."""
    real, fake = waveforms
    fake = fake.clone().requires_grad_(True)
    settings = AdversarialSettings(discriminator_warmup_steps=1)
    optimizer = torch.optim.AdamW(discriminator.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in discriminator.parameters()]
    warming = adversarial_terms(discriminator, optimizer, settings, 0, real, fake)
    assert set(warming) == {"disc"}
    assert any(not torch.equal(b, p) for b, p in zip(before, discriminator.parameters()))
    assert fake.grad is None  # the discriminator's update saw a detached fake
    optimizer.zero_grad(set_to_none=True)
    parts = adversarial_terms(discriminator, optimizer, settings, 1, real, fake)
    assert set(parts) == {"disc", "adv", "fm"}
    optimizer.zero_grad(set_to_none=True)
    settings.generator_loss(parts).backward()
    assert fake.grad is not None and fake.grad.abs().sum() > 0
    assert all(p.grad is None for p in discriminator.parameters())


@pytest.mark.parametrize("fields", [dict(adversarial=-1.0), dict(discriminator_warmup_steps=-1)],
                         ids=["weight", "warmup"])
def test_bad_adversarial_settings_are_refused(fields):
    with pytest.raises(ValueError, match="need weights >= 0"):
        AdversarialSettings(**fields)
