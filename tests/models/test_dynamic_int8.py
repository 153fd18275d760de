"""models/dynamic_int8.py's layer: its products against float32, a row's result alone and in a
batch, its buffers' round trip, and the conversion's refusals."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from models.dynamic_int8 import INT8_MAX, DynamicInt8Linear, quantize_linears


def test_products_are_the_float_ones_within_int8_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(96, 40)
    layer = DynamicInt8Linear.from_float(linear)
    x = torch.randn(3, 7, 96)  # (batch, tokens, in)
    with torch.no_grad():
        expected, got = linear(x), layer(x)
    assert got.shape == (3, 7, 40) and got.dtype == torch.float32
    # Each of the 96 terms is off by at most half a step of each operand's scale.
    weight_step = linear.weight.abs().amax(dim=1) / INT8_MAX  # (out,)
    input_step = x.abs().amax(dim=-1, keepdim=True) / INT8_MAX  # (batch, tokens, 1)
    bound = 96 * (0.5 * input_step * linear.weight.abs().amax(dim=1) + 0.5 * weight_step * x.abs().amax(-1, True)
                  + 0.25 * input_step * weight_step)
    assert ((got - expected).abs() <= bound).all()
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()  # and small next to the outputs
    assert torch.equal(layer.dequantized_weight(), layer.weight_int8.float() * layer.weight_scale[:, None])


def test_a_row_gives_the_same_result_alone_as_in_any_batch():
    """One activation scale per row: a padded batch of large rows moves no other row's result,
    which a scale shared by the whole tensor (torch.ao's quantize_dynamic) would."""
    torch.manual_seed(1)
    layer = DynamicInt8Linear.from_float(nn.Linear(32, 16))
    row = torch.randn(1, 32)
    batch = torch.cat([row, 100 * torch.randn(5, 32), torch.zeros(1, 32)])
    with torch.no_grad():
        alone, batched = layer(row), layer(batch)
    assert torch.equal(batched[:1], alone)
    assert torch.equal(batched[6], layer.bias)  # an all-zero row: its codes are 0, the bias alone


def test_buffers_round_trip_and_no_parameters_remain():
    torch.manual_seed(2)
    layer = DynamicInt8Linear.from_float(nn.Linear(8, 4, bias=False))
    assert list(layer.parameters()) == [] and layer.bias is None
    state = layer.state_dict()
    assert state["weight_int8"].dtype == torch.int8 and state["weight_int8"].abs().max() == INT8_MAX
    copy = DynamicInt8Linear(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4), None)
    copy.load_state_dict(state)
    x = torch.randn(2, 8)
    assert torch.equal(copy(x), layer(x))


def test_quantize_linears_swaps_named_linears_and_refuses_other_modules():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))
    x = torch.randn(5, 4)
    with torch.no_grad():
        expected = model(x)
        quantize_linears(model, ["0", "2.0"])
        got = model(x)
    assert isinstance(model[0], DynamicInt8Linear) and isinstance(model[2][0], DynamicInt8Linear)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    with pytest.raises(ValueError, match="'1' is a ReLU, not an nn.Linear"):
        quantize_linears(model, ["1"])
    assert isinstance(quantize_linears(nn.Linear(3, 3), [""]), DynamicInt8Linear)


def test_input_other_than_float32_is_refused():
    layer = DynamicInt8Linear.from_float(nn.Linear(4, 2))
    with pytest.raises(TypeError, match="takes float32 input.*torch.float16"):
        layer(torch.randn(1, 4).half())
