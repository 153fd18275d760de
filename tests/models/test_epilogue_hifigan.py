"""The HiFi-GAN with its block convolutions' tails in cuDNN's epilogue (models/epilogue_hifigan.py,
models/cudnn_epilogue.py) computes what the HiFi-GAN module computes.

On a CPU the operator runs its PyTorch formula, so these tests check the rewrite itself: the residual
stream read back from its activation, the mask, the operator's layout and its errors. ``-m gpu`` runs
the cuDNN graphs against the same formula."""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from models.cudnn_epilogue import (
    cached_graphs,
    channels_fastest,
    conv_lrelu,
    cudnn_frontend_available,
    fastest_plan,
    reference,
)
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


def test_the_operator_keeps_channels_fastest_and_matches_its_formula():
    torch.manual_seed(1)
    a = channels_fastest(torch.randn(2, 6, 20))
    weight, bias = channels_fastest(torch.randn(4, 6, 5) * 0.3), torch.randn(4)
    mask = (torch.arange(20)[None] < torch.tensor([20, 11])[:, None]).float()[:, None]
    residual = channels_fastest(torch.randn(2, 4, 20))
    out = conv_lrelu(a, weight, bias, mask, padding=6, dilation=3, slope=0.1, residual=residual, residual_slope=10.0)
    assert out.stride() == (20 * 4, 1, 4)
    x = F.conv1d(a, weight, bias, padding=6, dilation=3) + torch.where(residual >= 0, residual, 10 * residual)
    torch.testing.assert_close(out, F.leaky_relu(x, 0.1) * mask)
    assert (out[1, :, 11:] == 0).all()


@pytest.mark.parametrize("change, message", [
    (dict(padding=2), "keeps the length"),
    (dict(mask=torch.ones(2, 1, 19)), "do not fit together"),
    (dict(bias=torch.zeros(3)), "do not fit together"),
    (dict(residual=torch.zeros(2, 4, 19)), "is not the output's"),
    (dict(a=torch.zeros(2, 6)), "wants (B, C, T) input"),
    (dict(mask=torch.ones(2, 1, 20, dtype=torch.float16)), "in the input's dtype and device"),
    (dict(slope=10.0), "must be in [0, 1)"),
])
def test_the_operator_rejects_operands_that_do_not_fit(change, message):
    operands = dict(a=torch.zeros(2, 6, 20), weight=torch.zeros(4, 6, 5), bias=torch.zeros(4),
                    mask=torch.ones(2, 1, 20), padding=6, dilation=3, slope=0.1)
    operands.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        conv_lrelu(**operands)


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


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and cudnn_frontend_available()),
                    reason="needs a GPU and nvidia-cudnn-frontend")
@torch.no_grad()
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-3), (torch.float16, 2e-2)])
def test_cudnn_graphs_compute_the_formula_at_two_lengths_and_in_a_cuda_graph(dtype, tolerance):
    """Each call against the PyTorch formula: a dilated convolution, one with the residual, the same two at
    a second length (the plan reused by name) and a CUDA graph's replay of the residual call."""
    torch.manual_seed(2)
    device = torch.device("cuda")

    def operands(steps: int):
        a = channels_fastest(torch.randn(3, 64, steps, device=device)).to(dtype)
        mask = torch.arange(steps, device=device)[None] < torch.tensor([steps, steps - 99, 77], device=device)[:, None]
        residual = channels_fastest(torch.randn(3, 64, steps, device=device)).to(dtype)
        return a, mask.to(dtype)[:, None], residual

    weight = channels_fastest(torch.randn(64, 64, 11, device=device) * 0.05).to(dtype)
    bias = torch.randn(64, device=device).to(dtype)
    calls = (dict(dilation=5, padding=25), dict(dilation=1, padding=5, residual_slope=10.0))

    def check(got, a, mask, residual, call):
        want = reference(a, weight, bias, mask, residual, call["padding"], call["dilation"], 0.1,
                         call.get("residual_slope", 1.0))
        assert got.stride() == want.stride()
        assert ((got.float() - want.float()).abs().max() / want.float().abs().max()).item() < tolerance

    before = cached_graphs()
    for steps in (400, 1000):
        a, mask, residual = operands(steps)
        for call in calls:
            with_residual = residual if "residual_slope" in call else None
            check(conv_lrelu(a, weight, bias, mask, slope=0.1, residual=with_residual, **call), a, mask,
                  with_residual, call)
    assert cached_graphs() == before + 4
    a, mask, residual = operands(400)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        conv_lrelu(a, weight, bias, mask, slope=0.1, residual=residual, **calls[1])
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = conv_lrelu(a, weight, bias, mask, slope=0.1, residual=residual, **calls[1])
    fresh, fresh_residual = operands(400)[0], operands(400)[2]
    a.copy_(fresh)
    residual.copy_(fresh_residual)
    graph.replay()
    check(out, a, mask, residual, calls[1])


def test_the_fastest_plan_is_timed_with_slow_plans_given_up():
    """Each plan's timer is told when to give up: four times the best so far; failing plans (inf) never win."""
    measured = [3.0, 1.0, math.inf, 0.5, 2.0]
    limits = []

    def timer(index):
        def time(give_up_ms):
            limits.append(give_up_ms)
            return measured[index]
        return time

    assert fastest_plan([timer(index) for index in range(len(measured))]) == 3
    assert limits == [math.inf, 12.0, 4.0, 4.0, 2.0]
    assert fastest_plan([lambda give_up_ms: math.inf] * 3) == 0  # none runs: the heuristics' first
    assert fastest_plan([lambda give_up_ms: 1.0] * 2) == 0  # a tie: the earlier
