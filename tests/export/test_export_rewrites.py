"""Each export rewrite computes the same function as its reference, and exports to the ops it promises.

    python -m pytest -q tests/test_export_rewrites.py
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.graph_checks import op_histogram
from export.rewrites.adain import AdaIN1d, DecomposedAdaIN1d, swap_adain
from models.piper.rewrites.alignment import cumsum_alignment, scatter_alignment
from export.rewrites.rvq import MatMulResidualVQ, ResidualVQ
from models.piper.rewrites.spline import reference_forward_spline, reference_inverse_spline
from export.tensorrt_support import readiness_report
from models.piper.spline import inverse_rational_quadratic_spline
from models.piper.vits import sequence_mask


def export_dynamo(module: torch.nn.Module, args: tuple, path, input_names, dynamic_shapes) -> onnx.ModelProto:
    torch.onnx.export(module, args, str(path), dynamo=True, input_names=input_names, dynamic_shapes=dynamic_shapes)
    return onnx.load(str(path))


def test_cumsum_alignment_equals_scatter_alignment():
    generator = torch.Generator().manual_seed(0)
    durations = torch.randint(0, 6, (4, 13), generator=generator)  # zeros included: phonemes with no frame
    durations[1, 9:] = 0  # a padded item
    frame_lengths = durations.sum(dim=1).clamp_min(1)
    frame_mask = sequence_mask(frame_lengths, int(frame_lengths.max())).float()  # (B, T_frames)
    expected = scatter_alignment(durations, frame_mask)
    assert torch.equal(cumsum_alignment(durations.float(), frame_mask), expected)
    assert torch.equal(expected.sum(dim=1), frame_mask)  # every real frame belongs to exactly one phoneme


def test_exported_spline_matches_the_direct_reference_and_inverts_the_forward_spline():
    generator = torch.Generator().manual_seed(1)
    bins, tail_bound = 10, 5.0
    shape = (3, 50)
    widths, heights = torch.randn(*shape, bins, generator=generator), torch.randn(*shape, bins, generator=generator)
    derivatives = torch.randn(*shape, bins - 1, generator=generator)
    y = 7 * torch.rand(*shape, generator=generator) - 3.5
    y[0, :3] = torch.tensor([-6.0, 5.5, 5.0])  # both linear tails and the right edge
    ours = inverse_rational_quadratic_spline(y, widths, heights, derivatives, tail_bound)
    reference = reference_inverse_spline(y, widths, heights, derivatives, tail_bound)
    torch.testing.assert_close(ours, reference, rtol=0, atol=2e-5)
    round_trip = reference_forward_spline(ours, widths, heights, derivatives, tail_bound)
    torch.testing.assert_close(round_trip.float(), y, rtol=0, atol=5e-5)


def test_decomposed_adain_equals_instance_norm_adain_and_exports_without_instance_normalization(tmp_path):
    torch.manual_seed(2)
    reference = AdaIN1d(style_dim=6, channels=4).eval()
    with torch.no_grad():
        reference.fc.weight.mul_(3)  # large per-sample scales: a batch mix-up would show
    decomposed = swap_adain(torch.nn.Sequential(reference))[0].eval()
    assert isinstance(decomposed, DecomposedAdaIN1d) and decomposed.fc is reference.fc
    x, style = torch.randn(3, 4, 37) * 2 + 1, torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(decomposed(x, style), reference(x, style), rtol=1e-5, atol=1e-5)

    batch, frames = torch.export.Dim("batch"), torch.export.Dim("frames")
    model = export_dynamo(decomposed, (x, style), tmp_path / "adain.onnx", ["x", "style"],
                          ({0: batch, 2: frames}, {0: batch}))
    assert "InstanceNormalization" not in op_histogram(model)
    assert readiness_report(model)["ready"]
    x_other, style_other = torch.randn(5, 4, 11), torch.randn(5, 6)  # another batch and length than traced
    (output,) = ort.InferenceSession(str(tmp_path / "adain.onnx")).run(None, {"x": x_other.numpy(), "style": style_other.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(output, reference(x_other, style_other).numpy(), rtol=1e-4, atol=1e-5)


def test_matmul_rvq_equals_cdist_rvq_and_exports_to_matmul_argmin_gather(tmp_path):
    generator = torch.Generator().manual_seed(3)
    stages, codes_per_book, dim = 3, 16, 8
    codebooks = torch.randn(stages, codes_per_book, dim, generator=generator) / torch.tensor([1.0, 2.0, 4.0]).view(-1, 1, 1)
    reference = ResidualVQ(codebooks).eval()
    rewritten = MatMulResidualVQ.from_reference(reference).eval()
    x = torch.randn(2, 40, dim, generator=generator)
    with torch.no_grad():
        expected_quantized, expected_codes = reference(x)
        quantized, codes = rewritten(x)
    assert torch.equal(codes, expected_codes)
    torch.testing.assert_close(quantized, expected_quantized)

    model = export_dynamo(rewritten, (x,), tmp_path / "rvq.onnx", ["x"],
                          ({0: torch.export.Dim("batch"), 1: torch.export.Dim("frames")},))
    histogram = op_histogram(model)
    assert histogram.get("ArgMin") == stages and histogram.get("MatMul") == stages and histogram.get("Gather", 0) >= stages
    assert readiness_report(model)["ready"]
    x_other = torch.randn(3, 9, dim, generator=generator)
    onnx_quantized, onnx_codes = ort.InferenceSession(str(tmp_path / "rvq.onnx")).run(None, {"x": x_other.numpy()})
    with torch.no_grad():
        reference_quantized, reference_codes = reference(x_other)
    np.testing.assert_array_equal(onnx_codes, reference_codes.numpy())
    np.testing.assert_allclose(onnx_quantized, reference_quantized.numpy(), rtol=1e-5, atol=1e-6)
