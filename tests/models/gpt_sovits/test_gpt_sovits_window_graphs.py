"""The stream windows' graph stage (models/gpt_sovits/window_graphs.py) on tiny weights: padding the
phones to a bucket and drawing noise for more frames than the prior makes change nothing.

    python -m pytest -q tests/models/gpt_sovits/test_gpt_sovits_window_graphs.py
"""
from __future__ import annotations

import math

import pytest
import torch

from models.gpt_sovits.streaming import frame_noise
from models.gpt_sovits.tiny import tiny_voice
from models.gpt_sovits.window_graphs import (
    PHONE_BUCKET,
    WindowSynthesis,
    noise_frames_bound,
    pad_phones,
)


@pytest.fixture(scope="module")
def voice_and_embedding():
    voice = tiny_voice(0)
    with torch.inference_mode():
        return voice, voice.reference_embedding(voice.prompt_of(voice.default_reference))  # ge (1, 512, 1)


@pytest.mark.parametrize(("noise_scale", "speed"), [(0.0, 1.0), (0.5, 1.0), (0.5, 1.25)])
def test_the_padded_window_stage_speaks_what_the_eager_decode_speaks(voice_and_embedding, noise_scale, speed):
    voice, ge = voice_and_embedding
    sovits = voice.sovits
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 1024, (1, 1, 25), generator=generator)
    phones = torch.randint(1, 300, (1, 21), generator=generator)
    frames_per_token = voice.hop_length // math.prod(sovits.config.upsample_rates)
    channels = sovits.config.inter_channels
    with torch.inference_mode():
        m_p, logs_p, mask = sovits.prior(codes, phones, ge, speed=speed)
        exact_noise = frame_noise(7, 4, m_p.shape[-1], channels) if noise_scale else None
        expected = sovits.synthesize_latent(m_p, logs_p, mask, ge, exact_noise, noise_scale)[1]
        padded, lengths = pad_phones(phones)
        bound = noise_frames_bound(25, frames_per_token, speed)
        noise = frame_noise(7, 4, bound, channels) if noise_scale else torch.zeros(1, channels, bound)
        actual = WindowSynthesis(sovits, speed, noise_scale)(codes, padded, lengths, ge, noise)
    assert padded.shape[1] == PHONE_BUCKET and int(lengths) == 21
    assert bound >= m_p.shape[-1]
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))
