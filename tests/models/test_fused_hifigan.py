"""The fused Triton HiFi-GAN (models/fused_hifigan.py) computes what the HiFi-GAN module computes.

On a CPU the kernels run under ``TRITON_INTERPRET=1``, which must be set before Triton is imported:
``test_in_the_interpreter`` runs this file again in a child process with it set. On a GPU they run
compiled (``-m gpu`` adds the FP16 and CUDA-graph checks)."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from models.conv_layout import converted_copy  # noqa: E402
from models.emotivoice.engines import BucketedEngine  # noqa: E402
from models.emotivoice.generator import EmotiVoiceGenerator  # noqa: E402
from models.emotivoice.hifigan import FINAL_LRELU_SLOPE, LRELU_SLOPE, HifiganGenerator  # noqa: E402
from models.fused_hifigan import FusedHifigan  # noqa: E402
from models.triton_conv1d import conv1d, pack_conv1d  # noqa: E402
from tests.models.vocoder_cases import hifigan, vocoder_config  # noqa: E402,F401 -- hifigan: a fixture

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
RUNS_KERNELS = INTERPRETED or torch.cuda.is_available()
needs_kernels = pytest.mark.skipif(not RUNS_KERNELS, reason="Triton kernels need a GPU or TRITON_INTERPRET=1 "
                                   "(test_in_the_interpreter sets it)")
MASKED_LENGTHS = (12, 7, 9)  # mel frames of three rows padded to 12


@needs_kernels
@torch.no_grad()
def test_fused_vocoder_equals_the_module_with_and_without_a_mask(hifigan):
    fused = FusedHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float32)
    mel = torch.randn(3, 80, 12)
    lengths = torch.tensor(MASKED_LENGTHS)
    for frame_lengths in (lengths, None):
        expected = hifigan(mel, frame_lengths)
        got = fused(mel, frame_lengths)
        assert got.shape == expected.shape == (3, 1, 12 * 16)
        # FP32 accumulation in both; the block mean rounds in another order (about 1e-7 of a 0.15 peak).
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


@needs_kernels
@torch.no_grad()
def test_a_padded_row_equals_its_single_run(hifigan):
    fused = FusedHifigan(hifigan, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float32)
    mel = torch.randn(3, 80, 12)
    batch = fused(mel, torch.tensor(MASKED_LENGTHS))
    for row, frames in enumerate(MASKED_LENGTHS):
        single = fused(mel[row:row + 1, :, :frames], torch.tensor([frames]))
        torch.testing.assert_close(batch[row, :, :frames * 16], single[0], rtol=0, atol=1e-6)


@needs_kernels
@torch.no_grad()
def test_engine_with_the_fused_vocoder_equals_the_engine_without():
    torch.manual_seed(1)
    generator = EmotiVoiceGenerator(vocoder_config()).eval()
    config = generator.config
    rows = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 13, 10])
    ids = torch.randint(2, config.n_vocab, (3, 13), generator=rows) * (torch.arange(13) < lengths[:, None])
    batch = (ids, lengths, torch.tensor([0, 1, 2]), torch.tanh(torch.randn(3, config.bert_embedding, generator=rows)),
             torch.tanh(torch.randn(3, config.bert_embedding, generator=rows)))
    engines = {kernels: BucketedEngine(generator, graphs=False, frame_dtype=torch.float32, frame_bucket=32,
                                       vocoder_kernels=kernels) for kernels in ("torch", "triton")}
    expected, got = (engines[kernels].synthesize(*batch) for kernels in ("torch", "triton"))
    assert torch.equal(got["used_durations"], expected["used_durations"])
    torch.testing.assert_close(got["audio"], expected["audio"], rtol=0, atol=2e-6)
    assert got["audio"].abs().max() > 1e-3  # not silence on both sides


@torch.no_grad()
def test_layers_the_kernels_do_not_cover_are_refused(hifigan):
    with pytest.raises(TypeError, match="Conv1d"):  # a layout-converted copy: convert after fusing, not before
        FusedHifigan(converted_copy(hifigan, "channels_last"), LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float32)
    narrow = HifiganGenerator(dataclasses.replace(vocoder_config(), upsample_initial_channel=32)).eval()
    with pytest.raises(ValueError, match="multiple of 16"):  # its last stage has 8 channels
        FusedHifigan(narrow, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float32)
    odd = HifiganGenerator(dataclasses.replace(vocoder_config(), upsample_kernel_sizes=(7, 8))).eval()
    with pytest.raises(ValueError, match="kernel 2 x stride"):
        FusedHifigan(odd, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float32)


def test_operands_that_would_be_read_out_of_bounds_are_refused_before_launch():
    packed = pack_conv1d(torch.randn(32, 16, 3), None, torch.float32)  # 16 -> 32 channels
    x = torch.randn(2, 10, 16)
    with pytest.raises(ValueError, match=r"input must be contiguous \(B, T, 16\)"):
        conv1d(x.transpose(0, 1), packed)
    with pytest.raises(ValueError, match="lengths must be"):
        conv1d(x, packed, lengths=torch.tensor([10, 9, 8]))
    with pytest.raises(ValueError, match=r"residual must be contiguous \(2, 10, 32\)"):
        conv1d(x, packed, residual=torch.randn(2, 10, 16))
    with pytest.raises(ValueError, match="accumulate must be contiguous"):
        conv1d(x, packed, accumulate=torch.randn(2, 32, 10).transpose(1, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_fp16_kernels_on_the_gpu_match_the_fp16_module_and_replay_in_a_graph(hifigan):
    module = HifiganGenerator(vocoder_config()).cuda().eval()
    module.load_state_dict(hifigan.state_dict())
    fused = FusedHifigan(module, LRELU_SLOPE, FINAL_LRELU_SLOPE, torch.float16)
    mel = torch.randn(3, 80, 40, device="cuda")
    lengths = torch.tensor([40, 17, 29], device="cuda")
    reference = module(mel, lengths)  # FP32
    got = fused(mel, lengths).float()
    snr = 10 * torch.log10(reference.pow(2).sum() / (got - reference).pow(2).sum())
    assert snr > 40, f"FP16 fused vs FP32 module: {snr:.1f} dB"
    graph = torch.cuda.CUDAGraph()
    static_mel = mel.clone()
    fused(static_mel, lengths)  # compiles every kernel outside the capture
    with torch.cuda.graph(graph):
        replayed = fused(static_mel, lengths)
    static_mel.copy_(mel.flip(0))
    graph.replay()
    torch.testing.assert_close(replayed, fused(mel.flip(0), lengths), rtol=0, atol=0)


@pytest.mark.skipif(RUNS_KERNELS, reason="the kernels already run in this process")
def test_in_the_interpreter():
    """This file's kernel tests, in a child process with TRITON_INTERPRET=1 ."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__))],
                            env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"\b5 passed", result.stdout), result.stdout[-2000:]  # all but this test and the GPU one
