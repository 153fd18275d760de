"""The HiFi-GAN's late stages run a few batch rows at a time give the whole batch's audio."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.tiny import tiny_config
from models.emotivoice.symbols import synthetic_tokenlist


@pytest.fixture(scope="module")
def vocoder() -> HifiganGenerator:
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config(len(synthetic_tokenlist()), 32), upsample_rates=(4, 2, 2),
                                 upsample_kernel_sizes=(8, 4, 4), resblock_kernel_sizes=(3, 5),
                                 resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)))
    generator = HifiganGenerator(config).eval()
    generator.remove_weight_norm()
    return generator


@pytest.mark.parametrize("rows, from_stage", [(1, 0), (2, 1), (3, 1), (2, 2), (5, 0)])
@torch.inference_mode()
def test_chunked_late_stages_equal_the_whole_batch(vocoder, rows, from_stage):
    mel = torch.randn(5, 80, 21)  # (B, n_mels, T_feats)
    frame_lengths = torch.tensor([21, 7, 15, 21, 12])
    whole = vocoder(mel, frame_lengths)
    try:
        vocoder.chunk_rows(rows, from_stage)
        chunked = vocoder(mel, frame_lengths)
    finally:
        vocoder.chunk_rows(None)
    assert chunked.shape == whole.shape == (5, 1, 21 * 16)
    assert (chunked - whole).abs().max() <= 1e-5 * whole.abs().max()
    # No padding leaks in across a chunk: a short row still equals its own single run.
    single = vocoder(mel[1:2, :, :7], frame_lengths[1:2])
    assert (chunked[1, :, :7 * 16] - single[0]).abs().max() <= 1e-5 * single.abs().max()


@torch.inference_mode()
def test_unmasked_chunks_equal_the_whole_batch(vocoder):
    mel = torch.randn(4, 80, 9)
    whole = vocoder(mel)
    try:
        chunked = vocoder.chunk_rows(3, 1)(mel)
    finally:
        vocoder.chunk_rows(None)
    assert (chunked - whole).abs().max() <= 1e-5 * whole.abs().max()


def test_bad_chunk_settings_are_refused(vocoder):
    with pytest.raises(ValueError, match="chunk_rows=0"):
        vocoder.chunk_rows(0)
    with pytest.raises(ValueError, match="chunk_from_stage=3"):
        vocoder.chunk_rows(2, 3)
    assert vocoder.row_chunk is None
