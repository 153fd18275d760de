"""SegmentSampler (models/training/decoder_training.py): batches that depend only on (seed, step),
drawn fresh or from a pool of segments decoded once."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from models.training.decoder_training import LatentDataset, SegmentSampler

HOP = 4


def _dataset() -> LatentDataset:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.ConvTranspose1d(8, 4, HOP, HOP), nn.Tanh(), nn.Conv1d(4, 1, 3, padding=1))
    latents = [torch.randn(8, 20 + 9 * i) for i in range(5)]
    return LatentDataset(latents, teacher, {}, hop_length=HOP, sample_rate_hz=16000)


def _is_a_segment(z: torch.Tensor, dataset: LatentDataset) -> bool:
    frames = z.shape[1]
    return any(torch.equal(z, latents[:, start : start + frames])
               for latents in dataset.latents for start in range(latents.shape[1] - frames + 1))


@pytest.mark.parametrize("pool_segments", [0, 12])
def test_a_batch_is_the_teachers_audio_of_real_segments_and_repeats_by_step(pool_segments):
    dataset = _dataset()
    sampler = SegmentSampler(dataset, batch_size=3, segment_frames=16, seed=4, pool_segments=pool_segments)
    z, audio = sampler.batch(7)
    assert z.shape == (3, 8, 16) and audio.shape == (3, 16 * HOP)
    assert all(_is_a_segment(row, dataset) for row in z)
    with torch.no_grad():
        torch.testing.assert_close(audio, dataset.teacher_decoder(z)[:, 0], rtol=1e-6, atol=1e-6)
    again = SegmentSampler(dataset, batch_size=3, segment_frames=16, seed=4, pool_segments=pool_segments)
    for step in (0, 7, 123):  # a resumed run draws the batches the first one would have
        assert all(torch.equal(a, b) for a, b in zip(sampler.batch(step), again.batch(step)))
    assert not torch.equal(sampler.batch(7)[0], sampler.batch(8)[0])


def test_a_pool_draws_only_its_own_segments():
    dataset = _dataset()
    sampler = SegmentSampler(dataset, batch_size=4, segment_frames=16, seed=0, pool_segments=5)
    pool_latents, pool_audio = sampler.pool
    assert pool_latents.shape == (5, 8, 16) and pool_audio.shape == (5, 16 * HOP)
    seen = set()
    for step in range(40):
        z, audio = sampler.batch(step)
        for row, row_audio in zip(z, audio):
            index = next(i for i in range(5) if torch.equal(row, pool_latents[i]))
            assert torch.equal(row_audio, pool_audio[index])
            seen.add(index)
    assert seen == set(range(5))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="pool_segments=-1"):
        SegmentSampler(_dataset(), batch_size=2, segment_frames=16, seed=0, pool_segments=-1)
    with pytest.raises(ValueError, match="no utterance is that long"):
        SegmentSampler(_dataset(), batch_size=2, segment_frames=100, seed=0)
