"""The HiFi-GAN's late stages run a few batch rows at a time, alone and in the engine, give the whole
batch's audio."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from models.emotivoice.engine_voice import ServedEngineOptions
from models.emotivoice.engines import BucketedEngine
from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.symbols import synthetic_tokenlist
from models.emotivoice.tiny import tiny_config, tiny_voice


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


def _engine_inputs(generator, lengths, seed=0):
    config = generator.config
    rng = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths)
    ids = torch.randint(2, config.n_vocab, (len(lengths), max(lengths)), generator=rng)
    ids = ids * (torch.arange(max(lengths)) < lengths_t[:, None])
    return (ids, lengths_t, torch.randint(0, config.n_speaker, (len(lengths),), generator=rng),
            torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng)),
            torch.tanh(torch.randn(len(lengths), config.bert_embedding, generator=rng)))


@pytest.mark.parametrize("compile_dynamic", [False, True])
@torch.no_grad()
def test_engine_with_row_chunks_equals_the_whole_batch_engine(compile_dynamic):
    """The engine's frame stage with its vocoder's late stages in chunks of 2 rows, eager and compiled with
    symbolic sizes (head and tail compiled apart), gives every row the whole-batch engine's audio; the
    compiled one compiles each half once for several shapes (plus one-row specialisations), not once a
    row count."""
    from torch._dynamo.utils import counters

    generator = tiny_voice(0).generator
    whole = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8)
    chunked = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=8,
                             compile_frames=compile_dynamic, compile_dynamic=compile_dynamic,
                             vocoder_row_chunk=2, vocoder_chunk_from_stage=1)
    torch._dynamo.reset()
    counters.clear()
    for lengths in ((7, 13, 10, 4, 12), (20, 13, 9), (3, 4, 2, 6)):
        batch = _engine_inputs(generator, lengths)
        expected, out = whole.synthesize(*batch), chunked.synthesize(*batch)
        assert torch.equal(out["audio_lengths"], expected["audio_lengths"])
        torch.testing.assert_close(out["audio"], expected["audio"], rtol=0, atol=1e-6)
    if compile_dynamic:
        assert type(chunked.any_frame_stage).__name__ == "RowChunkedFrameStage"
        # head: one graph; tail: chunks of 2 rows and the 1-row remainder of an odd batch.
        assert counters["stats"]["unique_graphs"] == 3


def test_engine_refuses_bad_row_chunks():
    generator = tiny_voice(0).generator
    with pytest.raises(ValueError, match="vocoder_row_chunk=0"):
        BucketedEngine(generator, graphs=False, vocoder_row_chunk=0)
    with pytest.raises(ValueError, match="vocoder_chunk_from_stage=2: one of the vocoder's 2 stages"):
        BucketedEngine(generator, graphs=False, vocoder_row_chunk=2, vocoder_chunk_from_stage=2)
    with pytest.raises(ValueError, match="vocoder_row_chunk=-1"):
        ServedEngineOptions(vocoder_row_chunk=-1)
