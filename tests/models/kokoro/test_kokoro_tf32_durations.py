"""The TF32 emulation behind scripts/kokoro_tf32_durations.py: rounding to 10 mantissa bits, ties
to even, and products that see only rounded operands."""
import torch
import torch.nn.functional as F

from scripts.kokoro_tf32_durations import Tf32Products, round_to_tf32


def test_rounding_keeps_ten_mantissa_bits_with_ties_to_even():
    ulp = 2.0 ** -10  # a TF32 ulp at 1.0
    x = torch.tensor([1.0, 1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp, -(1 + 3 * ulp / 2), 1 + 0.49 * ulp, 3.14159265])
    expected = torch.tensor([1.0, 1.0, 1 + 2 * ulp, 1 + ulp, -(1 + 2 * ulp), 1.0, 3.140625])
    assert torch.equal(round_to_tf32(x), expected)
    assert torch.equal(round_to_tf32(expected), expected)  # TF32 values are fixed points


def test_products_inside_the_mode_read_rounded_operands_only():
    torch.manual_seed(0)
    x, weight = torch.randn(4, 64), torch.randn(8, 64)
    with Tf32Products():
        emulated = F.linear(x, weight)
        summed = x.sum()  # not a product: untouched
    torch.testing.assert_close(emulated, F.linear(round_to_tf32(x), round_to_tf32(weight)), rtol=0, atol=0)
    assert not torch.equal(emulated, F.linear(x, weight))
    assert torch.equal(summed, x.sum())
