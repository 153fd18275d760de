"""The duration flow's inverse spline undoes an independently written forward spline.

    python -m pytest -q tests/test_spline.py
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from models.piper.spline import MIN_BIN_HEIGHT, MIN_BIN_WIDTH, MIN_DERIVATIVE, inverse_rational_quadratic_spline

TAIL_BOUND = 5.0  # Piper's spline_tail_bound
NUM_BINS = 10  # Piper's spline_bins


def forward_spline(x, unnormalized_widths, unnormalized_heights, unnormalized_derivatives, tail_bound):
    """Rational-quadratic spline with linear tails, eq. 4 of Durkan et al. (2019), "Neural Spline Flows"."""

    def knots(unnormalized, min_size):
        sizes = min_size + (1 - min_size * unnormalized.shape[-1]) * torch.softmax(unnormalized, dim=-1)
        return F.pad(torch.cumsum(sizes, dim=-1), (1, 0)) * 2 * tail_bound - tail_bound  # (..., K+1)

    x_knots, y_knots = knots(unnormalized_widths, MIN_BIN_WIDTH), knots(unnormalized_heights, MIN_BIN_HEIGHT)
    inner = MIN_DERIVATIVE + F.softplus(unnormalized_derivatives)
    derivatives = F.pad(inner, (1, 1), value=1.0)  # slope 1 at both bounds joins the identity tails
    x_in = x.clamp(-tail_bound, tail_bound)
    k = torch.searchsorted(x_knots[..., 1:-1].contiguous(), x_in.unsqueeze(-1), right=True)  # (..., 1) bin index

    def at(t, shift=0):
        return t.gather(-1, k + shift)[..., 0]

    width, height = at(x_knots, 1) - at(x_knots), at(y_knots, 1) - at(y_knots)
    slope, d_left, d_right = height / width, at(derivatives), at(derivatives, 1)
    xi = (x_in - at(x_knots)) / width
    y = at(y_knots) + height * (slope * xi**2 + d_left * xi * (1 - xi)) / (
        slope + (d_left + d_right - 2 * slope) * xi * (1 - xi)
    )
    inside = x.abs() <= tail_bound
    return torch.where(inside, y, x)


# Spreads (std of the unnormalized widths, heights, derivatives): the first as measured on the
# joe voice's duration flows (after the 1/sqrt(192) scaling of widths and heights), the second
# sharply uneven bins that reach the minimum bin sizes and derivative.
MODEL_SCALE = (0.3, 1.0, 5.0)
SHARP = (3.0, 3.0, 3.0)


def random_spline_params(n_points: int, spreads: tuple[float, float, float], dtype: torch.dtype, seed: int):
    """(widths (N, K), heights (N, K), derivatives (N, K-1)): one random spline per point."""
    generator = torch.Generator().manual_seed(seed)
    shapes = ((n_points, NUM_BINS), (n_points, NUM_BINS), (n_points, NUM_BINS - 1))
    return tuple((spread * torch.randn(shape, generator=generator)).to(dtype) for spread, shape in zip(spreads, shapes))


def random_inputs(n_points: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Uniform on 1.5x the tail bound, so a third land on the identity tails; bounds and zero included."""
    generator = torch.Generator().manual_seed(seed)
    values = ((torch.rand(n_points, generator=generator) * 2 - 1) * 1.5 * TAIL_BOUND).to(dtype)
    values[:3] = torch.tensor([-TAIL_BOUND, TAIL_BOUND, 0.0], dtype=dtype)
    return values


def test_forward_spline_maps_bounds_to_bounds_and_increases():
    """Checks the reference itself: the bounds are fixed points and the map is increasing."""
    widths, heights, derivatives = random_spline_params(1, SHARP, torch.float64, seed=0)
    x = torch.linspace(-TAIL_BOUND, TAIL_BOUND, 1000, dtype=torch.float64)
    y = forward_spline(x, widths.expand(1000, -1), heights.expand(1000, -1), derivatives.expand(1000, -1), TAIL_BOUND)
    assert y[0] == pytest.approx(-TAIL_BOUND) and y[-1] == pytest.approx(TAIL_BOUND)
    assert torch.all(torch.diff(y) > 0)


@pytest.mark.parametrize("spreads", [MODEL_SCALE, SHARP], ids=["model-scale", "sharp"])
def test_inverse_undoes_forward(spreads):
    """In float64: in float32 a nearly flat bin (slope ~1e-3) leaves x ill-determined by y, so
    rounding y alone moves the recovered x by ~1e-3; that is the function, not the inverse."""
    widths, heights, derivatives = random_spline_params(20_000, spreads, torch.float64, seed=1)
    x = random_inputs(20_000, torch.float64, seed=2)
    y = forward_spline(x, widths, heights, derivatives, TAIL_BOUND)
    recovered = inverse_rational_quadratic_spline(y, widths, heights, derivatives, TAIL_BOUND)
    assert (recovered - x).abs().max() <= 1e-4


def test_float32_inverse_round_trips_in_y_at_model_scale():
    """The precision the duration predictor runs at, checked where it is well posed: in y."""
    widths, heights, derivatives = random_spline_params(20_000, MODEL_SCALE, torch.float32, seed=3)
    y = random_inputs(20_000, torch.float32, seed=4)
    x = inverse_rational_quadratic_spline(y, widths, heights, derivatives, TAIL_BOUND)
    assert (forward_spline(x, widths, heights, derivatives, TAIL_BOUND) - y).abs().max() <= 1e-4


def test_identity_outside_the_tail_bound():
    widths, heights, derivatives = random_spline_params(6, SHARP, torch.float32, seed=5)
    y = torch.tensor([-100.0, -5.5, -5.0001, 5.0001, 7.0, math.inf])
    x = inverse_rational_quadratic_spline(y, widths, heights, derivatives, TAIL_BOUND)
    assert torch.equal(x, y)
