"""The HiFi-GAN with its block convolutions' tails in cuDNN's epilogue (models/epilogue_hifigan.py,
models/cudnn_epilogue.py) computes what the HiFi-GAN module computes.

On a CPU the operator runs its PyTorch formula, so these tests check the rewrite itself: the residual
stream read back from its activation, the mask, the compiled forward and the engine. The operator's
own tests, its cuDNN graphs on a GPU among them, are tests/models/test_cudnn_epilogue.py."""
from __future__ import annotations

import pytest
import torch

from models.emotivoice.engines import BucketedEngine
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.hifigan import FINAL_LRELU_SLOPE, LRELU_SLOPE
from models.epilogue_hifigan import EpilogueHifigan
from tests.models.vocoder_cases import hifigan, vocoder_config  # noqa: F401 -- hifigan: a fixture

MASKED_LENGTHS = (12, 7, 9)  # mel frames of three rows padded to 12


@torch.no_grad()
def test_the_vocoder_equals_the_module_with_and_without_a_mask(hifigan):
    vocoder = EpilogueHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE)
    mel = torch.randn(3, 80, 12)
    lengths = torch.tensor(MASKED_LENGTHS)
    for frame_lengths in (lengths, None):
        expected = hifigan(mel, frame_lengths)
        got = vocoder(mel, frame_lengths)
        assert got.shape == expected.shape
        hop = 16
        for row, frames in enumerate(lengths.tolist() if frame_lengths is not None else [12] * 3):
            torch.testing.assert_close(got[row, :, :frames * hop], expected[row, :, :frames * hop], atol=2e-5, rtol=0)


@torch.no_grad()
def test_a_masked_row_equals_its_single_run(hifigan):
    vocoder = EpilogueHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE)
    mel = torch.randn(3, 80, 12)
    batch = vocoder(mel, torch.tensor(MASKED_LENGTHS))
    single = vocoder(mel[1:2, :, :7], None)
    torch.testing.assert_close(batch[1:2, :, :7 * 16], single, atol=2e-5, rtol=0)


@torch.no_grad()
def test_compiled_with_symbolic_sizes_it_equals_eager(hifigan):
    vocoder = EpilogueHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE)
    compiled = torch.compile(vocoder, dynamic=True)
    for frames in (12, 9):
        mel = torch.randn(2, 80, frames)
        lengths = torch.tensor([frames, frames - 3])
        torch.testing.assert_close(compiled(mel, lengths), vocoder(mel, lengths), atol=1e-5, rtol=0)


def test_the_vocoder_refuses_a_slope_it_cannot_invert(hifigan):
    with pytest.raises(ValueError, match="0 < slope < 1"):
        EpilogueHifigan(hifigan, 1.0, FINAL_LRELU_SLOPE)


@torch.no_grad()
def test_the_engine_with_epilogue_kernels_equals_the_torch_engine():
    torch.manual_seed(0)
    generator = EmotiVoiceGenerator(vocoder_config()).eval()
    ids = torch.randint(1, 40, (2, 9))
    lengths = torch.tensor([9, 6])
    speakers = torch.tensor([0, 1])
    style = torch.randn(2, 32)
    content = torch.randn(2, 32)
    outputs = {}
    for kernels in ("torch", "cudnn"):
        engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, vocoder_kernels=kernels,
                                frame_groups=2, compile_frames=True, compile_dynamic=True)
        outputs[kernels] = engine.synthesize(ids, lengths, speakers, style, content)
    audio, audio_lengths = outputs["torch"]["audio"], outputs["torch"]["audio_lengths"]
    got, got_lengths = outputs["cudnn"]["audio"], outputs["cudnn"]["audio_lengths"]
    assert torch.equal(audio_lengths, got_lengths)
    for row, samples in enumerate(audio_lengths.tolist()):
        torch.testing.assert_close(got[row, :samples], audio[row, :samples], atol=2e-5, rtol=0)


