"""models/conv_layout.py: every layout, with and without dilated convolutions folded, computes what
the 1-D module computes (FP32, CPU, 1e-5 of the peak), on single convolutions of every
hyperparameter and on the tiny vocoders of three families, and the channels-last region converts
once where per-conv conversion converts every time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from core.fixture_check import error_of_peak
from core.paths import REPO_ROOT
from models.conv_layout import CONV_LAYOUTS, LayoutConv, convert_convs, converted_copy, layout_copies
from models.emotivoice.engines import BucketedEngine
from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.tiny import tiny_config as emotivoice_tiny_config
from models.emotivoice.tiny import tiny_voice as emotivoice_tiny_voice
from models.kokoro.tiny import tiny_model as kokoro_tiny_model
from models.piper.tiny import tiny_vits

TOLERANCE = 1e-5  # of the reference's peak

CONV1D_CASES = [
    dict(in_channels=6, out_channels=8, kernel_size=5, stride=2, padding=2),
    dict(in_channels=6, out_channels=8, kernel_size=3, dilation=3, padding="same"),
    dict(in_channels=6, out_channels=4, kernel_size=4, stride=3, groups=2, bias=False),
    dict(in_channels=6, out_channels=12, kernel_size=7, padding=3, groups=6),  # depthwise, x2 channels
    dict(in_channels=6, out_channels=8, kernel_size=5, dilation=2, padding=4, padding_mode="reflect"),
    dict(in_channels=6, out_channels=8, kernel_size=4, padding="same", padding_mode="replicate"),
    dict(in_channels=6, out_channels=8, kernel_size=3, stride=2, padding=1, padding_mode="circular"),
    dict(in_channels=6, out_channels=1, kernel_size=7, padding="valid"),
    dict(in_channels=6, out_channels=8, kernel_size=3, dilation=5, padding=5),  # HiFi-GAN's resblocks: folds
    dict(in_channels=6, out_channels=4, kernel_size=5, dilation=3, padding=3, groups=2),  # folds, shorter output
    dict(in_channels=6, out_channels=8, kernel_size=3, dilation=3, padding=2),  # padding not a multiple: unfolded
]
TRANSPOSED_CASES = [
    dict(in_channels=8, out_channels=4, kernel_size=16, stride=8, padding=4),  # HiFi-GAN's upsampling
    dict(in_channels=6, out_channels=4, kernel_size=5, stride=3, padding=1, output_padding=2),
    dict(in_channels=6, out_channels=4, kernel_size=3, stride=2, padding=2, output_padding=1, dilation=2, groups=2),
    dict(in_channels=6, out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1, groups=6, bias=False),
]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert error_of_peak(actual, expected) <= TOLERANCE


def assert_layouts_match(module: nn.Module, run) -> None:
    """``run(module)`` equals ``run(converted copy)`` in every layout, dilations folded or not."""
    with torch.no_grad():
        expected = run(module)
        for layout in CONV_LAYOUTS:
            for fold_dilation in (False, True):
                assert_close(run(converted_copy(module, layout, fold_dilation)), expected)


@pytest.mark.parametrize("case", CONV1D_CASES)
def test_conv1d_equals_every_layout(case):
    torch.manual_seed(0)
    conv = nn.Conv1d(**case)
    x = torch.randn(3, case["in_channels"], 29)  # (B, C, T)
    assert_layouts_match(conv, lambda module: module(x))
    assert_layouts_match(conv, lambda module: module(x[0]))  # unbatched (C, T)


@pytest.mark.parametrize("case", TRANSPOSED_CASES)
def test_conv_transpose1d_equals_every_layout(case):
    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(**case)
    x = torch.randn(3, case["in_channels"], 17)
    assert_layouts_match(conv, lambda module: module(x))


def test_channels_last_output_keeps_channels_fastest_and_per_conv_is_contiguous():
    torch.manual_seed(0)
    conv = nn.Conv1d(6, 8, 3, padding=1)
    x = torch.randn(2, 6, 11)
    region, per_conv = convert_convs(conv, "channels_last"), convert_convs(conv, "channels_last_per_conv")
    assert region(x).stride() == (8 * 11, 1, 8)
    assert per_conv(x).is_contiguous()
    assert region.stride == (1,) and region.kernel_size == (3,)  # family code reads the 1-D attributes


@pytest.mark.parametrize("layout", ["channels_last", "channels_last_per_conv"])
def test_casting_keeps_the_channels_last_weights(layout):
    """The bench builds a variant, then casts it: a cast that dropped the NHWC weights would make
    cuDNN convert them on every call."""
    converted = convert_convs(nn.Conv1d(6, 8, 3), layout).to(torch.float64)
    assert converted.weight.dtype == torch.float64
    assert converted.weight.is_contiguous(memory_format=torch.channels_last)
    assert not converted.weight.is_contiguous()


@pytest.mark.parametrize("transposed", [False, True])
def test_weight_norm_is_folded_and_the_original_keeps_its_parametrization(transposed):
    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(6, 4, 4, 2, padding=1) if transposed else nn.Conv1d(6, 4, 5, padding=2)
    conv = weight_norm(conv)
    with torch.no_grad():
        conv.parametrizations.weight.original0.mul_(1.7)  # a magnitude unlike |v|: folding must use it
    x = torch.randn(2, 6, 13)
    with torch.no_grad():
        expected = conv(x)
    assert_layouts_match(conv, lambda module: module(x))
    assert parametrize.is_parametrized(conv, "weight")  # a converted copy must not strip the original
    with torch.no_grad():
        assert torch.equal(conv(x), expected)


def test_legacy_weight_norm_hook_is_folded_from_g_and_v():
    torch.manual_seed(0)
    with pytest.warns(FutureWarning):
        conv = nn.utils.weight_norm(nn.Conv1d(6, 4, 3, padding=1))
    with torch.no_grad():
        conv.weight_g.mul_(0.5)  # conv.weight is now stale until the next forward recomputes it
    x = torch.randn(2, 6, 10)
    with torch.no_grad():
        expected = conv(x)  # the hook recomputes the weight from g and v first
    for layout in CONV_LAYOUTS:
        with torch.no_grad():
            assert_close(converted_copy(conv, layout)(x), expected)


def emotivoice_vocoder() -> HifiganGenerator:
    torch.manual_seed(0)
    return HifiganGenerator(emotivoice_tiny_config(n_vocab=10, bert_embedding=32)).eval()  # weight norm on


def test_emotivoice_tiny_hifigan_every_layout_masked_and_unmasked():
    vocoder = emotivoice_vocoder()
    mel = torch.randn(3, 80, 21)  # (B, n_mels, frames)
    frame_lengths = torch.tensor([21, 15, 8])
    assert_layouts_match(vocoder, lambda module: module(mel))
    assert_layouts_match(vocoder, lambda module: module(mel, frame_lengths))


def test_kokoro_tiny_decoder_every_layout_masked_and_unmasked():
    model = kokoro_tiny_model()
    decoder, config = model.decoder, model.config
    generator = torch.Generator().manual_seed(0)
    frames = 8
    asr = torch.randn(2, config.hidden_dim, frames, generator=generator)  # (B, H, F)
    f0_curve = 80 + 170 * torch.rand(2, 2 * frames, generator=generator)  # (B, 2F) Hz
    energy = torch.randn(2, 2 * frames, generator=generator)
    style = torch.randn(2, config.style_dim, generator=generator) * 0.3
    frame_lengths = torch.tensor([8, 5])
    assert_layouts_match(decoder, lambda module: module(asr, f0_curve, energy, style))
    assert_layouts_match(decoder, lambda module: module(asr, f0_curve, energy, style, None, frame_lengths))


def test_piper_tiny_decoder_every_layout():
    vits = tiny_vits()
    z = torch.randn(2, vits.hp.latent_channels, 19)  # (B, C_lat, frames)
    assert_layouts_match(vits.dec, lambda module: module(z))


def test_a_family_engine_runs_a_converted_vocoder_without_changes():
    """EmotiVoice's bucketed engine deep-copies a generator without parametrizations as it is, so a
    folded generator whose vocoder was converted runs its LayoutConvs, with the same audio."""
    generator = emotivoice_tiny_voice().generator.inference_copy()
    phoneme_ids = torch.randint(2, 20, (2, 12), generator=torch.Generator().manual_seed(0))  # (B, T)
    inputs = (phoneme_ids, torch.tensor([12, 9]), torch.tensor([0, 1]), torch.randn(2, 32), torch.randn(2, 32))
    expected = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32).synthesize(*inputs)["audio"]
    convert_convs(generator.generator, "channels_last")
    engine = BucketedEngine(generator, graphs=False, frame_dtype=torch.float32)
    assert isinstance(engine.frame_model.generator.conv_pre, LayoutConv)
    assert_close(engine.synthesize(*inputs)["audio"], expected)


def test_channels_last_region_converts_once_in_hifigan():
    """Between the convolutions of HiFi-GAN there are only LeakyReLU, masks, sums and tanh, which
    keep the layout: the region copies the mel once, per-conv conversion copies in and out of every
    convolution but the last (one output channel: already contiguous)."""
    vocoder = emotivoice_vocoder()
    mel, frame_lengths = torch.randn(2, 80, 9), torch.tensor([9, 6])
    counts = {}
    for layout in CONV_LAYOUTS:
        converted = converted_copy(vocoder, layout)
        counts[layout] = layout_copies(converted, lambda: converted(mel, frame_lengths))
    calls = counts["ncw"]["conv_calls"]
    assert counts["ncw"]["input_copies"] == 0
    assert counts["channels_last"]["input_copies"] == 1
    assert counts["channels_last"]["copied_at"] == ["conv_pre"]
    assert counts["channels_last_per_conv"]["input_copies"] == calls
    assert counts["channels_last_per_conv"]["output_copies"] == calls - 1


@pytest.mark.parametrize("layout", CONV_LAYOUTS)
@pytest.mark.parametrize("samples", [30, 29, 28])  # a multiple of the dilation, and two that are not
def test_folded_dilated_conv_equals_the_dilated_conv_at_any_length(layout, samples):
    torch.manual_seed(0)
    conv = nn.Conv1d(6, 8, 3, dilation=3, padding=3)
    folded = converted_copy(conv, layout, fold_dilation=True)
    assert folded.dilation_folded and folded.weight.shape == (8, 6, 3, 1)
    x = torch.randn(2, 6, samples)
    with torch.no_grad():
        assert_close(folded(x), conv(x))


@pytest.mark.parametrize("case", [dict(in_channels=9, out_channels=7, kernel_size=3, padding=1),
                                  dict(in_channels=9, out_channels=7, kernel_size=5, dilation=3, padding=6),
                                  dict(in_channels=10, out_channels=4, kernel_size=3, padding=1, padding_mode="reflect")])
@pytest.mark.parametrize("fold_dilation", [False, True])
def test_aligned_input_channels_compute_the_same(case, fold_dilation):
    torch.manual_seed(0)
    conv = nn.Conv1d(**case)
    aligned = converted_copy(conv, "ncw", fold_dilation, align_channels=8)
    assert aligned.input_padding == -case["in_channels"] % 8 and aligned.weight.shape[1] % 8 == 0
    x = torch.randn(2, case["in_channels"], 25)
    with torch.no_grad():
        assert_close(aligned(x), conv(x))
        assert_close(aligned(x[0]), conv(x[0]))


@pytest.mark.parametrize("layout", ["ncw", "channels_last_per_conv"])
def test_trimmed_folded_output_is_contiguous(layout):
    """A length that is not a multiple of the dilation: the output is trimmed, and comes back dense
    (a caller's .view works as it does on an unfolded output)."""
    folded = convert_convs(nn.Conv1d(4, 4, 3, dilation=3, padding=3), layout, fold_dilation=True)
    assert folded(torch.randn(2, 4, 19)).is_contiguous()


def test_alignment_leaves_grouped_transposed_and_narrow_convs_and_refuses_other_layouts():
    assert convert_convs(nn.Conv1d(6, 6, 3, groups=2), "ncw", align_channels=8).input_padding == 0
    assert convert_convs(nn.Conv1d(1, 8, 3), "ncw", align_channels=8).input_padding == 0  # fewer inputs than 8
    assert convert_convs(nn.ConvTranspose1d(6, 4, 4, 2), "ncw", align_channels=8).input_padding == 0
    with pytest.raises(ValueError, match="pads NCW inputs"):
        convert_convs(nn.Conv1d(6, 4, 3), "channels_last", align_channels=8)
    with pytest.raises(ValueError, match="at least 1"):
        convert_convs(nn.Conv1d(6, 4, 3), "ncw", align_channels=0)


def test_only_foldable_convolutions_fold():
    """Undilated, strided, transposed, "same"-padded and padded-by-a-non-multiple convolutions keep
    their own computation."""
    kept = [nn.Conv1d(4, 4, 3, padding=1), nn.Conv1d(4, 4, 3, stride=2, dilation=3, padding=3),
            nn.ConvTranspose1d(4, 4, 3, dilation=3, padding=3), nn.Conv1d(4, 4, 3, dilation=3, padding="same"),
            nn.Conv1d(4, 4, 3, dilation=3, padding=4)]
    for conv in kept:
        assert not convert_convs(conv, "ncw", fold_dilation=True).dilation_folded, conv
    assert not convert_convs(nn.Conv1d(4, 4, 3, dilation=3, padding=3), "ncw").dilation_folded  # off by default


def test_folding_keeps_the_channels_last_region_in_hifigan():
    """HiFi-GAN's dilated resblock convolutions fold without leaving the layout: one input copy, as
    unfolded, and outputs with channels fastest."""
    vocoder = converted_copy(emotivoice_vocoder(), "channels_last", fold_dilation=True)
    folded = [conv for conv in vocoder.modules() if isinstance(conv, LayoutConv) and conv.dilation_folded]
    assert folded and all(conv.dilation[0] > 1 for conv in folded)
    mel = torch.randn(2, 80, 15)  # 15 frames: 60 and 240 samples at the two stages, multiples of 3 and 5
    counts = layout_copies(vocoder, lambda: vocoder(mel, torch.tensor([15, 7])))
    assert counts["input_copies"] == 1 and counts["copied_at"] == ["conv_pre"]
    assert counts["fold_pads"] == 0
    counts = layout_copies(vocoder, lambda: vocoder(mel[..., :14], torch.tensor([14, 7])))  # 56, 224: not of 3 or 5
    assert counts["fold_pads"] == len(folded)
    assert counts["input_copies"] == 1  # the trimmed outputs come back dense in the layout


def test_bad_layout_hooks_and_double_conversion_are_refused():
    conv = nn.Conv1d(2, 2, 3)
    with pytest.raises(ValueError, match="use one of"):
        convert_convs(conv, "nhwc")
    hooked = nn.Sequential(nn.Conv1d(2, 2, 3))
    hooked[0].register_forward_hook(lambda module, args, output: None)
    with pytest.raises(ValueError, match="'0' has forward hooks"):
        convert_convs(hooked, "channels_last")
    converted = convert_convs(nn.Sequential(nn.Conv1d(2, 2, 3)), "ncw")
    assert isinstance(converted[0], LayoutConv)
    with pytest.raises(ValueError, match="already a LayoutConv"):
        convert_convs(converted, "channels_last")


def test_bench_script_runs_end_to_end_on_cpu(tmp_path: Path):
    """scripts/bench_conv_layout.py --quick on one vocoder: every layout and dtype measured, FP32
    layouts equal to the unconverted module, the region's one copy at the entry."""
    out = tmp_path / "conv_layout.json"
    command = [sys.executable, "scripts/bench_conv_layout.py", "--device", "cpu", "--quick", "--families", "piper",
               "--repeats", "1", "--warmup", "1", "--seconds", "0.05", "--out", str(out)]
    subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=True,
                   capture_output=True, timeout=300)
    section = json.loads(out.read_text())["families"]["piper"]
    assert section["errors"] == {}
    runs = {(r["batch"], r["dtype"], r["layout"]): r for r in section["runs"]}
    assert set(runs) == {(b, d, layout) for b in (1, 4) for d in ("fp32", "fp16") for layout in CONV_LAYOUTS}
    assert all(runs[(b, "fp32", layout)]["snr_vs_eager_fp32_db"] >= 100 for b in (1, 4) for layout in CONV_LAYOUTS)
    assert section["layout_copies_fp32"]["channels_last"]["copied_at"] == ["conv_pre"]
    assert set(section["speedup_over_ncw"]["b4_fp16_eager"]) == {"channels_last", "channels_last_per_conv"}
