"""models/emotivoice/hifigan.py: ResBlock1s that carry only the activated stream compute the vocoder's
audio (the residual read back through the inverse LeakyReLU), masked and unmasked, eager and compiled."""
from __future__ import annotations

import copy

import pytest
import torch

from core.fixture_check import error_of_peak
from models.emotivoice.hifigan import LRELU_SLOPE, HifiganGenerator, _leaky_relu_inverse
from models.emotivoice.tiny import tiny_config


@pytest.fixture(scope="module")
def vocoders() -> tuple[HifiganGenerator, HifiganGenerator]:
    torch.manual_seed(0)
    vocoder = HifiganGenerator(tiny_config(n_vocab=10, bert_embedding=32)).eval()
    vocoder.remove_weight_norm()
    rewritten = copy.deepcopy(vocoder)
    rewritten.residual_from_activation = True
    return vocoder, rewritten


def test_the_inverse_undoes_the_leaky_relu_on_both_signs():
    x = torch.tensor([-3.0, -1e-3, 0.0, 2e-3, 5.0], dtype=torch.float64)
    assert torch.allclose(_leaky_relu_inverse(torch.nn.functional.leaky_relu(x, LRELU_SLOPE)), x, rtol=1e-12)


def test_the_switch_reaches_every_block_and_defaults_off(vocoders):
    vocoder, rewritten = vocoders
    assert not vocoder.residual_from_activation and not any(b.residual_from_activation for b in vocoder.resblocks)
    assert rewritten.residual_from_activation and all(b.residual_from_activation for b in rewritten.resblocks)


@pytest.mark.parametrize("masked", [False, True])
def test_audio_equals_the_vocoders_including_padded_samples(vocoders, masked):
    """Padded positions differ inside a block (residual 0 there), but every convolution reads masked
    inputs, so not even the padded audio samples move."""
    vocoder, rewritten = vocoders
    mel = torch.randn(3, 80, 21, generator=torch.Generator().manual_seed(1))  # (B, n_mels, frames)
    frame_lengths = torch.tensor([21, 15, 8]) if masked else None
    with torch.no_grad():
        expected, actual = vocoder(mel, frame_lengths), rewritten(mel, frame_lengths)
    assert actual.shape == expected.shape
    assert error_of_peak(actual, expected) <= 1e-5


def test_a_block_differs_only_where_the_mask_is_zero(vocoders):
    vocoder, rewritten = vocoders
    block, block_rewritten = vocoder.resblocks[0], rewritten.resblocks[0]
    channels = block.convs1[0].in_channels
    x = torch.randn(2, channels, 40, generator=torch.Generator().manual_seed(2))  # (B, C, T)
    mask = (torch.arange(40)[None, :] < torch.tensor([[40], [25]])).unsqueeze(1).float()  # (B, 1, T)
    with torch.no_grad():
        expected, actual = block(x, mask), block_rewritten(x, mask)
    valid = mask.expand_as(expected).bool()
    assert error_of_peak(actual[valid], expected[valid]) <= 1e-5
    assert not torch.allclose(actual[~valid], expected[~valid])  # the residual there is 0, not x


def test_compiled_rewrite_equals_eager(vocoders):
    _, rewritten = vocoders
    mel, frame_lengths = torch.randn(2, 80, 12, generator=torch.Generator().manual_seed(3)), torch.tensor([12, 7])
    with torch.no_grad():
        expected = rewritten(mel, frame_lengths)
        actual = torch.compile(rewritten, dynamic=False)(mel, frame_lengths)
    assert error_of_peak(actual, expected) <= 1e-5


def test_half_precision_error_stays_at_rounding_level(vocoders):
    """In FP16 a negative residual read back through the inverse carries about twice the rounding of a
    stored one: both vocoders against FP32 stay at FP16 rounding."""
    vocoder, rewritten = vocoders
    mel = torch.randn(2, 80, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        reference = vocoder.double()(mel.double())
        errors = {name: error_of_peak(copy.deepcopy(module).half()(mel.half()).double(), reference)
                  for name, module in (("stored", vocoder), ("from_activation", rewritten))}
        vocoder.float()
    assert errors["from_activation"] <= max(4 * errors["stored"], 5e-3)
