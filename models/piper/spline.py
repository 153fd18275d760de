"""Inverse of a monotonic rational-quadratic spline with linear tails (Durkan et al., 2019).

The duration predictor's flow runs it backwards at inference. Written with elementwise ops,
a comparison-sum in place of ``searchsorted`` and ``gather``, so it exports to plain ONNX.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

MIN_BIN_WIDTH = 1e-3
MIN_BIN_HEIGHT = 1e-3
MIN_DERIVATIVE = 1e-3
_BIN_SEARCH_EPS = 1e-6  # keeps the right edge inside the last bin


def _knots(unnormalized: torch.Tensor, tail_bound: float, min_size: float) -> torch.Tensor:
    """Bin sizes (..., K) -> knot positions (..., K+1) spanning exactly [-tail_bound, tail_bound]."""
    num_bins = unnormalized.shape[-1]
    sizes = min_size + (1 - min_size * num_bins) * torch.softmax(unnormalized, dim=-1)
    knots = F.pad(torch.cumsum(sizes, dim=-1), (1, 0))  # (..., K+1), from 0 to 1
    knots = 2 * tail_bound * knots - tail_bound
    # Pin both ends exactly: cumulative-sum rounding must not leave a gap at the bounds.
    return torch.cat([torch.full_like(knots[..., :1], -tail_bound), knots[..., 1:-1],
                      torch.full_like(knots[..., :1], tail_bound)], dim=-1)


def inverse_rational_quadratic_spline(
    y: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float,
) -> torch.Tensor:
    """y: (...); widths/heights: (..., K); derivatives: (..., K-1). Returns x with spline(x) = y.

    Outside [-tail_bound, tail_bound] the spline is the identity (linear tails).
    """
    # Boundary derivatives of exactly 1 make the tails join the identity smoothly.
    boundary = math.log(math.expm1(1 - MIN_DERIVATIVE))
    derivatives = MIN_DERIVATIVE + F.softplus(F.pad(unnormalized_derivatives, (1, 1), value=boundary))
    x_knots = _knots(unnormalized_widths, tail_bound, MIN_BIN_WIDTH)  # (..., K+1)
    y_knots = _knots(unnormalized_heights, tail_bound, MIN_BIN_HEIGHT)

    inside = (y >= -tail_bound) & (y <= tail_bound)
    y_in = y.clamp(-tail_bound, tail_bound)
    search_knots = torch.cat([y_knots[..., :-1], y_knots[..., -1:] + _BIN_SEARCH_EPS], dim=-1)
    bin_index = ((y_in.unsqueeze(-1) >= search_knots).sum(dim=-1, keepdim=True) - 1)  # (..., 1)
    bin_index = bin_index.clamp(0, unnormalized_widths.shape[-1] - 1)

    def at_bin(t: torch.Tensor, shift: int = 0) -> torch.Tensor:
        return torch.gather(t, -1, bin_index + shift)[..., 0]

    x_left, bin_width = at_bin(x_knots), at_bin(x_knots, 1) - at_bin(x_knots)
    y_bottom, bin_height = at_bin(y_knots), at_bin(y_knots, 1) - at_bin(y_knots)
    d_left, d_right = at_bin(derivatives), at_bin(derivatives, 1)
    slope = bin_height / bin_width

    # Solve the rational-quadratic for the position within the bin: a quadratic in xi.
    offset = y_in - y_bottom
    curvature = d_left + d_right - 2 * slope
    a = offset * curvature + bin_height * (slope - d_left)
    b = bin_height * d_left - offset * curvature
    c = -slope * offset
    discriminant = (b.pow(2) - 4 * a * c).clamp_min(0)
    xi = (2 * c) / (-b - torch.sqrt(discriminant))  # numerically stable root
    return torch.where(inside, xi * bin_width + x_left, y)
